// AVX-512 (F/BW/VL) + VNNI kernels. Only called when the CPU has them (see cpu.cpp).
//
// q8_0 and q4_0 work on two blocks per 512-bit register. vpdpbusd multiplies unsigned by signed
// bytes and sums four products into an int32 lane without intermediate saturation:
//  - q8_0 x q8_0: the activations are made unsigned (x + 128, an xor with 0x80) and the surplus
//    128 * sum(w) is subtracted; it is computed once per weight block and shared by every token of
//    the tile, so each (row, token) pair costs one vpdpbusd per 64 bytes;
//  - q4_0 x q8_0: the 4-bit levels are already unsigned; the "- 8" is taken off as 8 * sum(x),
//    once per activation block.
// The integer block sums are therefore exactly those of the scalar reference.
// The K-quants use vpmaddubsw/vpmaddwd with the sub-block scales spread over int16 lanes.
// GCC 12's avx512fintrin.h initialises vectors from _mm512_undefined_*(), which -Wuninitialized
// reports once inlined here (a known false positive of the header, not of this code).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "inference/kernels/gemm_tiles.hpp"
#include "inference/kernels/gemm_x86.hpp"

#define TESSERA_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define TESSERA_AVX512_INLINE                                                             \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) \
  inline

namespace tessera::inference::detail {

namespace {

TESSERA_AVX512_INLINE float half(std::uint16_t h) { return _cvtsh_ss(h); }

TESSERA_AVX512_INLINE __m512i pair512(const void* lo, const void* hi) {
  const __m256i a = _mm256_loadu_si256(static_cast<const __m256i*>(lo));
  const __m256i b = hi ? _mm256_loadu_si256(static_cast<const __m256i*>(hi)) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// [lo x 8, hi x 8] from two fp16 scales: one conversion and one permute (this runs once per row
// per two blocks in decode, where it is a sizeable part of the work per byte).
TESSERA_AVX512_INLINE __m512 half_pair(std::uint16_t lo, std::uint16_t hi) {
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(lo | (std::uint32_t{hi} << 16))));
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

// ---- float weights -----------------------------------------------------------------------------

template <tensor_type W>
TESSERA_AVX512_INLINE __m512 load16(const std::uint8_t* p, std::int64_t i, __mmask16 mask) {
  if (__builtin_constant_p(mask) && mask == 0xFFFF) {
    if constexpr (W == tensor_type::f32) {
      return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + i);
    } else {
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(reinterpret_cast<const std::uint16_t*>(p) + i));
      if constexpr (W == tensor_type::f16) {
        return _mm512_cvtph_ps(h);
      } else {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
    }
  }
  if constexpr (W == tensor_type::f32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(p) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, reinterpret_cast<const std::uint16_t*>(p) + i);
    if constexpr (W == tensor_type::f16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <tensor_type W, int R, int T>
struct float_tile {
  TESSERA_AVX512_INLINE static void step(const std::uint8_t* const* w, const float* const* x,
                                         std::int64_t i, __mmask16 mask, std::size_t ahead,
                                         __m512 (&acc)[R][T]) {
    __m512 xv[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      xv[t] = (__builtin_constant_p(mask) && mask == 0xFFFF) ? _mm512_loadu_ps(x[t] + i)
                                                             : _mm512_maskz_loadu_ps(mask, x[t] + i);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) {
        // One cache line per row every 64 / sizeof(element) columns.
        constexpr std::int64_t per_line = W == tensor_type::f32 ? 16 : 32;
        if (i % per_line == 0) prefetch_ahead(w[r] + i * (W == tensor_type::f32 ? 4 : 2), ahead);
      }
      const __m512 wv = load16<W>(w[r], i, mask);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }

  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const std::uint8_t* w[R];
    const float* x[T];
    for (int r = 0; r < R; ++r) w[r] = g.w + (r0 + r) * g.w_stride;
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const float*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, R);
    std::int64_t i = 0;
    for (; i + 32 <= g.cols; i += 32) {
      step(w, x, i, 0xFFFF, ahead, acc);
      step(w, x, i + 16, 0xFFFF, ahead, acc);
    }
    for (; i + 16 <= g.cols; i += 16) step(w, x, i, 0xFFFF, ahead, acc);
    // The last, partial step uses masked loads: no scalar tail.
    if (i < g.cols) step(w, x, i, static_cast<__mmask16>((1u << (g.cols - i)) - 1u), ahead, acc);
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.y_stride + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

template <int R, int T>
using f32_tile = float_tile<tensor_type::f32, R, T>;
template <int R, int T>
using f16_tile = float_tile<tensor_type::f16, R, T>;
template <int R, int T>
using bf16_tile = float_tile<tensor_type::bf16, R, T>;

// ---- q8_0 in GGUF's rows: exact block sums ---------------------------------------------------
//
// The same arithmetic as the panel kernels below (gemm_kernels.hpp): per row and block the exact
// integer dot product, then one conversion, one multiply (dw * dx) and one FMA into the row's sum,
// blocks in order. Decode reads 8 rows at a time from their rows — the access pattern of the old
// row tiles, prefetched ahead, which streams DRAM 25-30% faster here than reading panels
// (bench/RESULTS.md, issue 35) — and reduces their lanes with a transpose; batches of 2 to
// q8_0_pack_tokens - 1 transpose each 16-row block into panel form in registers; prefill packs
// each group of 16 rows into a panel in a scratch buffer once and runs the panel tiles over all
// its tokens. Rows past the last whole group take one row at a time. Whichever path a (row,
// token) takes, its value has the same bits.

// The fp16 scales d of 16 rows' blocks (a gather was ~30% of a decode step here; scales8 is in
// gemm_x86.hpp).
TESSERA_AVX512_INLINE __m256i scales16(const std::uint8_t* col, std::int64_t stride) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(scales8(col, stride)),
                                 scales8(col + 8 * stride, stride), 1);
}

// Decode (one token) takes 8 rows a step: per lane the arithmetic of the 16-row steps below (the
// same bits), reduced with a transpose-add of the 8 rows' lanes. 8 row streams in flight, each
// prefetched 24 rows ahead, streamed DRAM ~25% faster here than 16 (large Q8_0 decode 76 -> 93
// tok/s; 16 or 32 rows ahead: a few % slower) — as fast as the old lane-wise row tiles.
constexpr int rows8_prefetch_rows = 24;
TESSERA_AVX512 void q8_0_rows8_decode(const gemm_args& g, std::int64_t r0,
                                      std::int64_t t0) noexcept {
  const std::int64_t nb = g.cols / qk8_0;
  const std::uint8_t* w0 = g.w + r0 * g.w_stride;
  const auto stride = static_cast<std::int64_t>(g.w_stride);
  const auto* x = reinterpret_cast<const block_q8_0_act*>(g.x + t0 * g.x_stride);
  __m256 acc = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const std::size_t ahead = decode_prefetch_ahead(g.w_stride, rows8_prefetch_rows);
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* col = w0 + b * static_cast<std::int64_t>(sizeof(block_q8_0));
    if (b % 2 == 0) {
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        prefetch_ahead(col + r * stride, ahead);
        prefetch_ahead(col + r * stride, ahead + 64);
      }
    }
    const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    __m256i p[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r)
      p[r] = _mm256_dpbusd_epi32(
          _mm256_setzero_si256(),
          _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + r * stride + 2)), flip),
          xb);
    const __m128i v = scales8(col, stride);
    const __m256i sum = _mm256_add_epi32(sum_rows8(p), _mm256_set1_epi32(x[b].bias));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                          _mm256_mul_ps(_mm256_cvtph_ps(v), _mm256_set1_ps(x[b].d)), acc);
  }
  _mm256_storeu_ps(g.y + t0 * g.y_stride + r0, acc);
}

