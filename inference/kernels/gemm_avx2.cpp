// AVX2 + FMA + F16C kernels. Only called when the CPU has them (see cpu.cpp); every function that
// uses the instructions carries the target attribute itself, so the rest of the project stays
// baseline x86-64.
//
// Integer dot products use the maddubs form: vpmaddubsw multiplies unsigned by signed bytes, so a
// signed-by-signed q8_0 product is computed as |w| * (x with w's sign); products of a pair stay
// below 2 * 128 * 127 and never saturate the int16 lanes.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "inference/kernels/gemm_tiles.hpp"
#include "inference/kernels/gemm_x86.hpp"

#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace tessera::inference::detail {

namespace {

TESSERA_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

TESSERA_AVX2_INLINE float half(std::uint16_t h) { return _cvtsh_ss(h); }

TESSERA_AVX2_INLINE __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// ---- float weights (f32, f16, bf16) against f32 activations ------------------------------------

template <tensor_type W>
TESSERA_AVX2_INLINE __m256 load8(const std::uint8_t* p, std::int64_t i) {
  if constexpr (W == tensor_type::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + i / 8);
    if constexpr (W == tensor_type::f16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <tensor_type W>
TESSERA_AVX2_INLINE float load1(const std::uint8_t* p, std::int64_t i) {
  if constexpr (W == tensor_type::f32) return reinterpret_cast<const float*>(p)[i];
  if constexpr (W == tensor_type::f16) return half(reinterpret_cast<const std::uint16_t*>(p)[i]);
  return bf16_to_fp32(reinterpret_cast<const std::uint16_t*>(p)[i]);
}

template <tensor_type W, int R, int T>
struct float_tile {
  TESSERA_AVX2 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const std::uint8_t* w[R];
    const float* x[T];
    for (int r = 0; r < R; ++r) w[r] = g.w + (r0 + r) * g.w_stride;
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const float*>(g.x + (t0 + t) * g.x_stride);
    __m256 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    constexpr std::int64_t elem_bytes = W == tensor_type::f32 ? 4 : 2;
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, R);
    std::int64_t i = 0;
    for (; i + 8 <= g.cols; i += 8) {
      __m256 xv[T];
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x[t] + i);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        if constexpr (T == 1) {
          if (i % (64 / elem_bytes) == 0) prefetch_ahead(w[r] + i * elem_bytes, ahead);
        }
        const __m256 wv = load8<W>(w[r], i);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) {
        float tail = 0.0f;
        for (std::int64_t j = i; j < g.cols; ++j) tail += load1<W>(w[r], j) * x[t][j];
        g.y[(t0 + t) * g.y_stride + r0 + r] = hsum(acc[r][t]) + tail;
      }
    }
  }
};

template <int R, int T>
using f32_tile = float_tile<tensor_type::f32, R, T>;
template <int R, int T>
using f16_tile = float_tile<tensor_type::f16, R, T>;
template <int R, int T>
using bf16_tile = float_tile<tensor_type::bf16, R, T>;

// ---- q4_0 weights against q8_0 activations (q8_0 weights: gemm_q8_0_rows below) ------------

template <int R, int T>
struct q4_0_tile {
  TESSERA_AVX2 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const block_q4_0* w[R];
    const block_q8_0* x[T];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const block_q4_0*>(g.w + (r0 + r) * g.w_stride);
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const block_q8_0*>(g.x + (t0 + t) * g.x_stride);
    __m256 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i eights = _mm256_set1_epi8(8);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const std::int64_t nb = g.cols / qk4_0;
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, R);
    for (std::int64_t b = 0; b < nb; ++b) {
      __m256i xq[T];
      __m256i x8[T];  // 8 * x summed in pairs: the "- 8" of the weights, taken off once per block
      float dx[T];
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        xq[t] = load256(x[t][b].qs);
        x8[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(eights, xq[t]), ones);
        dx[t] = half(x[t][b].d);
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        if constexpr (T == 1) prefetch_ahead(w[r] + b, ahead);  // 18-byte steps: every line
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r][b].qs));
        const __m256i wq = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
        const float dw = half(w[r][b].d);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          const __m256i p = _mm256_sub_epi32(
              _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq[t]), ones), x8[t]);
          acc[r][t] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx[t]), acc[r][t]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.y_stride + r0 + r] = hsum(acc[r][t]);
    }
  }
};

