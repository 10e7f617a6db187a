// Internal: register-level helpers the AVX2 and AVX-512 kernel files share (the q8_0 row paths'
// lane reductions, transposes and scale loads). They use AVX2 instructions only and carry that
// target themselves, so they inline into the functions of either file.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define TESSERA_X86_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace tessera::inference::detail {

// Internal linkage, as gemm_tiles.hpp explains: each kernel file gets its own copy.
namespace {

// 8 rows' int32 lanes (one ymm per row) summed lane-wise: lane r of the result is row r's sum.
TESSERA_X86_INLINE __m256i sum_rows8(const __m256i (&p)[8]) {
  __m256i t[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j)
    t[j] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * j], p[2 * j + 1]),
                            _mm256_unpackhi_epi32(p[2 * j], p[2 * j + 1]));
  const __m256i u0 =
      _mm256_add_epi32(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));
  const __m256i u1 =
      _mm256_add_epi32(_mm256_unpacklo_epi64(t[2], t[3]), _mm256_unpackhi_epi64(t[2], t[3]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// 8 rows' block scales d (fp16), the first 2 bytes of each row's block (a gather is slower).
template <int I>
TESSERA_X86_INLINE __m128i insert_scale(__m128i v, const std::uint8_t* p) {
  std::uint16_t d;
  std::memcpy(&d, p, sizeof(d));
  return _mm_insert_epi16(v, d, I);
}
TESSERA_X86_INLINE __m128i scales8(const std::uint8_t* col, std::int64_t stride) {
  __m128i v = _mm_setzero_si128();
  v = insert_scale<0>(v, col);
  v = insert_scale<1>(v, col + stride);
  v = insert_scale<2>(v, col + 2 * stride);
  v = insert_scale<3>(v, col + 3 * stride);
  v = insert_scale<4>(v, col + 4 * stride);
  v = insert_scale<5>(v, col + 5 * stride);
  v = insert_scale<6>(v, col + 6 * stride);
  v = insert_scale<7>(v, col + 7 * stride);
  return v;
}

// 8 rows x 8 dwords (one ymm per row) transposed in place: r[k] then holds dword k of the 8
// rows, i.e. columns 4k..4k+3 of rows 0-7: one 32-byte half of a panel's 64-byte group k.
TESSERA_X86_INLINE void transpose8x8(__m256i (&r)[8]) {
  __m256i a[8], b[8];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    a[2 * j] = _mm256_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
    a[2 * j + 1] = _mm256_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
  }
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {
    b[4 * j + 0] = _mm256_unpacklo_epi64(a[4 * j + 0], a[4 * j + 2]);
    b[4 * j + 1] = _mm256_unpackhi_epi64(a[4 * j + 0], a[4 * j + 2]);
    b[4 * j + 2] = _mm256_unpacklo_epi64(a[4 * j + 1], a[4 * j + 3]);
    b[4 * j + 3] = _mm256_unpackhi_epi64(a[4 * j + 1], a[4 * j + 3]);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2x128_si256(b[k], b[4 + k], 0x20);
    r[k + 4] = _mm256_permute2x128_si256(b[k], b[4 + k], 0x31);
  }
}

// Sub-block j's 6-bit scales (s8) and mins (m8), one byte per row, from the 12 packed scale bytes
// of the rows stored k-major (S[k] holds byte k of every row): q4_k_unpack_scales (quant.hpp) for
// all the rows at once.
TESSERA_X86_INLINE void q4_k_scale_bytes(const __m128i (&S)[12], int j, __m128i& s8, __m128i& m8) {
  const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
  const auto top2 = [m3](__m128i v) {  // (v >> 6) << 4, per byte
    return _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(v, 6), m3), 4);
  };
  if (j < 4) {
    s8 = _mm_and_si128(S[j], m63);
    m8 = _mm_and_si128(S[j + 4], m63);
  } else {
    s8 = _mm_or_si128(_mm_and_si128(S[j + 4], m15), top2(S[j - 4]));
    m8 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(S[j + 4], 4), m15), top2(S[j]));
  }
}

}  // namespace

}  // namespace tessera::inference::detail