// Batches below q8_0_pack_tokens, up to 8 tokens a tile: the 16 rows' block transposed in
// registers into the panel form (lane = row, 4 columns per dword) once, then the panel tile's
// arithmetic for each token: a block costs the loads and the transpose once and ~11 instructions
// per token, where the 8-row decode step pays its lane reduction per token.
template <int T>
struct q8_0_rows16_batch {
  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const std::int64_t nb = g.cols / qk8_0;
    const std::uint8_t* w0 = g.w + r0 * g.w_stride;
    const auto stride = static_cast<std::int64_t>(g.w_stride);
    const block_q8_0_act* x[T];
    for (int t = 0; t < T; ++t)
      x[t] = reinterpret_cast<const block_q8_0_act*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_setzero_ps();
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, 32);
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::uint8_t* col = w0 + b * static_cast<std::int64_t>(sizeof(block_q8_0));
      if (b % 2 == 0) {
#pragma GCC unroll 16
        for (int r = 0; r < panel_rows; ++r) {
          prefetch_ahead(col + r * stride, ahead);
          prefetch_ahead(col + r * stride, ahead + 64);
        }
      }
      __m256i lo[8], hi[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        lo[r] = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + r * stride + 2)), flip);
        hi[r] = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + (r + 8) * stride + 2)), flip);
      }
      transpose8x8(lo);
      transpose8x8(hi);
      __m512i grp[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k)
        grp[k] = _mm512_inserti64x4(_mm512_castsi256_si512(lo[k]), hi[k], 1);
      const __m512 dw = _mm512_cvtph_ps(scales16(col, stride));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512i sum = _mm512_set1_epi32(x[t][b].bias);
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          std::int32_t four;
          std::memcpy(&four, x[t][b].qs + 4 * k, sizeof(four));
          sum = _mm512_dpbusd_epi32(sum, grp[k], _mm512_set1_epi32(four));
        }
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                 _mm512_mul_ps(dw, _mm512_set1_ps(x[t][b].d)), acc[t]);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      _mm512_storeu_ps(g.y + (t0 + t) * g.y_stride + r0, acc[t]);
  }
};