// ---- K-quants against q8_K activations (one weight row, up to 4 tokens) ------------------------

template <int R, int T>
struct q4_k_tile {
  static_assert(R == 1);
  TESSERA_AVX2 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const auto* w = reinterpret_cast<const block_q4_k*>(g.w + r0 * g.w_stride);
    const block_q8_k* x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const block_q8_k*>(g.x + (t0 + t) * g.x_stride);
    __m256 acc[T];
    float mins[T];
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm256_setzero_ps();
      mins[t] = 0.0f;
    }
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, 1);
    for (std::int64_t b = 0; b < g.cols / qk_k; ++b) {
      if constexpr (T == 1) prefetch_span_ahead(w + b, sizeof(block_q4_k), ahead);
      std::uint8_t sc[8], m[8];
      q4_k_unpack_scales(w[b].scales, sc, m);
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        const __m256i q = load256(w[b].qs + 32 * j);
        const __m256i lo = _mm256_and_si256(q, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        const __m256i sc_lo = _mm256_set1_epi16(sc[2 * j]);
        const __m256i sc_hi = _mm256_set1_epi16(sc[2 * j + 1]);
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          const __m256i pl = _mm256_madd_epi16(
              _mm256_maddubs_epi16(lo, load256(x[t][b].qs + 64 * j)), sc_lo);
          const __m256i ph = _mm256_madd_epi16(
              _mm256_maddubs_epi16(hi, load256(x[t][b].qs + 64 * j + 32)), sc_hi);
          isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(pl, ph));
        }
      }
      const float d = half(w[b].d);
      const float dmin = half(w[b].dmin);
      for (int t = 0; t < T; ++t) {
        int msum = 0;
        for (int s = 0; s < 8; ++s) msum += m[s] * (x[t][b].bsums[2 * s] + x[t][b].bsums[2 * s + 1]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * x[t][b].d), acc[t]);
        mins[t] += dmin * x[t][b].d * static_cast<float>(msum);
      }
    }
    for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.y_stride + r0] = hsum(acc[t]) - mins[t];
  }
};

template <int R, int T>
struct q6_k_tile {
  static_assert(R == 1);
  TESSERA_AVX2 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const auto* w = reinterpret_cast<const block_q6_k*>(g.w + r0 * g.w_stride);
    const block_q8_k* x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const block_q8_k*>(g.x + (t0 + t) * g.x_stride);
    __m256 acc[T];
    float offs[T];
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm256_setzero_ps();
      offs[t] = 0.0f;
    }
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i low2 = _mm256_set1_epi8(0x03);
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, 1);
    for (std::int64_t b = 0; b < g.cols / qk_k; ++b) {
      if constexpr (T == 1) prefetch_span_ahead(w + b, sizeof(block_q6_k), ahead);
      const std::int8_t* sc = w[b].scales;
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = load256(w[b].ql + 64 * h);
        const __m256i ql1 = load256(w[b].ql + 64 * h + 32);
        const __m256i qh = load256(w[b].qh + 32 * h);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                               _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4));
        q[1] = _mm256_or_si256(
            _mm256_and_si256(ql1, low4),
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4));
        q[2] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4));
        q[3] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4));
        for (int k = 0; k < 4; ++k) {
          const int s = 8 * h + 2 * k;
          const __m256i scv =
              _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) {
            const __m256i xv = load256(x[t][b].qs + 128 * h + 32 * k);
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], xv), scv));
          }
        }
      }
      const float d = half(w[b].d);
      for (int t = 0; t < T; ++t) {
        int corr = 0;  // the "- 32" of the 6-bit levels, via the activation block sums
        for (int s = 0; s < 16; ++s) corr += sc[s] * x[t][b].bsums[s];
        const float dd = d * x[t][b].d;
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(dd), acc[t]);
        offs[t] += dd * static_cast<float>(32 * corr);
      }
    }
    for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.y_stride + r0] = hsum(acc[t]) - offs[t];
  }
};

}  // namespace

