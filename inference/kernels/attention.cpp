#include "inference/kernels/attention.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "inference/kernels/cpu.hpp"
#include "inference/kernels/gemm_kernels.hpp"
#include "inference/kernels/ops.hpp"
#include "inference/kernels/quant.hpp"

// GCC 12's avx512fintrin.h initialises vectors from _mm512_undefined_*() (see gemm_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tessera::inference {

namespace {

// e^x for 8 floats (Cephes expf: range reduction by ln 2 in two parts, degree-6 polynomial,
// relative error ~1e-7); inputs below -87 flush to ~0, which is what softmax needs.
__attribute__((target("avx2,fma"))) inline __m256 exp256(__m256 x) noexcept {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// In-place softmax of attention scores (n >= 1, all finite): the vector exp is what makes
// attention cheap next to the mat-muls at long contexts (std::exp is ~20 ns per score).
__attribute__((target("avx2,fma"))) void softmax_avx2(float* x, std::int64_t n) noexcept {
  std::int64_t i = 0;
  __m256 vmax = _mm256_set1_ps(-3.4e38f);
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float mx = lanes[0];
  for (int k = 1; k < 8; ++k) mx = std::max(mx, lanes[k]);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 vsum = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  _mm256_store_ps(lanes, vsum);
  double sum = 0;
  for (float l : lanes) sum += l;
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  const float inv_s = static_cast<float>(1.0 / sum);
  for (; i < n; ++i) x[i] *= inv_s;
}

// The shortest and longest of nq queries' positions: every query takes positions below the first,
// only the longer ones those up to the second.
std::pair<std::int64_t, std::int64_t> att_range(const std::int64_t* n_att, int nq) noexcept {
  std::int64_t lo = n_att[0], hi = n_att[0];
  for (int i = 1; i < nq; ++i) {
    lo = std::min(lo, n_att[i]);
    hi = std::max(hi, n_att[i]);
  }
  return {lo, hi};
}

// The weighted sum of values for a group of up to G queries: each value row is loaded and
// converted once for the group. Lane d of query i adds p[i][j] * v[j][d] for j = 0, 1, ... in order
// with one FMA each, whatever the group, the chunk or the ISA; a query past its own n_att skips
// the rest (a zero weight would still turn a -0 sum into +0).
template <int G>
__attribute__((target("avx512f,avx2,fma,f16c"))) void values_avx512(
    const float* const* p, const std::int64_t* n_att, int nq, const std::uint16_t* v,
    std::int64_t hd, std::int64_t d0, float* const* out) noexcept {
  __m512 acc[G][4];
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 4; ++k) acc[i][k] = _mm512_setzero_ps();
  const auto [lo, hi] = att_range(n_att, nq);
  for (std::int64_t j = 0; j < hi; ++j) {
    const std::uint16_t* row = v + j * hd + d0;
    // Decode reads a long context's values once, from memory: prefetched ahead (into L2) as the
    // weight streams are.
    if (d0 == 0) {
      __builtin_prefetch(row + 4096, 0, 1);
      __builtin_prefetch(row + 4096 + 32, 0, 1);
    }
    __m512 vv[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      vv[k] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * k)));
#pragma GCC unroll 8
    for (int i = 0; i < G; ++i) {
      if (i >= nq || (j >= lo && j >= n_att[i])) continue;
      const __m512 pj = _mm512_set1_ps(p[i][j]);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[i][k] = _mm512_fmadd_ps(pj, vv[k], acc[i][k]);
    }
  }
  for (int i = 0; i < nq; ++i)
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(out[i] + d0 + 16 * k, acc[i][k]);
}

template <int G>
__attribute__((target("avx2,fma,f16c"))) void values_avx2(const float* const* p,
                                                          const std::int64_t* n_att, int nq,
                                                          const std::uint16_t* v, std::int64_t hd,
                                                          std::int64_t d0, float* const* out) noexcept {
  __m256 acc[G][4];
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 4; ++k) acc[i][k] = _mm256_setzero_ps();
  const auto [lo, hi] = att_range(n_att, nq);
  for (std::int64_t j = 0; j < hi; ++j) {
    const std::uint16_t* row = v + j * hd + d0;
    __m256 vv[4];
    for (int k = 0; k < 4; ++k)
      vv[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8 * k)));
    for (int i = 0; i < G; ++i) {
      if (i >= nq || (j >= lo && j >= n_att[i])) continue;
      const __m256 pj = _mm256_set1_ps(p[i][j]);
      for (int k = 0; k < 4; ++k) acc[i][k] = _mm256_fmadd_ps(pj, vv[k], acc[i][k]);
    }
  }
  for (int i = 0; i < nq; ++i)
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out[i] + d0 + 8 * k, acc[i][k]);
}