// One row, one token (the rows after the last whole group): the same integers and float
// operations, one lane at a time.
TESSERA_AVX512 void q8_0_row_exact(const gemm_args& g, std::int64_t r, std::int64_t t) noexcept {
  const auto* w = reinterpret_cast<const block_q8_0*>(g.w + r * g.w_stride);
  const auto* x = reinterpret_cast<const block_q8_0_act*>(g.x + t * g.x_stride);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  float acc = 0.0f;
  for (std::int64_t b = 0; b < g.cols / qk8_0; ++b) {
    const __m256i wq =
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs)), flip);
    const __m256i p = _mm256_dpbusd_epi32(
        _mm256_setzero_si256(), wq, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs)));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    const std::int32_t isum = _mm_cvtsi128_si32(s) + x[b].bias;
    acc = std::fma(static_cast<float>(isum), half(w[b].d) * x[b].d, acc);
  }
  g.y[t * g.y_stride + r] = acc;
}

// ---- q4_0 --------------------------------------------------------------------------------------

TESSERA_AVX512_INLINE __m256i q4_0_levels(const block_q4_0& blk) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

template <int R, int T>
struct q4_0_tile {
  TESSERA_AVX512_INLINE static void step(const block_q4_0* const* w, const block_q8_0* const* x,
                                         std::int64_t b, bool single, std::size_t ahead,
                                         __m512 (&acc)[R][T]) {
    const __m512i eights = _mm512_set1_epi8(8);
    __m512i xs[T];
    __m512i neg8[T];
    __m512 dx[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      xs[t] = pair512(x[t][b].qs, single ? nullptr : x[t][b + 1].qs);
      neg8[t] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), eights, xs[t]));
      dx[t] = half_pair(x[t][b].d, single ? std::uint16_t{0} : x[t][b + 1].d);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) prefetch_ahead(w[r] + b, ahead);  // 36 bytes: one or two lines
      if constexpr (T == 1) prefetch_ahead(w[r] + b, ahead + 35);
      const __m256i hi = single ? _mm256_setzero_si256() : q4_0_levels(w[r][b + 1]);
      const __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(q4_0_levels(w[r][b])), hi, 1);
      const __m512 dw = half_pair(w[r][b].d, single ? std::uint16_t{0} : w[r][b + 1].d);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512i p = _mm512_dpbusd_epi32(neg8[t], wq, xs[t]);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx[t]), acc[r][t]);
      }
    }
  }

  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const block_q4_0* w[R];
    const block_q8_0* x[T];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const block_q4_0*>(g.w + (r0 + r) * g.w_stride);
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const block_q8_0*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    const std::int64_t nb = g.cols / qk4_0;
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, R);
    std::int64_t b = 0;
    for (; b + 2 <= nb; b += 2) step(w, x, b, false, ahead, acc);
    if (b < nb) step(w, x, b, true, ahead, acc);
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.y_stride + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

// ---- K-quants against q8_K activations (one weight row, up to 4 tokens) ------------------------
//
// A zmm holds 64 consecutive elements. vpmaddubsw (unsigned levels x signed activations, pairs
// never saturate: 2 * 63 * 127 < 32767) then vpmaddwd with the sub-block scales spread over their
// int16 lanes (vpermw) gives int32 sums that are exact, as in the scalar reference.

// vpermw indices: lane i of a spread takes scale first + i / per_scale.
struct spread_table {
  alignas(64) std::int16_t idx[4][32];
  constexpr spread_table(int per_scale, const int (&first)[4]) : idx{} {
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 32; ++i) idx[k][i] = static_cast<std::int16_t>(first[k] + i / per_scale);
    }
  }
};
constexpr int q4_k_first[4] = {0, 2, 4, 6};  // zmm j: sub-blocks 2j, 2j+1 (32 elements each)
constexpr int q6_k_first[4] = {0, 4, 8, 12};  // zmm k: sub-blocks 4k..4k+3 (16 elements each)
constexpr spread_table q4_k_spread(16, q4_k_first);
constexpr spread_table q6_k_spread(8, q6_k_first);

