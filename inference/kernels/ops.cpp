#include "inference/kernels/ops.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "actors/base/assert.hpp"
#include "inference/kernels/gemm_kernels.hpp"

namespace tessera::inference {

namespace {

__attribute__((target("avx2,fma,f16c"))) void attention_values_f16_avx2(
    const float* p, std::int64_t n_ctx, const std::uint16_t* v, std::int64_t v_stride,
    std::int64_t head_dim, float* out) noexcept {
  std::int64_t d = 0;
  for (; d + 32 <= head_dim; d += 32) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (std::int64_t j = 0; j < n_ctx; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const std::uint16_t* row = v + j * v_stride + d;
      for (int k = 0; k < 4; ++k) {
        const __m256 vv =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8 * k)));
        acc[k] = _mm256_fmadd_ps(pj, vv, acc[k]);
      }
    }
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + d + 8 * k, acc[k]);
  }
  for (; d < head_dim; ++d) {
    float sum = 0.0f;
    for (std::int64_t j = 0; j < n_ctx; ++j) sum += p[j] * _cvtsh_ss(v[j * v_stride + d]);
    out[d] = sum;
  }
}

}  // namespace

void rmsnorm(const float* x, const float* weight, float* y, std::int64_t n, float eps) noexcept {
  double sum = 0.0;  // double: the mean of squares of a few thousand floats, exactly enough
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const auto inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  if (weight != nullptr) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * weight[i];
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * inv;
  }
}

void rope(float* x, std::int64_t n_heads, std::int64_t head_dim, std::int64_t pos,
          float freq_base, rope_mode mode) noexcept {
  const std::int64_t half = head_dim / 2;
  // The angles are the same for every head: compute them once (double for large positions).
  constexpr std::int64_t max_pairs = 512;
  float cos_v[max_pairs], sin_v[max_pairs];
  TESSERA_ASSERT(half <= max_pairs && head_dim % 2 == 0, "rope: head_dim {} unsupported", head_dim);
  const std::int64_t pairs = half;
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double theta = static_cast<double>(pos) *
                         std::pow(static_cast<double>(freq_base),
                                  -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    cos_v[i] = static_cast<float>(std::cos(theta));
    sin_v[i] = static_cast<float>(std::sin(theta));
  }
  for (std::int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (std::int64_t i = 0; i < pairs; ++i) {
      const std::int64_t a = mode == rope_mode::normal ? 2 * i : i;
      const std::int64_t b = mode == rope_mode::normal ? 2 * i + 1 : i + half;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cos_v[i] - x1 * sin_v[i];
      v[b] = x0 * sin_v[i] + x1 * cos_v[i];
    }
  }
}

void softmax(float* x, std::int64_t n) noexcept {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  if (mx == -std::numeric_limits<float>::infinity()) {
    for (std::int64_t i = 0; i < n; ++i) x[i] = 1.0f / static_cast<float>(n);
    return;
  }
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(const float* gate, const float* up, float* out, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(const float* a, const float* b, float* out, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void attention_scores_f16(const float* q, std::int64_t n_q, std::int64_t q_stride,
                          const std::uint16_t* k, std::int64_t k_stride, std::int64_t n_ctx,
                          std::int64_t head_dim, float scale, float* scores) noexcept {
  if (n_q <= 0 || n_ctx <= 0) return;
  // The f16 kernel is not instrumented in ASan builds: its ranges are checked here.
  const auto hd = static_cast<std::size_t>(head_dim);
  const auto scores_row = static_cast<std::size_t>(n_ctx) * sizeof(float);
  detail::check_rows_addressable(k, n_ctx,
                                 static_cast<std::size_t>(k_stride) * sizeof(std::uint16_t),
                                 hd * sizeof(std::uint16_t), "attention keys");
  detail::check_rows_addressable(q, n_q, static_cast<std::size_t>(q_stride) * sizeof(float),
                                 hd * sizeof(float), "attention queries");
  detail::check_rows_addressable(scores, n_q, scores_row, scores_row, "attention scores");
  const detail::gemm_args g{reinterpret_cast<const std::uint8_t*>(k),
                            static_cast<std::size_t>(k_stride) * sizeof(std::uint16_t),
                            n_ctx,
                            head_dim,
                            reinterpret_cast<const std::uint8_t*>(q),
                            static_cast<std::size_t>(q_stride) * sizeof(float),
                            n_q,
                            scores,
                            n_ctx};
  detail::kernels_for(active_isa()).gemm[detail::type_slot(tensor_type::f16)](g);
  for (std::int64_t i = 0; i < n_q * n_ctx; ++i) scores[i] *= scale;
}

void attention_values_f16(const float* p, std::int64_t n_ctx, const std::uint16_t* v,
                          std::int64_t v_stride, std::int64_t head_dim, float* out) noexcept {
  if (active_isa() != isa::scalar) {
    attention_values_f16_avx2(p, n_ctx, v, v_stride, head_dim, out);
    return;
  }
  for (std::int64_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (std::int64_t j = 0; j < n_ctx; ++j) {
    for (std::int64_t d = 0; d < head_dim; ++d) out[d] += p[j] * fp16_to_fp32(v[j * v_stride + d]);
  }
}

}  // namespace tessera::inference
