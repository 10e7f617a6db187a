// Scalar reference kernels: one (row, token) pair at a time, integer dot products per block and a
// float sum over blocks. Every SIMD kernel is tested against these.
#include <cmath>
#include <cstring>

#include "inference/kernels/gemm_kernels.hpp"

namespace tessera::inference::detail {

namespace {

float dot_f32(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n) noexcept {
  const auto* a = reinterpret_cast<const float*>(w);
  const auto* b = reinterpret_cast<const float*>(x);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float dot_f16(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n) noexcept {
  const auto* a = reinterpret_cast<const std::uint16_t*>(w);
  const auto* b = reinterpret_cast<const float*>(x);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) sum += fp16_to_fp32(a[i]) * b[i];
  return sum;
}

float dot_bf16(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n) noexcept {
  const auto* a = reinterpret_cast<const std::uint16_t*>(w);
  const auto* b = reinterpret_cast<const float*>(x);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) sum += bf16_to_fp32(a[i]) * b[i];
  return sum;
}

float dot_q8_0(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n) noexcept {
  const auto* a = reinterpret_cast<const block_q8_0*>(w);
  const auto* b = reinterpret_cast<const block_q8_0*>(x);
  float sum = 0.0f;
  for (std::int64_t k = 0; k < n / qk8_0; ++k) {
    int isum = 0;
    for (int i = 0; i < qk8_0; ++i) isum += a[k].qs[i] * b[k].qs[i];
    sum += fp16_to_fp32(a[k].d) * fp16_to_fp32(b[k].d) * static_cast<float>(isum);
  }
  return sum;
}

float dot_q4_0(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n) noexcept {
  const auto* a = reinterpret_cast<const block_q4_0*>(w);
  const auto* b = reinterpret_cast<const block_q8_0*>(x);
  float sum = 0.0f;
  for (std::int64_t k = 0; k < n / qk4_0; ++k) {
    int isum = 0;
    for (int i = 0; i < qk4_0 / 2; ++i) {
      isum += ((a[k].qs[i] & 0xF) - 8) * b[k].qs[i];
      isum += ((a[k].qs[i] >> 4) - 8) * b[k].qs[i + qk4_0 / 2];
    }
    sum += fp16_to_fp32(a[k].d) * fp16_to_fp32(b[k].d) * static_cast<float>(isum);
  }
  return sum;
}

float dot_q4_k(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n) noexcept {
  const auto* a = reinterpret_cast<const block_q4_k*>(w);
  const auto* b = reinterpret_cast<const block_q8_k*>(x);
  float sum = 0.0f;
  for (std::int64_t k = 0; k < n / qk_k; ++k) {
    int isum = 0;
    int msum = 0;
    for (int s = 0; s < 8; ++s) {
      std::uint8_t sc, m;
      q4_k_scale_min(s, a[k].scales, sc, m);
      const std::uint8_t* q = a[k].qs + 32 * (s / 2);
      const int shift = (s % 2) * 4;
      int dot = 0;
      for (int l = 0; l < 32; ++l) dot += ((q[l] >> shift) & 0xF) * b[k].qs[32 * s + l];
      isum += sc * dot;
      msum += m * (b[k].bsums[2 * s] + b[k].bsums[2 * s + 1]);
    }
    const float dx = b[k].d;
    sum += fp16_to_fp32(a[k].d) * dx * static_cast<float>(isum) -
           fp16_to_fp32(a[k].dmin) * dx * static_cast<float>(msum);
  }
  return sum;
}

float dot_q6_k(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n) noexcept {
  const auto* a = reinterpret_cast<const block_q6_k*>(w);
  const auto* b = reinterpret_cast<const block_q8_k*>(x);
  float sum = 0.0f;
  for (std::int64_t k = 0; k < n / qk_k; ++k) {
    int q[qk_k];
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = a[k].ql + 64 * h;
      const std::uint8_t* qh = a[k].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        q[128 * h + l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
        q[128 * h + l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
        q[128 * h + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        q[128 * h + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      }
    }
    int isum = 0;
    for (int s = 0; s < 16; ++s) {
      int dot = 0;
      for (int i = 16 * s; i < 16 * s + 16; ++i) dot += (q[i] - 32) * b[k].qs[i];
      isum += a[k].scales[s] * dot;
    }
    sum += fp16_to_fp32(a[k].d) * b[k].d * static_cast<float>(isum);
  }
  return sum;
}

template <float (*Dot)(const std::uint8_t*, const std::uint8_t*, std::int64_t)>
void gemm_pairs(const gemm_args& g) noexcept {
  for (std::int64_t t = 0; t < g.n_tokens; ++t) {
    for (std::int64_t r = 0; r < g.rows; ++r) {
      g.y[t * g.y_stride + r] = Dot(g.w + r * g.w_stride, g.x + t * g.x_stride, g.cols);
    }
  }
}

// q8_0 in panels (gemm_kernels.hpp): each row's exact integer block sum, scaled by dw * dx and
// added with one fused multiply-add per block, as every SIMD panel kernel does lane by lane, so all
// ISAs give the same bits.
void gemm_q8_0_panels(const gemm_args& g) noexcept {
  const std::int64_t nb = g.cols / qk8_0;
  const std::size_t panel = q8_0_panel_bytes(g.cols);
  for (std::int64_t t = 0; t < g.n_tokens; ++t) {
    const auto* x = reinterpret_cast<const block_q8_0_act*>(g.x + t * g.x_stride);
    for (std::int64_t r = 0; r < g.rows; ++r) {
      const std::uint8_t* p = g.w + static_cast<std::size_t>(r / panel_rows) * panel;
      const std::int64_t i = r % panel_rows;
      const auto* scales = reinterpret_cast<const std::uint16_t*>(p + nb * 512);
      float sum = 0.0f;
      for (std::int64_t b = 0; b < nb; ++b) {
        std::int32_t isum = 0;
        for (int c = 0; c < qk8_0; ++c) {
          const int level = static_cast<int>(p[b * 512 + (c / 4) * 64 + i * 4 + c % 4]) - 128;
          isum += level * x[b].qs[c];
        }
        const float scale = fp16_to_fp32(scales[b * panel_rows + i]) * x[b].d;
        sum = std::fma(static_cast<float>(isum), scale, sum);
      }
      g.y[t * g.y_stride + r] = sum;
    }
  }
}

// q4_K in panels (gemm_kernels.hpp): per super-block the exact integer sums of the scaled levels
// and of the mins (as the row kernels), then two fused multiply-adds, as the SIMD panel kernels do
// lane by lane.
void gemm_q4_k_panels(const gemm_args& g) noexcept {
  const std::int64_t nb = g.cols / qk_k;
  const std::size_t panel = panel_bytes(tensor_type::q4_k, g.cols);
  for (std::int64_t t = 0; t < g.n_tokens; ++t) {
    const auto* x = reinterpret_cast<const block_q8_k*>(g.x + t * g.x_stride);
    for (std::int64_t r = 0; r < g.rows; ++r) {
      const std::uint8_t* p = g.w + static_cast<std::size_t>(r / panel_rows) * panel;
      const std::int64_t i = r % panel_rows;
      float sum = 0.0f;
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::uint8_t* sb = p + b * q4_k_panel_block;
        std::uint8_t packed[12], sc[8], m[8];
        for (int k = 0; k < 12; ++k)
          packed[k] = sb[2048 + k * panel_rows + i];
        q4_k_unpack_scales(packed, sc, m);
        std::int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; ++s) {
          std::int32_t dot = 0;
          for (int c = 32 * s; c < 32 * s + 32; ++c) {
            const std::uint8_t byte = sb[(c / 8) * 64 + i * 4 + c % 4];
            const int level = (c % 8) >= 4 ? byte >> 4 : byte & 0xF;
            dot += level * x[b].qs[c];
          }
          isum += sc[s] * dot;
          msum += m[s] * (x[b].bsums[2 * s] + x[b].bsums[2 * s + 1]);
        }
        std::uint16_t d, dmin;
        std::memcpy(&d, sb + 2240 + 2 * i, 2);
        std::memcpy(&dmin, sb + 2272 + 2 * i, 2);
        sum = std::fma(static_cast<float>(isum), fp16_to_fp32(d) * x[b].d, sum);
        sum = std::fma(-static_cast<float>(msum), fp16_to_fp32(dmin) * x[b].d, sum);
      }
      g.y[t * g.y_stride + r] = sum;
    }
  }
}

// f16 in panels: each row's products added in column order with one fused multiply-add each, as
// the SIMD panel kernels do lane by lane.
void gemm_f16_panels(const gemm_args& g) noexcept {
  const std::size_t panel = panel_bytes(tensor_type::f16, g.cols);
  for (std::int64_t t = 0; t < g.n_tokens; ++t) {
    const auto* x = reinterpret_cast<const float*>(g.x + t * g.x_stride);
    for (std::int64_t r = 0; r < g.rows; ++r) {
      const auto* p = reinterpret_cast<const std::uint16_t*>(
          g.w + static_cast<std::size_t>(r / panel_rows) * panel);
      const std::int64_t i = r % panel_rows;
      float sum = 0.0f;
      for (std::int64_t c = 0; c < g.cols; ++c)
        sum = std::fma(fp16_to_fp32(p[c * panel_rows + i]), x[c], sum);
      g.y[t * g.y_stride + r] = sum;
    }
  }
}

}  // namespace

const kernel_table& scalar_kernels() noexcept {
  static const kernel_table table = [] {
    kernel_table k{};
    k.gemm[type_slot(tensor_type::f32)] = gemm_pairs<dot_f32>;
    k.gemm[type_slot(tensor_type::f16)] = gemm_pairs<dot_f16>;
    k.gemm[type_slot(tensor_type::bf16)] = gemm_pairs<dot_bf16>;
    k.gemm[type_slot(tensor_type::q8_0)] = gemm_pairs<dot_q8_0>;
    k.gemm[type_slot(tensor_type::q4_0)] = gemm_pairs<dot_q4_0>;
    k.gemm[type_slot(tensor_type::q4_k)] = gemm_pairs<dot_q4_k>;
    k.gemm[type_slot(tensor_type::q6_k)] = gemm_pairs<dot_q6_k>;
    k.q8_0_panels = gemm_q8_0_panels;
    k.q4_k_panels = gemm_q4_k_panels;
    k.f16_panels = gemm_f16_panels;
    return k;
  }();
  return table;
}

}  // namespace tessera::inference::detail