TESSERA_AVX512_INLINE __m512i spread_scales(__m256i scales16, const std::int16_t* idx) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(idx), _mm512_castsi256_si512(scales16));
}

template <int R, int T>
struct q4_k_tile {
  static_assert(R == 1);
  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const auto* w = reinterpret_cast<const block_q4_k*>(g.w + r0 * g.w_stride);
    const block_q8_k* x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const block_q8_k*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[T];
    __m256 mins[T];
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_setzero_ps();
      mins[t] = _mm256_setzero_ps();
    }
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i pair_idx = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, 1);
    for (std::int64_t b = 0; b < g.cols / qk_k; ++b) {
      if constexpr (T == 1) prefetch_span_ahead(w + b, sizeof(block_q4_k), ahead);
      alignas(16) std::uint8_t scm[16];  // 8 scales, then 8 mins
      q4_k_unpack_scales(w[b].scales, scm, scm + 8);
      const __m256i scm16 = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(scm)));
      // Sub-blocks 2j (low nibbles of qs[32j..32j+31]) and 2j+1 (high nibbles) = elements
      // 64j..64j+63, matching one zmm of activations.
      __m512i q[4], sc[4];
      for (int j = 0; j < 4; ++j) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs + 32 * j));
        q[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(raw, low4)),
                                  _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), 1);
        sc[j] = spread_scales(scm16, q4_k_spread.idx[j]);
      }
      const __m256i m_pairs = _mm256_permutexvar_epi16(pair_idx, scm16);  // m0 m0 m1 m1 ...
      const float d = half(w[b].d);
      const float dmin = half(w[b].dmin);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        __m512i isum = _mm512_setzero_si512();
        for (int j = 0; j < 4; ++j) {
          const __m512i xv = _mm512_loadu_si512(x[t][b].qs + 64 * j);
          isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(q[j], xv), sc[j]));
        }
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].bsums));
        const __m256i msum = _mm256_madd_epi16(bs, m_pairs);  // m_s * (bsum_2s + bsum_2s+1)
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * x[t][b].d), acc[t]);
        mins[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dmin * x[t][b].d), mins[t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m128 m4 = _mm_add_ps(_mm256_castps256_ps128(mins[t]), _mm256_extractf128_ps(mins[t], 1));
      const __m128 m2 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
      const float m1 = _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)));
      g.y[(t0 + t) * g.y_stride + r0] = _mm512_reduce_add_ps(acc[t]) - m1;
    }
  }
};

template <int R, int T>
struct q6_k_tile {
  static_assert(R == 1);
  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const auto* w = reinterpret_cast<const block_q6_k*>(g.w + r0 * g.w_stride);
    const block_q8_k* x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const block_q8_k*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[T];
    __m256 offs[T];
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_setzero_ps();
      offs[t] = _mm256_setzero_ps();
    }
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i low2 = _mm512_set1_epi8(0x03);
    // Per 256-bit half of a zmm: which bit pair of qh holds the top bits (see block_q6_k).
    const __m512i shift_a = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift_b = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    const std::size_t ahead = decode_prefetch_ahead(g.w_stride, 1);
    for (std::int64_t b = 0; b < g.cols / qk_k; ++b) {
      if constexpr (T == 1) prefetch_span_ahead(w + b, sizeof(block_q6_k), ahead);
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales)));
      __m512i q[4], sc[4];
      for (int h = 0; h < 2; ++h) {
        const __m512i ql = _mm512_loadu_si512(w[b].ql + 64 * h);  // [ql0 | ql1]
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qh + 32 * h)));
        const __m512i hi_a = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_a), low2), 4);
        const __m512i hi_b = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_b), low2), 4);
        q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), hi_a);  // elements 128h + 0..63
        q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi_b);
        sc[2 * h] = spread_scales(sc16, q6_k_spread.idx[2 * h]);
        sc[2 * h + 1] = spread_scales(sc16, q6_k_spread.idx[2 * h + 1]);
      }
      const float d = half(w[b].d);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        __m512i isum = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          const __m512i xv = _mm512_loadu_si512(x[t][b].qs + 64 * k);
          isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(q[k], xv), sc[k]));
        }
        // The "- 32" of the levels: 32 * sum_s sc_s * bsum_s, via the activation block sums.
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].bsums));
        const __m256i corr = _mm256_madd_epi16(bs, sc16);
        const float dd = d * x[t][b].d;
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(dd), acc[t]);
        offs[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_set1_ps(32.0f * dd), offs[t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m128 o4 = _mm_add_ps(_mm256_castps256_ps128(offs[t]), _mm256_extractf128_ps(offs[t], 1));
      const __m128 o2 = _mm_add_ps(o4, _mm_movehl_ps(o4, o4));
      const float o1 = _mm_cvtss_f32(_mm_add_ss(o2, _mm_movehdup_ps(o2)));
      g.y[(t0 + t) * g.y_stride + r0] = _mm512_reduce_add_ps(acc[t]) - o1;
    }
  }
};

