#include "inference/kernels/quant.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace tessera::inference {

namespace {

struct type_info {
  tensor_type type;
  std::string_view name;
  std::int64_t block_elements;
  std::size_t block_bytes;
};

constexpr type_info type_table[] = {
    {tensor_type::f32, "f32", 1, 4},
    {tensor_type::f16, "f16", 1, 2},
    {tensor_type::q4_0, "q4_0", qk4_0, sizeof(block_q4_0)},
    {tensor_type::q8_0, "q8_0", qk8_0, sizeof(block_q8_0)},
    {tensor_type::q4_k, "q4_K", qk_k, sizeof(block_q4_k)},
    {tensor_type::q6_k, "q6_K", qk_k, sizeof(block_q6_k)},
    {tensor_type::bf16, "bf16", 1, 2},
};

const type_info* find_info(tensor_type type) noexcept {
  for (const auto& info : type_table) {
    if (info.type == type) return &info;
  }
  return nullptr;
}

int round_to_int(float x) noexcept { return static_cast<int>(std::nearbyint(x)); }

float max_abs(const float* x, int n) noexcept {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// fp16 of a positive scale, rounded up a little so that values computed against the rounded scale
// never need a quantized level past the top (ceil below then stays within the bit width).
std::uint16_t scale_to_fp16_up(float s) noexcept {
  std::uint16_t h = fp32_to_fp16(s);
  if (fp16_to_fp32(h) < s) ++h;  // positive finite fp16 values are ordered like their bits
  return h;
}

void check_blocks(std::int64_t n, std::int64_t block) noexcept {
  TESSERA_ASSERT(n >= 0 && n % block == 0, "row of {} elements is not a multiple of {}", n, block);
}

__attribute__((target("avx,f16c"))) void fp16_to_fp32_row_f16c(const std::uint16_t* x, float* y,
                                                                  std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

__attribute__((target("avx,f16c"))) void fp32_to_fp16_row_f16c(const float* x, std::uint16_t* y,
                                                                  std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

const bool cpu_has_f16c = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}();

}  // namespace

std::optional<tensor_type> tensor_type_from_ggml(std::uint32_t ggml_id) noexcept {
  for (const auto& info : type_table) {
    if (static_cast<std::uint32_t>(info.type) == ggml_id) return info.type;
  }
  return std::nullopt;
}

std::string_view to_string(tensor_type type) noexcept {
  const auto* info = find_info(type);
  return info ? info->name : std::string_view("unknown");
}

std::int64_t block_elements(tensor_type type) noexcept {
  const auto* info = find_info(type);
  return info ? info->block_elements : 0;
}

std::size_t block_bytes(tensor_type type) noexcept {
  const auto* info = find_info(type);
  return info ? info->block_bytes : 0;
}

bool is_quantized(tensor_type type) noexcept { return block_elements(type) > 1; }

result<std::size_t> row_bytes(tensor_type type, std::int64_t n) {
  const auto* info = find_info(type);
  if (!info) {
    return make_error(errc::unsupported, "tensor type id {} is not supported",
                      static_cast<std::uint32_t>(type));
  }
  if (n < 0 || n % info->block_elements != 0) {
    return make_error(errc::invalid_argument,
                      "row of {} elements of type {} is not a multiple of its block size {}", n,
                      info->name, info->block_elements);
  }
  return static_cast<std::size_t>(n / info->block_elements) * info->block_bytes;
}

std::uint16_t fp32_to_fp16(float x) noexcept {
  std::uint32_t f;
  std::memcpy(&f, &x, 4);
  const auto sign = static_cast<std::uint16_t>((f >> 16) & 0x8000u);
  const std::uint32_t a = f & 0x7fffffffu;
  if (a > 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65536 or inf
  const int e = static_cast<int>(a >> 23) - 127 + 15;
  if (e >= 1) {
    std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | ((a & 0x7fffffu) >> 13);
    const std::uint32_t rem = a & 0x1fffu;
    // A carry out of the mantissa bumps the exponent, up to inf: the right rounding.
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  if (e < -10) return sign;  // below half the smallest subnormal
  // Subnormal: count of 2^-24 units, rounded to nearest even. 0x400 becomes the smallest normal.
  const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const int shift = 14 - e;
  std::uint32_t q = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

bool have_f16c() noexcept { return cpu_has_f16c; }

void fp16_to_fp32_row(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  if (cpu_has_f16c) return fp16_to_fp32_row_f16c(x, y, n);
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void fp32_to_fp16_row(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  if (cpu_has_f16c) return fp32_to_fp16_row_f16c(x, y, n);
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void bf16_to_fp32_row(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

void fp32_to_bf16_row(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

// ---- quantizers ----------------------------------------------------------------------------------

void quantize_row_f32(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, 1);
  if (n > 0) std::memcpy(y, x, static_cast<std::size_t>(n) * 4);
}

void quantize_row_f16(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, 1);
  fp32_to_fp16_row(x, static_cast<std::uint16_t*>(y), n);
}

void quantize_row_bf16(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, 1);
  fp32_to_bf16_row(x, static_cast<std::uint16_t*>(y), n);
}

void quantize_row_q8_0(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, qk8_0);
  auto* out = static_cast<block_q8_0*>(y);
  for (std::int64_t b = 0; b < n / qk8_0; ++b, x += qk8_0) {
    const float d = max_abs(x, qk8_0) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = fp32_to_fp16(d);
    for (int i = 0; i < qk8_0; ++i) {
      out[b].qs[i] = static_cast<std::int8_t>(std::clamp(round_to_int(x[i] * id), -127, 127));
    }
  }
}

void quantize_row_q4_0(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, qk4_0);
  auto* out = static_cast<block_q4_0*>(y);
  for (std::int64_t b = 0; b < n / qk4_0; ++b, x += qk4_0) {
    // The value of largest magnitude maps to level 0 (-8 d), exactly; the other side reaches +7 d.
    float vmax = 0.0f;
    for (int i = 0; i < qk4_0; ++i) {
      if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
    }
    const float d = vmax / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = fp32_to_fp16(d);
    for (int i = 0; i < qk4_0 / 2; ++i) {
      const int lo = std::clamp(round_to_int(x[i] * id) + 8, 0, 15);
      const int hi = std::clamp(round_to_int(x[i + qk4_0 / 2] * id) + 8, 0, 15);
      out[b].qs[i] = static_cast<std::uint8_t>(lo | (hi << 4));
    }
  }
}

namespace {

// One q4_K super-block. Each sub-block s of 32 gets an offset m_s = -min(0, min x) and a step
// so that levels 0..15 cover [min, max]; both are rounded *up* onto their 6-bit grids (dmin * lm,
// d * ls), so no value needs a level past 15, and the values are then quantized against the
// scales actually stored.
void quantize_block_q4_k(const float* x, block_q4_k& out) noexcept {
  float offset[8];
  float hi[8];
  float max_offset = 0.0f;
  for (int s = 0; s < 8; ++s) {
    const float* v = x + 32 * s;
    float mn = 0.0f;
    float mx = 0.0f;
    for (int i = 0; i < 32; ++i) {
      mn = std::min(mn, v[i]);
      mx = std::max(mx, v[i]);
    }
    offset[s] = -mn;
    hi[s] = mx;
    max_offset = std::max(max_offset, offset[s]);
  }
  out.dmin = scale_to_fp16_up(max_offset / 63.0f);
  const float dmin = fp16_to_fp32(out.dmin);
  int lm[8];
  float step[8];
  float max_step = 0.0f;
  for (int s = 0; s < 8; ++s) {
    lm[s] = dmin > 0.0f ? std::min(63, static_cast<int>(std::ceil(offset[s] / dmin))) : 0;
    step[s] = (hi[s] + static_cast<float>(lm[s]) * dmin) / 15.0f;
    max_step = std::max(max_step, step[s]);
  }
  out.d = scale_to_fp16_up(max_step / 63.0f);
  const float d = fp16_to_fp32(out.d);
  int ls[8];
  for (int s = 0; s < 8; ++s) {
    ls[s] = d > 0.0f ? std::min(63, static_cast<int>(std::ceil(step[s] / d))) : 0;
  }
  std::memset(out.scales, 0, sizeof(out.scales));
  for (int s = 0; s < 8; ++s) {
    if (s < 4) {
      out.scales[s] = static_cast<std::uint8_t>(ls[s]);
      out.scales[s + 4] = static_cast<std::uint8_t>(lm[s]);
    } else {
      out.scales[s + 4] = static_cast<std::uint8_t>((ls[s] & 0xF) | ((lm[s] & 0xF) << 4));
      out.scales[s - 4] |= static_cast<std::uint8_t>((ls[s] >> 4) << 6);
      out.scales[s] |= static_cast<std::uint8_t>((lm[s] >> 4) << 6);
    }
  }
  std::uint8_t q[qk_k];
  for (int s = 0; s < 8; ++s) {
    const float eff_step = d * static_cast<float>(ls[s]);
    const float eff_offset = dmin * static_cast<float>(lm[s]);
    const float inv = eff_step > 0.0f ? 1.0f / eff_step : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float v = x[32 * s + i] + eff_offset;
      q[32 * s + i] = static_cast<std::uint8_t>(std::clamp(round_to_int(v * inv), 0, 15));
    }
  }
  for (int j = 0; j < 4; ++j) {
    for (int l = 0; l < 32; ++l) {
      out.qs[32 * j + l] = static_cast<std::uint8_t>(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
    }
  }
}

// One q6_K super-block: sub-block s of 16 gets step amax_s / 31 rounded up onto the int8 grid
// d * sc, levels -31..31 (of the available -32..31).
void quantize_block_q6_k(const float* x, block_q6_k& out) noexcept {
  float step[16];
  float max_step = 0.0f;
  for (int s = 0; s < 16; ++s) {
    step[s] = max_abs(x + 16 * s, 16) / 31.0f;
    max_step = std::max(max_step, step[s]);
  }
  out.d = scale_to_fp16_up(max_step / 127.0f);
  const float d = fp16_to_fp32(out.d);
  std::uint8_t q[qk_k];
  for (int s = 0; s < 16; ++s) {
    const int sc = d > 0.0f ? std::min(127, static_cast<int>(std::ceil(step[s] / d))) : 0;
    out.scales[s] = static_cast<std::int8_t>(sc);
    const float eff = d * static_cast<float>(sc);
    const float inv = eff > 0.0f ? 1.0f / eff : 0.0f;
    for (int i = 0; i < 16; ++i) {
      q[16 * s + i] =
          static_cast<std::uint8_t>(std::clamp(round_to_int(x[16 * s + i] * inv), -32, 31) + 32);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const std::uint8_t* qq = q + 128 * h;
    std::uint8_t* ql = out.ql + 64 * h;
    std::uint8_t* qh = out.qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<std::uint8_t>((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
      ql[l + 32] = static_cast<std::uint8_t>((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
      qh[l] = static_cast<std::uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                        ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

void quantize_row_q4_k(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, qk_k);
  auto* out = static_cast<block_q4_k*>(y);
  for (std::int64_t b = 0; b < n / qk_k; ++b) quantize_block_q4_k(x + b * qk_k, out[b]);
}

void quantize_row_q6_k(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, qk_k);
  auto* out = static_cast<block_q6_k*>(y);
  for (std::int64_t b = 0; b < n / qk_k; ++b) quantize_block_q6_k(x + b * qk_k, out[b]);
}

void quantize_row_q8_k(const float* x, void* y, std::int64_t n) noexcept {
  check_blocks(n, qk_k);
  auto* out = static_cast<block_q8_k*>(y);
  for (std::int64_t b = 0; b < n / qk_k; ++b, x += qk_k) {
    const float d = max_abs(x, qk_k) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = d;
    for (int g = 0; g < qk_k / 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        const int q = std::clamp(round_to_int(x[i] * id), -127, 127);
        out[b].qs[i] = static_cast<std::int8_t>(q);
        sum += q;
      }
      out[b].bsums[g] = static_cast<std::int16_t>(sum);
    }
  }
}

// ---- dequantizers --------------------------------------------------------------------------------

void dequantize_row_f32(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, 1);
  if (n > 0) std::memcpy(y, x, static_cast<std::size_t>(n) * 4);
}

void dequantize_row_f16(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, 1);
  fp16_to_fp32_row(static_cast<const std::uint16_t*>(x), y, n);
}

void dequantize_row_bf16(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, 1);
  bf16_to_fp32_row(static_cast<const std::uint16_t*>(x), y, n);
}

void dequantize_row_q8_0(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, qk8_0);
  const auto* in = static_cast<const block_q8_0*>(x);
  for (std::int64_t b = 0; b < n / qk8_0; ++b, y += qk8_0) {
    const float d = fp16_to_fp32(in[b].d);
    for (int i = 0; i < qk8_0; ++i) y[i] = d * static_cast<float>(in[b].qs[i]);
  }
}

void dequantize_row_q4_0(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, qk4_0);
  const auto* in = static_cast<const block_q4_0*>(x);
  for (std::int64_t b = 0; b < n / qk4_0; ++b, y += qk4_0) {
    const float d = fp16_to_fp32(in[b].d);
    for (int i = 0; i < qk4_0 / 2; ++i) {
      y[i] = d * static_cast<float>((in[b].qs[i] & 0xF) - 8);
      y[i + qk4_0 / 2] = d * static_cast<float>((in[b].qs[i] >> 4) - 8);
    }
  }
}

void dequantize_row_q4_k(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, qk_k);
  const auto* in = static_cast<const block_q4_k*>(x);
  for (std::int64_t b = 0; b < n / qk_k; ++b, y += qk_k) {
    const float d = fp16_to_fp32(in[b].d);
    const float dmin = fp16_to_fp32(in[b].dmin);
    for (int j = 0; j < 4; ++j) {
      std::uint8_t sc0, m0, sc1, m1;
      q4_k_scale_min(2 * j, in[b].scales, sc0, m0);
      q4_k_scale_min(2 * j + 1, in[b].scales, sc1, m1);
      const float d0 = d * sc0, o0 = dmin * m0, d1 = d * sc1, o1 = dmin * m1;
      const std::uint8_t* q = in[b].qs + 32 * j;
      for (int l = 0; l < 32; ++l) {
        y[64 * j + l] = d0 * static_cast<float>(q[l] & 0xF) - o0;
        y[64 * j + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - o1;
      }
    }
  }
}

void dequantize_row_q6_k(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, qk_k);
  const auto* in = static_cast<const block_q6_k*>(x);
  for (std::int64_t b = 0; b < n / qk_k; ++b, y += qk_k) {
    const float d = fp16_to_fp32(in[b].d);
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = in[b].ql + 64 * h;
      const std::uint8_t* qh = in[b].qh + 32 * h;
      const std::int8_t* sc = in[b].scales + 8 * h;
      float* yy = y + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yy[l] = d * sc[is + 0] * static_cast<float>(q1);
        yy[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        yy[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        yy[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

void dequantize_row_q8_k(const void* x, float* y, std::int64_t n) noexcept {
  check_blocks(n, qk_k);
  const auto* in = static_cast<const block_q8_k*>(x);
  for (std::int64_t b = 0; b < n / qk_k; ++b, y += qk_k) {
    for (int i = 0; i < qk_k; ++i) y[i] = in[b].d * static_cast<float>(in[b].qs[i]);
  }
}

// ---- checked entry points ------------------------------------------------------------------------

result<void> quantize_row(tensor_type type, const float* x, void* y, std::int64_t n) {
  TESSERA_TRY(row_bytes(type, n));
  if (n > 0 && (x == nullptr || y == nullptr)) {
    return make_error(errc::invalid_argument, "quantize_row({}): null buffer", to_string(type));
  }
  switch (type) {
    case tensor_type::f32: quantize_row_f32(x, y, n); break;
    case tensor_type::f16: quantize_row_f16(x, y, n); break;
    case tensor_type::bf16: quantize_row_bf16(x, y, n); break;
    case tensor_type::q8_0: quantize_row_q8_0(x, y, n); break;
    case tensor_type::q4_0: quantize_row_q4_0(x, y, n); break;
    case tensor_type::q4_k: quantize_row_q4_k(x, y, n); break;
    case tensor_type::q6_k: quantize_row_q6_k(x, y, n); break;
  }
  return ok();
}

result<void> dequantize_row(tensor_type type, const void* x, float* y, std::int64_t n) {
  TESSERA_TRY(row_bytes(type, n));
  if (n > 0 && (x == nullptr || y == nullptr)) {
    return make_error(errc::invalid_argument, "dequantize_row({}): null buffer", to_string(type));
  }
  switch (type) {
    case tensor_type::f32: dequantize_row_f32(x, y, n); break;
    case tensor_type::f16: dequantize_row_f16(x, y, n); break;
    case tensor_type::bf16: dequantize_row_bf16(x, y, n); break;
    case tensor_type::q8_0: dequantize_row_q8_0(x, y, n); break;
    case tensor_type::q4_0: dequantize_row_q4_0(x, y, n); break;
    case tensor_type::q4_k: dequantize_row_q4_k(x, y, n); break;
    case tensor_type::q6_k: dequantize_row_q6_k(x, y, n); break;
  }
  return ok();
}

}  // namespace tessera::inference