// Lanes the SIMD chunks do not cover (head_dim not a multiple of the chunk): the same sum, one
// lane at a time (std::fma: the same rounding as the vector FMA).
void values_scalar(const float* const* p, const std::int64_t* n_att, int nq, const std::uint16_t* v,
                   std::int64_t hd, std::int64_t d0, std::int64_t d1, float* const* out) noexcept {
  for (int i = 0; i < nq; ++i) {
    for (std::int64_t d = d0; d < d1; ++d) {
      float sum = 0.0f;
      for (std::int64_t j = 0; j < n_att[i]; ++j)
        sum = std::fma(p[i][j], fp16_to_fp32(v[j * hd + d]), sum);
      out[i][d] = sum;
    }
  }
}

}  // namespace

void store_key_f16(const float* k, std::int64_t head_dim, std::uint16_t* keys,
                   std::int64_t pos) noexcept {
  std::uint16_t* panel = keys + (pos / 16) * 16 * head_dim + pos % 16;
  for (std::int64_t d = 0; d < head_dim; ++d) panel[d * 16] = fp32_to_fp16(k[d]);
}

std::size_t attention_scratch_floats(std::int64_t n_q, std::int64_t n_ctx,
                                     std::int64_t head_dim) noexcept {
  return static_cast<std::size_t>(n_q) *
         static_cast<std::size_t>(key_cache_positions(n_ctx) + head_dim);
}

void attend_f16(const attention_block& a) noexcept {
  if (a.n_q <= 0) return;
  const std::int64_t hd = a.head_dim;
  std::int64_t n_max = 0;
  for (std::int64_t i = 0; i < a.n_q; ++i) n_max = std::max(n_max, a.n_att[i]);
  const std::int64_t rows = key_cache_positions(n_max);
  float* scores = a.scratch;
  float* qbuf = a.scratch + a.n_q * rows;
  for (std::int64_t i = 0; i < a.n_q; ++i)
    std::memcpy(qbuf + i * hd, a.q[i], static_cast<std::size_t>(hd) * sizeof(float));

  // 1. Scores: every query against every key of the whole panels up to n_max (the positions past
  //    a query's own n_att are computed and not used).
  const isa level = active_isa();
  const detail::gemm_args g{reinterpret_cast<const std::uint8_t*>(a.keys),
                            static_cast<std::size_t>(hd) * sizeof(std::uint16_t),
                            rows,
                            hd,
                            reinterpret_cast<const std::uint8_t*>(qbuf),
                            static_cast<std::size_t>(hd) * sizeof(float),
                            a.n_q,
                            scores,
                            rows};
  // The f16 panel kernel is not instrumented in ASan builds: its ranges are checked here.
  detail::check_rows_addressable(a.keys, rows, g.w_stride, g.w_stride, "attention keys");
  detail::check_rows_addressable(scores, a.n_q, static_cast<std::size_t>(rows) * sizeof(float),
                                 static_cast<std::size_t>(rows) * sizeof(float), "attention scores");
  detail::kernels_for(level).f16_panels(g);

  // 2. Softmax of each query over its own positions.
  const float* p[4];
  for (std::int64_t i = 0; i < a.n_q; ++i) {
    float* s = scores + i * rows;
    const std::int64_t n = a.n_att[i];
    for (std::int64_t j = 0; j < n; ++j) s[j] *= a.scale;
    if (level != isa::scalar) {
      softmax_avx2(s, n);
    } else {
      softmax(s, n);
    }
  }

  // 3. Values, groups of queries sharing each value row's load.
  for (std::int64_t i0 = 0; i0 < a.n_q; i0 += 4) {
    const int nq = static_cast<int>(std::min<std::int64_t>(4, a.n_q - i0));
    for (int i = 0; i < nq; ++i) p[i] = scores + (i0 + i) * rows;
    const std::int64_t* n_att = a.n_att + i0;
    float* const* out = a.out + i0;
    std::int64_t d = 0;
    if (level == isa::avx512) {
      for (; d + 64 <= hd; d += 64) values_avx512<4>(p, n_att, nq, a.values, hd, d, out);
    } else if (level == isa::avx2) {
      for (; d + 32 <= hd; d += 32) {
        values_avx2<2>(p, n_att, std::min(nq, 2), a.values, hd, d, out);
        if (nq > 2) values_avx2<2>(p + 2, n_att + 2, nq - 2, a.values, hd, d, out + 2);
      }
    }
    if (d < hd) values_scalar(p, n_att, nq, a.values, hd, d, hd, out);
  }
}

}  // namespace tessera::inference