// ---- q8_0 in panels (layout in gemm_kernels.hpp) ---------------------------------------------
//
// One 64-byte load holds 4 columns of the panel's 16 rows as unsigned bytes; vpdpbusd with the 4
// activation bytes of those columns broadcast ({1to16} from memory) adds them into 16 int32 lanes,
// lane i = row i. After the block's 8 groups each lane is the row's exact block sum (plus the
// +128 surplus, taken off by starting from the activation block's bias), so a block costs one
// conversion, one multiply and one FMA per 16 rows and token, where the row tiles paid them per 4
// products. No horizontal sums: the 16 lanes are 16 outputs. One weight load serves T tokens.

// Decode (one token): P panels side by side, P streams through memory at once, as the row tiles
// stream 4 rows (one stream left the core's memory parallelism unused: ~25 vs ~33 GB/s). Per
// lane the same integers and float operations as the tile below.
template <int P>
TESSERA_AVX512 void q8_0_panel_decode(const gemm_args& g, std::int64_t p0,
                                      std::int64_t t0) noexcept {
  const std::int64_t nb = g.cols / qk8_0;
  const std::size_t panel = q8_0_panel_bytes(g.cols);
  const std::uint8_t* q[P];
  for (int k = 0; k < P; ++k)
    q[k] = g.w + static_cast<std::size_t>(p0 + k) * panel;
  const auto* x = reinterpret_cast<const block_q8_0_act*>(g.x + t0 * g.x_stride);
  __m256 lo[P], hi[P];
  for (int k = 0; k < P; ++k)
    lo[k] = hi[k] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const auto* xq = reinterpret_cast<const std::int32_t*>(x[b].qs);
    const __m256 dx = _mm256_set1_ps(x[b].d);
    const __m256i bias = _mm256_set1_epi32(x[b].bias);
#pragma GCC unroll 4
    for (int k = 0; k < P; ++k) {
      const std::uint8_t* qb = q[k] + b * 512;
      __m256i sl = bias, sh = bias;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i xb = _mm256_set1_epi32(xq[j]);
        sl = _mm256_dpbusd_epi32(
            sl, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 64 * j)), xb);
        sh = _mm256_dpbusd_epi32(
            sh, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 64 * j + 32)), xb);
      }
      const auto* scales = reinterpret_cast<const std::uint16_t*>(q[k] + nb * 512) + b * panel_rows;
      const __m256 dl = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
      const __m256 dh =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 8)));
      lo[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sl), _mm256_mul_ps(dl, dx), lo[k]);
      hi[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sh), _mm256_mul_ps(dh, dx), hi[k]);
    }
  }
  for (int k = 0; k < P; ++k) {
    float* y = g.y + t0 * g.y_stride + (p0 + k) * panel_rows;
    _mm256_storeu_ps(y, lo[k]);
    _mm256_storeu_ps(y + 8, hi[k]);
  }
}

// Stream: the panels are the weights in memory (prefetched ahead, batch_prefetch_bytes), not a
// scratch copy of 16 rows.
template <int T, bool Stream>
struct q8_0_panel_tile_of {
  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t p, std::int64_t t0) noexcept {
    const std::int64_t nb = g.cols / qk8_0;
    const std::uint8_t* q = g.w + static_cast<std::size_t>(p) * q8_0_panel_bytes(g.cols);
    const auto* scales = reinterpret_cast<const std::uint16_t*>(q + nb * 512);
    const block_q8_0_act* x[T];
    for (int t = 0; t < T; ++t)
      x[t] = reinterpret_cast<const block_q8_0_act*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_setzero_ps();
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::uint8_t* qb = q + b * 512;
      if constexpr (Stream) prefetch_span_ahead(qb, 512, batch_prefetch_bytes);
      __m512i s[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        s[t] = _mm512_set1_epi32(x[t][b].bias);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i w = _mm512_loadu_si512(qb + 64 * k);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          std::int32_t four;
          std::memcpy(&four, x[t][b].qs + 4 * k, sizeof(four));
          s[t] = _mm512_dpbusd_epi32(s[t], w, _mm512_set1_epi32(four));
        }
      }
      const __m512 dw = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + b * panel_rows)));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]),
                                 _mm512_mul_ps(dw, _mm512_set1_ps(x[t][b].d)), acc[t]);
      }
    }
    const std::int64_t r0 = p * panel_rows;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      _mm512_storeu_ps(g.y + (t0 + t) * g.y_stride + r0, acc[t]);
  }
};
template <int T>
using q8_0_panel_tile = q8_0_panel_tile_of<T, true>;
template <int T>
using q8_0_scratch_tile = q8_0_panel_tile_of<T, false>;