// ---- activation quantizer ------------------------------------------------------------------------

TESSERA_AVX2 void quantize_row_q8_0_avx2(const float* x, void* y, std::int64_t n) noexcept {
  auto* out = static_cast<block_q8_0*>(y);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i lim = _mm256_set1_epi32(127);
  const __m256i neg_lim = _mm256_set1_epi32(-127);
  for (std::int64_t b = 0; b < n / qk8_0; ++b, x += qk8_0) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    // Same float operations as the scalar quantize_row_q8_0, so the same levels and scale.
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = fp32_to_fp16(d);
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 s = _mm256_round_ps(_mm256_mul_ps(v[k], idv),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q[k] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(s), lim), neg_lim);
    }
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                         _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs),
                        _mm256_permutevar8x32_epi32(p, order));
  }
}

namespace {

// ---- q8_0 in panels (layout in gemm_kernels.hpp) ---------------------------------------------
// The AVX-512 kernel's arithmetic without VNNI: the levels are multiplied in the maddubs form
// above and widened to int32 lanes, each the row's exact block sum. The same integers,
// conversions, multiplies and FMAs per lane as the AVX-512 and scalar kernels: the same bits.
// A panel is read half by half: rows 0-7 over all blocks, then rows 8-15 (the second pass finds
// the panel, 544 bytes a block, 48 KiB for 2816 columns, in L2). A token then needs 2 registers
// (its float sum and its block's int32 sums), and 4 tokens share each weight load and its |w|;
// both halves at once (3 tokens) spilled a third of the sums to the stack and ran ~1.4x slower.
// Flipped: the levels are stored as w + 128 (weights and q8_0 keys in panels, turned back by an
// xor); a scratch panel packed from rows (pack_rows16 below) holds w itself.
template <int T, bool Flipped>
struct q8_0_half_tile {
  TESSERA_AVX2 static void run(const gemm_args& g, std::int64_t p, std::int64_t t0) noexcept {
    const std::int64_t nb = g.cols / qk8_0;
    const std::uint8_t* q = g.w + static_cast<std::size_t>(p) * q8_0_panel_bytes(g.cols);
    const auto* scales = reinterpret_cast<const std::uint16_t*>(q + nb * 512);
    const block_q8_0_act* x[T];
    for (int t = 0; t < T; ++t)
      x[t] = reinterpret_cast<const block_q8_0_act*>(g.x + (t0 + t) * g.x_stride);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; ++h) {
      __m256 acc[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_setzero_ps();
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::uint8_t* qb = q + b * 512 + 32 * h;
        __m256i sum[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int k = 0; k < 8; ++k) {
          __m256i w = load256(qb + 64 * k);
          if constexpr (Flipped) w = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
          const __m256i a = _mm256_sign_epi8(w, w);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            std::int32_t four;
            std::memcpy(&four, x[t][b].qs + 4 * k, sizeof(four));
            sum[t] = _mm256_add_epi32(
                sum[t], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(a, _mm256_sign_epi8(_mm256_set1_epi32(four), w)),
                            ones));
          }
        }
        const __m256 d = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + b * panel_rows + 8 * h)));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]),
                                   _mm256_mul_ps(d, _mm256_set1_ps(x[t][b].d)), acc[t]);
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        _mm256_storeu_ps(g.y + (t0 + t) * g.y_stride + p * panel_rows + 8 * h, acc[t]);
    }
  }
};

