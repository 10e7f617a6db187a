#include "inference/kernels/ops.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "actors/base/assert.hpp"
#include "inference/kernels/cpu.hpp"
#include "inference/kernels/gemm_kernels.hpp"
#include "inference/kernels/simd_exp.hpp"

namespace tessera::inference {

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

namespace {

// 8 lanes of silu(g) * u; the division is IEEE's, so only e^-g (exp256) differs from std::exp.
__attribute__((target("avx2,fma"))) inline __m256 swiglu8(__m256 g, __m256 u) noexcept {
  const __m256 e = detail::exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// The last n % 8 elements go through the same 8-lane code from a padded copy, so an element's
// value never depends on where it falls in the call (the non-fused FFN calls this over all the
// batch's tokens at once, the fused one token by token: both must give the same bits).
__attribute__((target("avx2,fma"))) void swiglu_avx2(const float* gate, const float* up,
                                                     float* out, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i == n) return;
  alignas(32) float g[8] = {}, u[8] = {};
  const std::int64_t left = n - i;
  std::copy(gate + i, gate + n, g);
  std::copy(up + i, up + n, u);
  _mm256_store_ps(g, swiglu8(_mm256_load_ps(g), _mm256_load_ps(u)));
  std::copy(g, g + left, out + i);
}

}  // namespace

// SwiGLU's e^x was ~5% of tiny Q8_0 prefill with std::exp (glibc's expf, one element at a time);
// the vector exp is the one softmax uses (bench/RESULTS.md, "AVX2").
void swiglu(const float* gate, const float* up, float* out, std::int64_t n) noexcept {
  if (active_isa() != isa::scalar) {
    swiglu_avx2(gate, up, out, n);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(const float* a, const float* b, float* out, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace tessera::inference