// ---- q4_K in panels (layout in gemm_kernels.hpp) ---------------------------------------------
//
// The levels (0..15) are vpdpbusd's unsigned operand as stored: a 64-byte chunk holds two groups
// of 4 columns of the 16 rows (low and high nibbles). Per sub-block of 32 columns each int32 lane
// collects its row's exact dot product, multiplied by the row's 6-bit scale (vpmulld) into the
// super-block's sum; the mins are taken off as sum_s m_s * bsum_s with vpdpwssd (the activation's
// int16 block sums in pairs against each row's min, duplicated). Both sums are the exact integers
// of the row kernels, then two FMAs per super-block.

// The 16 rows' unpacked scales (int32 lanes) and mins (the same min in both int16 halves of a
// lane) of one super-block, from its k-major scale bytes (see q4_k_unpack_scales).
TESSERA_AVX512_INLINE void q4_k_panel_scales(const std::uint8_t* sb, __m512i (&sc)[8],
                                             __m512i (&mm)[8]) {
  __m128i S[12];
  for (int k = 0; k < 12; ++k)
    S[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 2048 + 16 * k));
  for (int j = 0; j < 8; ++j) {
    __m128i s8, m8;
    q4_k_scale_bytes(S, j, s8, m8);
    sc[j] = _mm512_cvtepu8_epi32(s8);
    const __m512i m32 = _mm512_cvtepu8_epi32(m8);
    mm[j] = _mm512_or_si512(m32, _mm512_slli_epi32(m32, 16));
  }
}

template <int T>
struct q4_k_panel_tile {
  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t p, std::int64_t t0) noexcept {
    const std::int64_t nb = g.cols / qk_k;
    const std::uint8_t* panel =
        g.w + static_cast<std::size_t>(p) * panel_bytes(tensor_type::q4_k, g.cols);
    const block_q8_k* x[T];
    for (int t = 0; t < T; ++t)
      x[t] = reinterpret_cast<const block_q8_k*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    alignas(64) __m512i sc[8], mm[8];
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::uint8_t* sb = panel + b * q4_k_panel_block;
      prefetch_span_ahead(sb, q4_k_panel_block,
                          T == 1 ? decode_prefetch_bytes : batch_prefetch_bytes);
      q4_k_panel_scales(sb, sc, mm);
      __m512i itot[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        itot[t] = _mm512_setzero_si512();
      for (int s = 0; s < 8; ++s) {
        __m512i is[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          is[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const int k = 4 * s + c;
          const __m512i raw = _mm512_loadu_si512(sb + 64 * k);
          const __m512i lo = _mm512_and_si512(raw, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            std::int32_t a, b2;
            std::memcpy(&a, x[t][b].qs + 8 * k, 4);
            std::memcpy(&b2, x[t][b].qs + 8 * k + 4, 4);
            is[t] = _mm512_dpbusd_epi32(is[t], lo, _mm512_set1_epi32(a));
            is[t] = _mm512_dpbusd_epi32(is[t], hi, _mm512_set1_epi32(b2));
          }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          itot[t] = _mm512_add_epi32(itot[t], _mm512_mullo_epi32(is[t], sc[s]));
      }
      const __m512 d =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 2240)));
      const __m512 dmin =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 2272)));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512i msum = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {
          std::int32_t pair;
          std::memcpy(&pair, x[t][b].bsums + 2 * s, 4);
          msum = _mm512_dpwssd_epi32(msum, mm[s], _mm512_set1_epi32(pair));
        }
        const __m512 dx = _mm512_set1_ps(x[t][b].d);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(itot[t]), _mm512_mul_ps(d, dx), acc[t]);
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx), acc[t]);
      }
    }
    const std::int64_t r0 = p * panel_rows;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      _mm512_storeu_ps(g.y + (t0 + t) * g.y_stride + r0, acc[t]);
  }
};