constexpr int q8_0_half_tokens = 4;

template <bool Flipped>
void q8_0_half_tiles(const gemm_args& g) noexcept {
  static constexpr tile_fn tiles[q8_0_half_tokens] = {
      &q8_0_half_tile<1, Flipped>::run, &q8_0_half_tile<2, Flipped>::run,
      &q8_0_half_tile<3, Flipped>::run, &q8_0_half_tile<4, Flipped>::run};
  for (std::int64_t p = 0; p < g.rows / panel_rows; ++p) {
    for (std::int64_t t0 = 0; t0 < g.n_tokens; t0 += q8_0_half_tokens) {
      const auto nt = static_cast<int>(std::min<std::int64_t>(q8_0_half_tokens, g.n_tokens - t0));
      tiles[nt - 1](g, p, t0);
    }
  }
}

void gemm_q8_0_panels(const gemm_args& g) noexcept { q8_0_half_tiles<true>(g); }

// ---- q4_K in panels ---------------------------------------------------------------------------
// The AVX-512 kernel's integers, 8 rows (one ymm half of the panel) at a time: vpmaddubsw of the
// levels (0..15) and the activations sums a sub-block into int16 lanes without overflow (16
// products of at most 15 * 127 per lane: 30,480; the activations are clamped to +-127), and one
// vpmaddwd against the row's scale duplicated in both int16 halves of its lane both widens the
// pairs and applies the scale (the same integer as widening, then vpmulld); the mins by vpmaddwd of
// (m, m) against the activation's bsums pairs. Same sums, same float operations, so the same
// bits. Half by half (the whole row range of rows 0-7, then 8-15) so a token needs only 3
// registers and a tile takes 4 tokens; the second half finds the panel in L1/L2.

// 8 bytes widened to int32 lanes, each value in both int16 halves of its lane.
TESSERA_AVX2_INLINE __m256i widen_twice(__m128i v8) {
  const __m256i v = _mm256_cvtepu8_epi32(v8);
  return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}

// 8 rows' (half h's) unpacked scales and mins of one super-block, each duplicated in both int16
// halves of its int32 lane, from the k-major scale bytes (see q4_k_unpack_scales).
TESSERA_AVX2_INLINE void q4_k_half_scales(const std::uint8_t* sb, int h, __m256i (&sc)[8],
                                          __m256i (&mm)[8]) {
  __m128i S[12];
  for (int k = 0; k < 12; ++k)
    S[k] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + 2048 + 16 * k + 8 * h));
  for (int j = 0; j < 8; ++j) {
    __m128i s8, m8;
    q4_k_scale_bytes(S, j, s8, m8);
    sc[j] = widen_twice(s8);
    mm[j] = widen_twice(m8);
  }
}

