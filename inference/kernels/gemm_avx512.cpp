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
// The K-quants use the AVX2 kernels (avx2_kernels()); see docs/design/005-kernels.md.
// GCC 12's avx512fintrin.h initialises vectors from _mm512_undefined_*(), which -Wuninitialized
// reports once inlined here (a known false positive of the header, not of this code).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "inference/kernels/gemm_tiles.hpp"

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

TESSERA_AVX512_INLINE __m512 scale_pair(float lo, float hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(lo)),
                                             _mm256_castps_pd(_mm256_set1_ps(hi)), 1));
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
                                         std::int64_t i, __mmask16 mask, __m512 (&acc)[R][T]) {
    __m512 xv[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) xv[t] = _mm512_maskz_loadu_ps(mask, x[t] + i);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
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
    std::int64_t i = 0;
    for (; i + 16 <= g.cols; i += 16) step(w, x, i, 0xFFFF, acc);
    // The last, partial step uses masked loads: no scalar tail.
    if (i < g.cols) step(w, x, i, static_cast<__mmask16>((1u << (g.cols - i)) - 1u), acc);
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

// ---- q8_0 --------------------------------------------------------------------------------------

template <int R, int T>
struct q8_0_tile {
  // Blocks b and b + 1 (or only b when `single`) of every row and token of the tile.
  TESSERA_AVX512_INLINE static void step(const block_q8_0* const* w, const block_q8_0* const* x,
                                         std::int64_t b, bool single, __m512 (&acc)[R][T]) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i xu[T];
    __m512 dx[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      xu[t] = _mm512_xor_si512(pair512(x[t][b].qs, single ? nullptr : x[t][b + 1].qs), bias);
      dx[t] = scale_pair(half(x[t][b].d), single ? 0.0f : half(x[t][b + 1].d));
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i wq = pair512(w[r][b].qs, single ? nullptr : w[r][b + 1].qs);
      const __m512i neg_sum = _mm512_sub_epi32(
          _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, wq));
      const __m512 dw = scale_pair(half(w[r][b].d), single ? 0.0f : half(w[r][b + 1].d));
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512i p = _mm512_dpbusd_epi32(neg_sum, xu[t], wq);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx[t]), acc[r][t]);
      }
    }
  }

  TESSERA_AVX512 static void run(const gemm_args& g, std::int64_t r0, std::int64_t t0) noexcept {
    const block_q8_0* w[R];
    const block_q8_0* x[T];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const block_q8_0*>(g.w + (r0 + r) * g.w_stride);
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const block_q8_0*>(g.x + (t0 + t) * g.x_stride);
    __m512 acc[R][T];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    const std::int64_t nb = g.cols / qk8_0;
    std::int64_t b = 0;
    for (; b + 2 <= nb; b += 2) step(w, x, b, false, acc);
    if (b < nb) step(w, x, b, true, acc);
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.y_stride + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

// ---- q4_0 --------------------------------------------------------------------------------------

TESSERA_AVX512_INLINE __m256i q4_0_levels(const block_q4_0& blk) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

template <int R, int T>
struct q4_0_tile {
  TESSERA_AVX512_INLINE static void step(const block_q4_0* const* w, const block_q8_0* const* x,
                                         std::int64_t b, bool single, __m512 (&acc)[R][T]) {
    const __m512i eights = _mm512_set1_epi8(8);
    __m512i xs[T];
    __m512i neg8[T];
    __m512 dx[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      xs[t] = pair512(x[t][b].qs, single ? nullptr : x[t][b + 1].qs);
      neg8[t] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), eights, xs[t]));
      dx[t] = scale_pair(half(x[t][b].d), single ? 0.0f : half(x[t][b + 1].d));
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256i hi = single ? _mm256_setzero_si256() : q4_0_levels(w[r][b + 1]);
      const __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(q4_0_levels(w[r][b])), hi, 1);
      const __m512 dw = scale_pair(half(w[r][b].d), single ? 0.0f : half(w[r][b + 1].d));
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
    std::int64_t b = 0;
    for (; b + 2 <= nb; b += 2) step(w, x, b, false, acc);
    if (b < nb) step(w, x, b, true, acc);
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.y_stride + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
  }
};

}  // namespace

const kernel_table& avx512_kernels() noexcept {
  static const kernel_table table = [] {
    kernel_table k = avx2_kernels();  // K-quants: the AVX2 kernels (a superset CPU runs them)
    k.gemm[type_slot(tensor_type::f32)] = drive_tiles<f32_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::f16)] = drive_tiles<f16_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::bf16)] = drive_tiles<bf16_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::q8_0)] = drive_tiles<q8_0_tile, 4, 4>;
    k.gemm[type_slot(tensor_type::q4_0)] = drive_tiles<q4_0_tile, 4, 4>;
    return k;
  }();
  return table;
}

}  // namespace tessera::inference::detail