// ---- f16 in panels ---------------------------------------------------------------------------
//
// Column c of a panel is one 32-byte load, converted once (vcvtph2ps) and used by every token of
// the tile: one FMA per 16 rows and token, against the activation broadcast from memory. P panels
// side by side keep enough independent FMA chains when there are few tokens (decode: 4 panels);
// each lane still adds its row's products in column order, so the tile shape never changes a
// value. The FMA units bound this (about 16 products per cycle): f16 prefill cannot pass the f32
// peak without rounding the weights to bf16, which these kernels do not.
template <int P, int T>
struct f16_panel_tile {
  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t p0, std::int64_t t0) noexcept {
    const std::size_t panel = panel_bytes(tensor_type::f16, g.cols);
    const std::uint16_t* w[P];
    for (int q = 0; q < P; ++q)
      w[q] = reinterpret_cast<const std::uint16_t*>(g.w + static_cast<std::size_t>(p0 + q) * panel);
    const float* x[T];
    for (int t = 0; t < T; ++t)
      x[t] = reinterpret_cast<const float*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[P][T];
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q)
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        acc[q][t] = _mm512_setzero_ps();
    for (std::int64_t c = 0; c < g.cols; ++c) {
#pragma GCC unroll 8
      for (int q = 0; q < P; ++q) {
        // Decode (and attention's few queries over a key cache) streams P panels side by side:
        // each prefetched ahead (two columns per line).
        if (T <= 4 && c % 2 == 0) prefetch_ahead(w[q] + c * panel_rows, decode_prefetch_bytes);
        const __m512 wv = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[q] + c * panel_rows)));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t)
          acc[q][t] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x[t][c]), acc[q][t]);
      }
    }
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q)
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        _mm512_storeu_ps(g.y + (t0 + t) * g.y_stride + (p0 + q) * panel_rows, acc[q][t]);
  }
};

// 8 tokens per panel; fewer tokens take more panels at once (at least 8 FMA chains where the
// rows allow).
void gemm_f16_panels(const gemm_args& g) noexcept {
  const std::int64_t np = g.rows / panel_rows;
  const std::int64_t whole = g.n_tokens / 8 * 8;
  // Panels outer: a panel stays in cache while every group of 8 tokens uses it.
  for (std::int64_t p = 0; p < np; ++p)
    for (std::int64_t t0 = 0; t0 < whole; t0 += 8)
      f16_panel_tile<1, 8>::run(g, p, t0);
  const std::int64_t t0 = whole, left = g.n_tokens - whole;
  if (left == 0) return;
  using fn = void (*)(const gemm_args&, std::int64_t, std::int64_t) noexcept;
  static constexpr fn four[8] = {&f16_panel_tile<4, 1>::run, &f16_panel_tile<4, 2>::run,
                                 &f16_panel_tile<2, 3>::run, &f16_panel_tile<2, 4>::run,
                                 &f16_panel_tile<2, 5>::run, &f16_panel_tile<2, 6>::run,
                                 &f16_panel_tile<1, 7>::run, nullptr};
  static constexpr fn one[8] = {&f16_panel_tile<1, 1>::run, &f16_panel_tile<1, 2>::run,
                                &f16_panel_tile<1, 3>::run, &f16_panel_tile<1, 4>::run,
                                &f16_panel_tile<1, 5>::run, &f16_panel_tile<1, 6>::run,
                                &f16_panel_tile<1, 7>::run, nullptr};
  const int width = left <= 2 ? 4 : (left <= 6 ? 2 : 1);
  std::int64_t p = 0;
  for (; p + width <= np; p += width)
    four[left - 1](g, p, t0);
  for (; p < np; ++p)
    one[left - 1](g, p, t0);
}

template <template <int> class Tile, std::size_t... I>
constexpr std::array<tile_fn, sizeof...(I)> make_panel_tiles(std::index_sequence<I...>) {
  return {&Tile<static_cast<int>(I) + 1>::run...};
}

// Panels outer (each stays in L1/L2 for all the tokens), up to MaxT tokens per tile.
template <template <int> class Tile, int MaxT>
void drive_panels(const gemm_args& g) noexcept {
  static constexpr auto tiles = make_panel_tiles<Tile>(std::make_index_sequence<MaxT>{});
  for (std::int64_t p = 0; p < g.rows / panel_rows; ++p) {
    for (std::int64_t t0 = 0; t0 < g.n_tokens; t0 += MaxT) {
      const auto nt = static_cast<int>(std::min<std::int64_t>(MaxT, g.n_tokens - t0));
      tiles[static_cast<std::size_t>(nt - 1)](g, p, t0);
    }
  }
}

// Prefill: each group of 16 rows packed into a panel (gemm_kernels.hpp) once, then the panel tiles
// for all the tokens: packing costs about one decode pass over the rows, repaid over this many
// tokens.
constexpr std::int64_t q8_0_pack_tokens = 24;