template <int T>
struct q4_k_panel_tile {
  TESSERA_AVX2 static void run(const gemm_args& g, std::int64_t p, std::int64_t t0) noexcept {
    const std::int64_t nb = g.cols / qk_k;
    const std::uint8_t* panel =
        g.w + static_cast<std::size_t>(p) * panel_bytes(tensor_type::q4_k, g.cols);
    const block_q8_k* x[T];
    for (int t = 0; t < T; ++t)
      x[t] = reinterpret_cast<const block_q8_k*>(g.x + (t0 + t) * g.x_stride);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    alignas(32) __m256i sc[8], mm[8];
    const std::int64_t r0 = p * panel_rows;
    for (int h = 0; h < 2; ++h) {
      __m256 acc[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_setzero_ps();
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::uint8_t* sb = panel + b * q4_k_panel_block;
        if (h == 0)
          prefetch_span_ahead(sb, q4_k_panel_block,
                              T == 1 ? decode_prefetch_bytes : batch_prefetch_bytes);
        q4_k_half_scales(sb, h, sc, mm);
        __m256i itot[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t)
          itot[t] = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {
          __m256i is[T];
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t)
            is[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            const int k = 4 * s + c;
            const __m256i raw = load256(sb + 64 * k + 32 * h);
            const __m256i lo = _mm256_and_si256(raw, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
              std::int32_t a, b2;
              std::memcpy(&a, x[t][b].qs + 8 * k, 4);
              std::memcpy(&b2, x[t][b].qs + 8 * k + 4, 4);
              is[t] = _mm256_add_epi16(
                  is[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)),
                                          _mm256_maddubs_epi16(hi, _mm256_set1_epi32(b2))));
            }
          }
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t)
            itot[t] = _mm256_add_epi32(itot[t], _mm256_madd_epi16(is[t], sc[s]));
        }
        const __m256 d = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 2240 + 16 * h)));
        const __m256 dmin = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 2272 + 16 * h)));
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          __m256i msum = _mm256_setzero_si256();
          for (int s = 0; s < 8; ++s) {
            std::int32_t pair;
            std::memcpy(&pair, x[t][b].bsums + 2 * s, 4);
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mm[s], _mm256_set1_epi32(pair)));
          }
          const __m256 dx = _mm256_set1_ps(x[t][b].d);
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(itot[t]), _mm256_mul_ps(d, dx), acc[t]);
          acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dx), acc[t]);
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        _mm256_storeu_ps(g.y + (t0 + t) * g.y_stride + r0 + 8 * h, acc[t]);
    }
  }
};

constexpr int q4_k_panel_tokens = 4;

void gemm_q4_k_panels(const gemm_args& g) noexcept {
  static constexpr tile_fn tiles[q4_k_panel_tokens] = {
      &q4_k_panel_tile<1>::run, &q4_k_panel_tile<2>::run, &q4_k_panel_tile<3>::run,
      &q4_k_panel_tile<4>::run};
  for (std::int64_t p = 0; p < g.rows / panel_rows; ++p) {
    for (std::int64_t t0 = 0; t0 < g.n_tokens; t0 += q4_k_panel_tokens) {
      const auto nt = static_cast<int>(std::min<std::int64_t>(q4_k_panel_tokens, g.n_tokens - t0));
      tiles[nt - 1](g, p, t0);
    }
  }
}

// ---- f16 in panels: the AVX-512 kernel's lanes in two ymm halves ------------------------------
template <int T>
struct f16_panel_tile {
  TESSERA_AVX2 static void run(const gemm_args& g, std::int64_t p, std::int64_t t0) noexcept {
    const auto* w = reinterpret_cast<const std::uint16_t*>(
        g.w + static_cast<std::size_t>(p) * panel_bytes(tensor_type::f16, g.cols));
    const float* x[T];
    for (int t = 0; t < T; ++t)
      x[t] = reinterpret_cast<const float*>(g.x + (t0 + t) * g.x_stride);
    __m256 lo[T], hi[T];
    for (int t = 0; t < T; ++t)
      lo[t] = hi[t] = _mm256_setzero_ps();
    for (std::int64_t c = 0; c < g.cols; ++c) {
      const __m256 wl =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c * panel_rows)));
      const __m256 wh = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c * panel_rows + 8)));
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_set1_ps(x[t][c]);
        lo[t] = _mm256_fmadd_ps(wl, xv, lo[t]);
        hi[t] = _mm256_fmadd_ps(wh, xv, hi[t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      _mm256_storeu_ps(g.y + (t0 + t) * g.y_stride + p * panel_rows, lo[t]);
      _mm256_storeu_ps(g.y + (t0 + t) * g.y_stride + p * panel_rows + 8, hi[t]);
    }
  }
};