void pack_rows16(const gemm_args& g, std::int64_t r0, std::uint8_t* panel) noexcept {
  const std::int64_t nb = g.cols / qk8_0;
  auto* scales = reinterpret_cast<std::uint16_t*>(panel + nb * 512);
  for (std::int64_t i = 0; i < panel_rows; ++i) {
    const auto* w = reinterpret_cast<const block_q8_0*>(g.w + (r0 + i) * g.w_stride);
    for (std::int64_t b = 0; b < nb; ++b) {
      scales[b * panel_rows + i] = w[b].d;
      std::uint8_t* out = panel + b * 512 + i * 4;
      for (int k = 0; k < 8; ++k) {
        std::uint32_t four;
        std::memcpy(&four, w[b].qs + 4 * k, 4);
        four ^= 0x80808080u;
        std::memcpy(out + 64 * k, &four, 4);
      }
    }
  }
}

template <std::size_t... I>
constexpr std::array<tile_fn, sizeof...(I)> make_rows16(std::index_sequence<I...>) {
  return {&q8_0_rows16_batch<static_cast<int>(I) + 1>::run...};
}

void gemm_q8_0_rows(const gemm_args& g) noexcept {
  const std::int64_t whole = g.rows / panel_rows * panel_rows;
  if (g.n_tokens >= q8_0_pack_tokens) {
    static constexpr auto tiles =
        make_panel_tiles<q8_0_scratch_tile>(std::make_index_sequence<8>{});
    thread_local std::vector<std::uint8_t> scratch;
    scratch.resize(q8_0_panel_bytes(g.cols));
    for (std::int64_t r0 = 0; r0 < whole; r0 += panel_rows) {
      pack_rows16(g, r0, scratch.data());
      gemm_args one = g;
      one.w = scratch.data();
      one.rows = panel_rows;
      one.y = g.y + r0;
      for (std::int64_t t0 = 0; t0 < g.n_tokens; t0 += 8) {
        const auto nt = static_cast<int>(std::min<std::int64_t>(8, g.n_tokens - t0));
        tiles[static_cast<std::size_t>(nt - 1)](one, 0, t0);
      }
    }
  } else if (g.n_tokens == 1) {
    const std::int64_t eights = g.rows / 8 * 8;
    for (std::int64_t r0 = 0; r0 < eights; r0 += 8)
      q8_0_rows8_decode(g, r0, 0);
    for (std::int64_t r = eights; r < g.rows; ++r)
      q8_0_row_exact(g, r, 0);
    return;
  } else {
    static constexpr auto tiles = make_rows16(std::make_index_sequence<8>{});
    for (std::int64_t r0 = 0; r0 < whole; r0 += panel_rows) {
      for (std::int64_t t0 = 0; t0 < g.n_tokens; t0 += 8) {
        const auto nt = static_cast<int>(std::min<std::int64_t>(8, g.n_tokens - t0));
        tiles[static_cast<std::size_t>(nt - 1)](g, r0, t0);
      }
    }
  }
  for (std::int64_t r = whole; r < g.rows; ++r)
    for (std::int64_t t = 0; t < g.n_tokens; ++t)
      q8_0_row_exact(g, r, t);
}

void gemm_q8_0_panels(const gemm_args& g) noexcept {
  if (g.n_tokens == 1) {
    const std::int64_t np = g.rows / panel_rows;
    std::int64_t p = 0;
    for (; p + 4 <= np; p += 4)
      q8_0_panel_decode<4>(g, p, 0);
    for (; p < np; ++p)
      q8_0_panel_decode<1>(g, p, 0);
    return;
  }
  drive_panels<q8_0_panel_tile, 8>(g);
}

}  // namespace

const kernel_table& avx512_kernels() noexcept {
  static const kernel_table table = [] {
    kernel_table k{};
    k.gemm[type_slot(tensor_type::f32)] = drive_tiles<f32_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::f16)] = drive_tiles<f16_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::bf16)] = drive_tiles<bf16_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::q8_0)] = gemm_q8_0_rows;
    k.gemm[type_slot(tensor_type::q4_0)] = drive_tiles<q4_0_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::q4_k)] = drive_tiles<q4_k_tile, 1, 4>;
    k.gemm[type_slot(tensor_type::q6_k)] = drive_tiles<q6_k_tile, 1, 4>;
    k.q8_0_panels = gemm_q8_0_panels;
    k.q4_k_panels = drive_panels<q4_k_panel_tile, 8>;
    k.f16_panels = gemm_f16_panels;
    return k;
  }();
  return table;
}

}  // namespace tessera::inference::detail