void gemm_f16_panels(const gemm_args& g) noexcept {
  constexpr int max_t = 4;
  static constexpr tile_fn tiles[max_t] = {&f16_panel_tile<1>::run, &f16_panel_tile<2>::run,
                                           &f16_panel_tile<3>::run, &f16_panel_tile<4>::run};
  for (std::int64_t p = 0; p < g.rows / panel_rows; ++p) {
    for (std::int64_t t0 = 0; t0 < g.n_tokens; t0 += max_t) {
      const auto nt = static_cast<int>(std::min<std::int64_t>(max_t, g.n_tokens - t0));
      tiles[nt - 1](g, p, t0);
    }
  }
}

// ---- q8_0 from GGUF's rows, exact block sums ---------------------------------------------------
// The panel kernels' arithmetic from rows, as the AVX-512 file does (act_format::q8_0_panel
// activations): each (row, token) adds its exact integer block sum times dw * dx with one FMA per
// block, so decode, batches, prefill, the scalar panel reference and the AVX-512 kernels give
// the same bits. The old row tiles here summed 8 partial lanes in float and took 6-7 vector
// instructions per row, token and block (sign, multiply-add twice, convert, scale, FMA); the panel
// tile takes 4 per row group of 8, token and 4 columns, so prefill packs panels and runs it.

// The signed q8_0 product of a weight block and an activation block, in 8 int32 lanes.
TESSERA_AVX2_INLINE __m256i q8_dot8(__m256i w, __m256i x, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                           ones);
}

// Decode: 8 rows a step, each prefetched 24 rows ahead (the AVX-512 file's measured distance).
constexpr int rows8_prefetch_rows = 24;
TESSERA_AVX2 void q8_0_rows8_decode(const gemm_args& g, std::int64_t r0) noexcept {
  const std::int64_t nb = g.cols / qk8_0;
  const std::uint8_t* w0 = g.w + r0 * g.w_stride;
  const auto stride = static_cast<std::int64_t>(g.w_stride);
  const auto* x = reinterpret_cast<const block_q8_0_act*>(g.x);
  const __m256i ones = _mm256_set1_epi16(1);
  const std::size_t ahead = decode_prefetch_ahead(g.w_stride, rows8_prefetch_rows);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* col = w0 + b * static_cast<std::int64_t>(sizeof(block_q8_0));
    if (b % 2 == 0) {
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        prefetch_ahead(col + r * stride, ahead);
        prefetch_ahead(col + r * stride, ahead + 64);
      }
    }
    const __m256i xb = load256(x[b].qs);
    __m256i p[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r)
      p[r] = q8_dot8(load256(col + r * stride + 2), xb, ones);
    const __m256 dw = _mm256_cvtph_ps(scales8(col, stride));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_rows8(p)),
                          _mm256_mul_ps(dw, _mm256_set1_ps(x[b].d)), acc);
  }
  _mm256_storeu_ps(g.y + r0, acc);
}

// One row, one token (rows past the last group of 8 or 16): the same integers and float
// operations, one lane at a time.
TESSERA_AVX2 void q8_0_row_exact(const gemm_args& g, std::int64_t r, std::int64_t t) noexcept {
  const auto* w = reinterpret_cast<const block_q8_0*>(g.w + r * g.w_stride);
  const auto* x = reinterpret_cast<const block_q8_0_act*>(g.x + t * g.x_stride);
  const __m256i ones = _mm256_set1_epi16(1);
  float acc = 0.0f;
  for (std::int64_t b = 0; b < g.cols / qk8_0; ++b) {
    const __m256i p = q8_dot8(load256(w[b].qs), load256(x[b].qs), ones);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    acc = std::fma(static_cast<float>(_mm_cvtsi128_si32(s)), half(w[b].d) * x[b].d, acc);
  }
  g.y[t * g.y_stride + r] = acc;
}

// 16 rows from r0 into a scratch panel: the panel layout with the signed levels themselves (the
// unflipped tile reads them), 8 rows at a time by a register transpose, prefetching the rows
// ahead as decode does (they come from DRAM once per batch).
TESSERA_AVX2 void pack_rows16(const gemm_args& g, std::int64_t r0, std::uint8_t* panel) noexcept {
  const std::int64_t nb = g.cols / qk8_0;
  const std::uint8_t* w0 = g.w + r0 * g.w_stride;
  const auto stride = static_cast<std::int64_t>(g.w_stride);
  auto* scales = reinterpret_cast<std::uint16_t*>(panel + nb * 512);
  const std::size_t ahead = decode_prefetch_ahead(g.w_stride, 2 * panel_rows);
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* col = w0 + b * static_cast<std::int64_t>(sizeof(block_q8_0));
    if (b % 2 == 0) {
#pragma GCC unroll 16
      for (int r = 0; r < panel_rows; ++r) {
        prefetch_ahead(col + r * stride, ahead);
        prefetch_ahead(col + r * stride, ahead + 64);
      }
    }
    std::uint8_t* out = panel + b * 512;
    for (int h = 0; h < 2; ++h) {
      __m256i r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i)
        r[i] = load256(col + (8 * h + i) * stride + 2);
      transpose8x8(r);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * k + 32 * h), r[k]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(scales + b * panel_rows + 8 * h),
                       scales8(col + 8 * h * stride, stride));
    }
  }
}

// Decode takes 8 rows a step; two tokens or more pack each group of 16 rows into a panel once
// (about 1.5 tokens' work: 16 loads, 48 shuffles, 16 stores a block) and run the panel tile over
// all the tokens, which even at 2 tokens costs less than the old row tiles.
void gemm_q8_0_rows(const gemm_args& g) noexcept {
  if (g.n_tokens == 1) {
    const std::int64_t eights = g.rows / 8 * 8;
    for (std::int64_t r0 = 0; r0 < eights; r0 += 8)
      q8_0_rows8_decode(g, r0);
    for (std::int64_t r = eights; r < g.rows; ++r)
      q8_0_row_exact(g, r, 0);
    return;
  }
  const std::int64_t whole = g.rows / panel_rows * panel_rows;
  thread_local std::vector<std::uint8_t> scratch;
  scratch.resize(q8_0_panel_bytes(g.cols));
  for (std::int64_t r0 = 0; r0 < whole; r0 += panel_rows) {
    pack_rows16(g, r0, scratch.data());
    gemm_args one = g;
    one.w = scratch.data();
    one.rows = panel_rows;
    one.y = g.y + r0;
    q8_0_half_tiles<false>(one);
  }
  for (std::int64_t r = whole; r < g.rows; ++r)
    for (std::int64_t t = 0; t < g.n_tokens; ++t)
      q8_0_row_exact(g, r, t);
}

}  // namespace

const kernel_table& avx2_kernels() noexcept {
  static const kernel_table table = [] {
    kernel_table k{};
    k.gemm[type_slot(tensor_type::f32)] = drive_tiles<f32_tile, 4, 2>;
    k.gemm[type_slot(tensor_type::f16)] = drive_tiles<f16_tile, 4, 2>;
    k.gemm[type_slot(tensor_type::bf16)] = drive_tiles<bf16_tile, 4, 2>;
    k.gemm[type_slot(tensor_type::q8_0)] = gemm_q8_0_rows;
    k.gemm[type_slot(tensor_type::q4_0)] = drive_tiles<q4_0_tile, 4, 2>;
    k.gemm[type_slot(tensor_type::q4_k)] = drive_tiles<q4_k_tile, 1, 4>;
    k.gemm[type_slot(tensor_type::q6_k)] = drive_tiles<q6_k_tile, 1, 4>;
    k.q8_0_panels = gemm_q8_0_panels;
    k.q4_k_panels = gemm_q4_k_panels;
    k.f16_panels = gemm_f16_panels;
    return k;
  }();
  return table;
}

}  // namespace tessera::inference::detail
