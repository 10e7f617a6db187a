#include "inference/kernels/attention.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "inference/kernels/cpu.hpp"
#include "inference/kernels/gemm_kernels.hpp"
#include "inference/kernels/ops.hpp"
#include "inference/kernels/simd_exp.hpp"
#include "inference/kernels/quant.hpp"

// GCC 12's avx512fintrin.h initialises vectors from _mm512_undefined_*() (see gemm_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tessera::inference {

namespace {

// Key blocks a q8_0 cache's store quantizes on the stack: head_dim up to 1024.
constexpr std::int64_t max_q8_0_key_blocks = 32;

// Positions per chunk: whole key panels (a multiple of 16); the chunk's scores of a block's queries
// stay in L1, and so do its values (16 KiB for head_dim 128 in f16) for the head's later lanes.
constexpr std::int64_t attention_chunk = 64;

// One pass over the cache, a chunk of positions at a time (flash attention): the chunk's scores,
// its softmax numerators against the running maximum, and the values weighted by them, so the
// keys and values stream in while the exps and FMAs of the chunk before run, and the scores of a
// long context never leave L1. When a chunk raises a query's maximum, what it has summed so far
// (its outputs and its sum) is scaled by e^(old - new) first. The outputs are divided by the sum
// at the end. Chunks start at fixed positions (multiples of attention_chunk), so a query's result
// depends on its own n_att only, never on the block around it.

// Scales a query's n >= 1 scores in place and returns their maximum.
__attribute__((target("avx2,fma"))) float scale_and_max_avx2(float* x, std::int64_t n,
                                                             float scale) noexcept {
  // (n may be below 8: the lanes then stay at the floor and the scalar loop finds the maximum.)
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 vmax = _mm256_set1_ps(-3.4e38f);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
    _mm256_storeu_ps(x + i, v);
    vmax = _mm256_max_ps(vmax, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float mx = lanes[0];
  for (int k = 1; k < 8; ++k) mx = std::max(mx, lanes[k]);
  for (; i < n; ++i) mx = std::max(mx, x[i] *= scale);
  return mx;
}

__attribute__((target("avx512f,avx2,fma"))) float scale_and_max_avx512(float* x, std::int64_t n,
                                                                      float scale) noexcept {
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(-3.4e38f);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
    _mm512_storeu_ps(x + i, v);
    vmax = _mm512_max_ps(vmax, v);
  }
  float mx = _mm512_reduce_max_ps(vmax);
  for (; i < n; ++i) mx = std::max(mx, x[i] *= scale);
  return mx;
}

float scale_and_max_scalar(float* x, std::int64_t n, float scale) noexcept {
  float mx = -3.4e38f;
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i] *= scale);
  return mx;
}

// A query's softmax numerators over the n scores at x (positions j0 ... j0 + n - 1 of the
// query's `total`; j0 a multiple of 16), in place, and their running sum: positions in whole
// groups of 8 (16 on AVX-512) below `total` go to the float lanes 0-7 (0-15) of `sum`, the rest
// (the last total % 8, or % 16) to lane 16, so the sum's order depends only on the query and the
// ISA, never on the chunks or the block.
__attribute__((target("avx2,fma"))) void numerators_avx2(float* x, std::int64_t j0,
                                                          std::int64_t n, std::int64_t total,
                                                          float mx, float* sum) noexcept {
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 lanes = _mm256_loadu_ps(sum);
  std::int64_t k = 0;
  for (; k + 8 <= n && j0 + k + 8 <= total; k += 8) {
    const __m256 e = detail::exp256(_mm256_sub_ps(_mm256_loadu_ps(x + k), vm));
    _mm256_storeu_ps(x + k, e);
    lanes = _mm256_add_ps(lanes, e);
  }
  _mm256_storeu_ps(sum, lanes);
  for (; k < n; ++k) sum[16] += (x[k] = std::exp(x[k] - mx));
}

__attribute__((target("avx512f,avx2,fma"))) void numerators_avx512(float* x, std::int64_t j0,
                                                                    std::int64_t n,
                                                                    std::int64_t total, float mx,
                                                                    float* sum) noexcept {
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 lanes = _mm512_loadu_ps(sum);
  std::int64_t k = 0;
  for (; k + 16 <= n && j0 + k + 16 <= total; k += 16) {
    const __m512 e = detail::exp512(_mm512_sub_ps(_mm512_loadu_ps(x + k), vm));
    _mm512_storeu_ps(x + k, e);
    lanes = _mm512_add_ps(lanes, e);
  }
  _mm512_storeu_ps(sum, lanes);
  for (; k < n; ++k) sum[16] += (x[k] = std::exp(x[k] - mx));
}

void numerators_scalar(float* x, std::int64_t n, float mx, float* sum) noexcept {
  for (std::int64_t k = 0; k < n; ++k) sum[16] += (x[k] = std::exp(x[k] - mx));
}

// A query's running state in the scratch: its maximum so far, then its 17 partial sums.
constexpr std::int64_t query_state_floats = 18;
constexpr int state_sums = 17;

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

// The weighted sum of values at positions [j0, j1) for a group of G queries, added to what out
// holds (j0 > 0) or from zero; p[i] holds query i's weights of the chunk (p[i][j - j0] for position
// j). Each value row is loaded and converted once for the group. Lane d of query i adds
// p * v[j][d] for j = j0, j0 + 1, ... in order with one FMA each, whatever the group or the ISA; a
// query past its own n_att skips the rest (a zero weight would still turn a -0 sum into +0). Below
// the shortest query's n_att every query takes every position, without a test (decode: all of them).
//
// The rows: f16 (converted), or q8_0 (hd / 32 blocks of GGUF's block_q8_0 per position, lane d
// being scale[j][d / 32] * level[j][d]: the scale goes on the value, once per position, rather
// than on the weight, once per position and query, because the FMA units bound this kernel).
#define TESSERA_ATT512 __attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) inline
#define TESSERA_ATT256 __attribute__((target("avx2,fma,f16c"), always_inline)) inline

struct f16_rows {
  // Position j's lanes [d0, d0 + 64) (AVX-512) or [d0, d0 + 32) (AVX2) as 4 vectors.
  TESSERA_ATT512 static void load(const void* v, std::int64_t hd, std::int64_t j, std::int64_t d0,
                                  __m512 (&vv)[4]) noexcept {
    const std::uint16_t* row = static_cast<const std::uint16_t*>(v) + j * hd + d0;
    // Decode reads a long context's values once, from memory: prefetched ahead (into L2) as the
    // weight streams are.
    if (d0 == 0) {
      __builtin_prefetch(row + 4096, 0, 1);
      __builtin_prefetch(row + 4096 + 32, 0, 1);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      vv[k] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * k)));
  }
  TESSERA_ATT256 static void load(const void* v, std::int64_t hd, std::int64_t j, std::int64_t d0,
                                  __m256 (&vv)[4]) noexcept {
    const std::uint16_t* row = static_cast<const std::uint16_t*>(v) + j * hd + d0;
    for (int k = 0; k < 4; ++k)
      vv[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8 * k)));
  }
};

struct q8_rows {
  TESSERA_ATT512 static void load(const void* v, std::int64_t hd, std::int64_t j, std::int64_t d0,
                                  __m512 (&vv)[4]) noexcept {
    const std::size_t rb = static_cast<std::size_t>(hd / qk8_0) * sizeof(block_q8_0);
    const auto* row =
        reinterpret_cast<const block_q8_0*>(static_cast<const std::uint8_t*>(v) + j * rb) +
        d0 / qk8_0;
    if (d0 == 0) __builtin_prefetch(reinterpret_cast<const std::uint8_t*>(row) + 8192, 0, 1);
#pragma GCC unroll 2
    for (int b = 0; b < 2; ++b) {
      const __m512 scale = _mm512_set1_ps(_cvtsh_ss(row[b].d));
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h)
        vv[2 * b + h] = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                                 reinterpret_cast<const __m128i*>(row[b].qs + 16 * h)))));
    }
  }
  TESSERA_ATT256 static void load(const void* v, std::int64_t hd, std::int64_t j, std::int64_t d0,
                                  __m256 (&vv)[4]) noexcept {
    const std::size_t rb = static_cast<std::size_t>(hd / qk8_0) * sizeof(block_q8_0);
    const auto* blk =
        reinterpret_cast<const block_q8_0*>(static_cast<const std::uint8_t*>(v) + j * rb) +
        d0 / qk8_0;
    const __m256 scale = _mm256_set1_ps(_cvtsh_ss(blk->d));
    for (int k = 0; k < 4; ++k)
      vv[k] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->qs + 8 * k)))));
  }
};

// Positions [ja, jb) into acc; Check: some queries may end inside (past the shortest n_att).
template <class Rows, int G, bool Check>
TESSERA_ATT512 void accumulate(const float* const* p, const std::int64_t* n_att, const void* v,
                               std::int64_t hd, std::int64_t d0, std::int64_t j0, std::int64_t ja,
                               std::int64_t jb, __m512 (&acc)[G][4]) noexcept {
  for (std::int64_t j = ja; j < jb; ++j) {
    __m512 vv[4];
    Rows::load(v, hd, j, d0, vv);
#pragma GCC unroll 8
    for (int i = 0; i < G; ++i) {
      if (Check && j >= n_att[i]) continue;
      const __m512 w = _mm512_set1_ps(p[i][j - j0]);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[i][k] = _mm512_fmadd_ps(w, vv[k], acc[i][k]);
    }
  }
}

template <class Rows, int G, bool Check>
TESSERA_ATT256 void accumulate256(const float* const* p, const std::int64_t* n_att, const void* v,
                                  std::int64_t hd, std::int64_t d0, std::int64_t j0,
                                  std::int64_t ja, std::int64_t jb,
                                  __m256 (&acc)[G][4]) noexcept {
  for (std::int64_t j = ja; j < jb; ++j) {
    __m256 vv[4];
    Rows::load(v, hd, j, d0, vv);
    for (int i = 0; i < G; ++i) {
      if (Check && j >= n_att[i]) continue;
      const __m256 w = _mm256_set1_ps(p[i][j - j0]);
      for (int k = 0; k < 4; ++k) acc[i][k] = _mm256_fmadd_ps(w, vv[k], acc[i][k]);
    }
  }
}

template <class Rows, int G>
__attribute__((target("avx512f,avx2,fma,f16c"))) void values_avx512(
    const float* const* p, const std::int64_t* n_att, const void* v, std::int64_t hd,
    std::int64_t d0, std::int64_t j0, std::int64_t j1, float* const* out) noexcept {
  __m512 acc[G][4];
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 4; ++k)
      acc[i][k] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out[i] + d0 + 16 * k);
  auto [lo, hi] = att_range(n_att, G);
  hi = std::min(hi, j1);
  const std::int64_t all = std::max(j0, std::min(lo, hi));
  accumulate<Rows, G, false>(p, n_att, v, hd, d0, j0, j0, all, acc);
  accumulate<Rows, G, true>(p, n_att, v, hd, d0, j0, all, hi, acc);
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(out[i] + d0 + 16 * k, acc[i][k]);
}

template <class Rows, int G>
__attribute__((target("avx2,fma,f16c"))) void values_avx2(const float* const* p,
                                                          const std::int64_t* n_att, const void* v,
                                                          std::int64_t hd, std::int64_t d0,
                                                          std::int64_t j0, std::int64_t j1,
                                                          float* const* out) noexcept {
  __m256 acc[G][4];
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 4; ++k)
      acc[i][k] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out[i] + d0 + 8 * k);
  auto [lo, hi] = att_range(n_att, G);
  hi = std::min(hi, j1);
  const std::int64_t all = std::max(j0, std::min(lo, hi));
  accumulate256<Rows, G, false>(p, n_att, v, hd, d0, j0, j0, all, acc);
  accumulate256<Rows, G, true>(p, n_att, v, hd, d0, j0, all, hi, acc);
  for (int i = 0; i < G; ++i)
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out[i] + d0 + 8 * k, acc[i][k]);
}

// Lanes the SIMD chunks do not cover (head_dim not a multiple of the chunk): the same sum, one
// lane at a time (std::fma: the same rounding as the vector FMA).
void values_scalar(const float* const* p, const std::int64_t* n_att, int nq, const std::uint16_t* v,
                   std::int64_t hd, std::int64_t d0, std::int64_t d1, std::int64_t j0,
                   std::int64_t j1, float* const* out) noexcept {
  for (int i = 0; i < nq; ++i) {
    const std::int64_t end = std::min(j1, n_att[i]);
    for (std::int64_t d = d0; d < d1; ++d) {
      float sum = j0 == 0 ? 0.0f : out[i][d];
      for (std::int64_t j = j0; j < end; ++j)
        sum = std::fma(p[i][j - j0], fp16_to_fp32(v[j * hd + d]), sum);
      out[i][d] = sum;
    }
  }
}


void values_q8_scalar(const float* const* p, const std::int64_t* n_att, int nq,
                      const std::uint8_t* v, std::int64_t hd, std::int64_t d0, std::int64_t d1,
                      std::int64_t j0, std::int64_t j1, float* const* out) noexcept {
  const std::size_t rb = static_cast<std::size_t>(hd / qk8_0) * sizeof(block_q8_0);
  for (int i = 0; i < nq; ++i) {
    const std::int64_t end = std::min(j1, n_att[i]);
    for (std::int64_t d = d0; d < d1; ++d) {
      float sum = j0 == 0 ? 0.0f : out[i][d];
      for (std::int64_t j = j0; j < end; ++j) {
        const auto& blk = reinterpret_cast<const block_q8_0*>(v + static_cast<std::size_t>(j) * rb)[d / qk8_0];
        sum = std::fma(p[i][j - j0], fp16_to_fp32(blk.d) * static_cast<float>(blk.qs[d % qk8_0]), sum);
      }
      out[i][d] = sum;
    }
  }
}

// The block's value sums over [j0, j1) for a group of nq <= 4 queries, for the cache's type and
// the active ISA (the lanes of head_dim the SIMD chunks leave, one at a time).
template <class Rows>
void values_simd(isa level, const float* const* p, const std::int64_t* n_att, int nq,
                 const void* values, std::int64_t hd, std::int64_t j0, std::int64_t j1,
                 float* const* out, std::int64_t& d) noexcept {
  using fn = void (*)(const float* const*, const std::int64_t*, const void*, std::int64_t,
                      std::int64_t, std::int64_t, std::int64_t, float* const*) noexcept;
  static constexpr fn wide[4] = {&values_avx512<Rows, 1>, &values_avx512<Rows, 2>,
                                 &values_avx512<Rows, 3>, &values_avx512<Rows, 4>};
  static constexpr fn narrow[2] = {&values_avx2<Rows, 1>, &values_avx2<Rows, 2>};
  if (level == isa::avx512) {
    for (; d + 64 <= hd; d += 64) wide[nq - 1](p, n_att, values, hd, d, j0, j1, out);
  } else if (level == isa::avx2) {
    for (; d + 32 <= hd; d += 32) {
      narrow[std::min(nq, 2) - 1](p, n_att, values, hd, d, j0, j1, out);
      if (nq > 2) narrow[nq - 3](p + 2, n_att + 2, values, hd, d, j0, j1, out + 2);
    }
  }
}

void values_chunk(kv_cache_type type, isa level, const float* const* p, const std::int64_t* n_att,
                  int nq, const void* values, std::int64_t hd, std::int64_t j0, std::int64_t j1,
                  float* const* out) noexcept {
  std::int64_t d = 0;
  if (type == kv_cache_type::f16) {
    values_simd<f16_rows>(level, p, n_att, nq, values, hd, j0, j1, out, d);
    if (d < hd)
      values_scalar(p, n_att, nq, static_cast<const std::uint16_t*>(values), hd, d, hd, j0, j1, out);
  } else {
    values_simd<q8_rows>(level, p, n_att, nq, values, hd, j0, j1, out, d);
    if (d < hd)
      values_q8_scalar(p, n_att, nq, static_cast<const std::uint8_t*>(values), hd, d, hd, j0, j1, out);
  }
}

// The activations the key panels are scored against: the queries as f32 rows (f16 keys) or
// quantized as q8_0 weights' activations are (q8_0 keys), into qbuf's room, which they fit.
// Returns the row stride.
std::size_t prepare_queries(const attention_block& a, isa level, float* qbuf) noexcept {
  const std::int64_t hd = a.head_dim;
  if (a.type == kv_cache_type::f16) {
    for (std::int64_t i = 0; i < a.n_q; ++i)
      std::memcpy(qbuf + i * hd, a.q[i], static_cast<std::size_t>(hd) * sizeof(float));
    return static_cast<std::size_t>(hd) * sizeof(float);
  }
  auto* xq = reinterpret_cast<std::uint8_t*>(qbuf);
  const std::size_t stride = detail::activation_row_bytes(detail::act_format::q8_0_panel, hd);
  for (std::int64_t i = 0; i < a.n_q; ++i)
    detail::quantize_activations(detail::act_format::q8_0_panel, a.q[i], xq + i * stride, hd,
                                 level);
  return stride;
}

// Every query's scores against the keys of positions [j0, j0 + rows) (j0 and rows whole panels),
// into scores[i * attention_chunk + j - j0]: one f16 or q8_0 panel mat-mul.
void chunk_scores(const attention_block& a, isa level, const float* qbuf, std::size_t q_stride,
                  std::int64_t j0, std::int64_t rows, float* scores) noexcept {
  const std::size_t pb = kv_position_bytes(a.type, a.head_dim);
  const detail::gemm_args g{static_cast<const std::uint8_t*>(a.keys) + static_cast<std::size_t>(j0) * pb,
                            pb,
                            rows,
                            a.head_dim,
                            reinterpret_cast<const std::uint8_t*>(qbuf),
                            q_stride,
                            a.n_q,
                            scores,
                            attention_chunk};
  const auto& k = detail::kernels_for(level);
  (a.type == kv_cache_type::f16 ? k.f16_panels : k.q8_0_panels)(g);
}

// Query i's chunk [j0, j0 + n) of scores: scaled; its running maximum raised to the chunk's if
// that is higher, with what the query summed so far (outputs and sums) scaled down to match; then
// the numerators against it, in place.
void softmax_chunk(float* s, std::int64_t j0, std::int64_t n, std::int64_t total, float scale,
                   isa level, float* state, float* out, std::int64_t hd) noexcept {
  float& mx = state[0];
  float* sum = state + 1;
  const float cm = level == isa::avx512 ? scale_and_max_avx512(s, n, scale)
                   : level == isa::avx2 ? scale_and_max_avx2(s, n, scale)
                                        : scale_and_max_scalar(s, n, scale);
  if (cm > mx) {
    if (j0 > 0) {
      const float f = std::exp(mx - cm);
      for (int k = 0; k < state_sums; ++k) sum[k] *= f;
      for (std::int64_t d = 0; d < hd; ++d) out[d] *= f;
    }
    mx = cm;
  }
  if (level == isa::avx512) {
    numerators_avx512(s, j0, n, total, mx, sum);
  } else if (level == isa::avx2) {
    numerators_avx2(s, j0, n, total, mx, sum);
  } else {
    numerators_scalar(s, n, mx, sum);
  }
}

}  // namespace

void store_key_f16(const float* k, std::int64_t head_dim, std::uint16_t* keys,
                   std::int64_t pos) noexcept {
  std::uint16_t* panel = keys + (pos / 16) * 16 * head_dim + pos % 16;
  for (std::int64_t d = 0; d < head_dim; ++d) panel[d * 16] = fp32_to_fp16(k[d]);
}

std::string_view to_string(kv_cache_type t) noexcept {
  return t == kv_cache_type::q8_0 ? "q8_0" : "f16";
}

std::optional<kv_cache_type> parse_kv_cache_type(std::string_view s) noexcept {
  if (s == "f16") return kv_cache_type::f16;
  if (s == "q8_0") return kv_cache_type::q8_0;
  return std::nullopt;
}

bool kv_cache_supports(kv_cache_type t, std::int64_t head_dim) noexcept {
  return head_dim > 0 && (t == kv_cache_type::f16 ||
                          (head_dim % qk8_0 == 0 && head_dim <= max_q8_0_key_blocks * qk8_0));
}

std::size_t kv_position_bytes(kv_cache_type t, std::int64_t head_dim) noexcept {
  if (t == kv_cache_type::f16) return static_cast<std::size_t>(head_dim) * sizeof(std::uint16_t);
  return static_cast<std::size_t>(head_dim / qk8_0) * sizeof(block_q8_0);
}

void store_key(kv_cache_type t, const float* k, std::int64_t head_dim, void* keys,
               std::int64_t pos) noexcept {
  if (t == kv_cache_type::f16) {
    store_key_f16(k, head_dim, static_cast<std::uint16_t*>(keys), pos);
    return;
  }
  // Quantized as a q8_0 weight row, then laid into its panel (gemm_kernels.hpp): block b's level
  // for column 4 g + c at b * 512 + 64 g + 4 i + c (i = the position in its panel), plus 128.
  const std::int64_t nb = head_dim / qk8_0;
  block_q8_0 row[max_q8_0_key_blocks];
  quantize_row_q8_0(k, row, head_dim);
  auto* panel = static_cast<std::uint8_t*>(keys) +
                static_cast<std::size_t>(pos / detail::panel_rows) * detail::q8_0_panel_bytes(head_dim);
  const std::int64_t i = pos % detail::panel_rows;
  auto* scales = reinterpret_cast<std::uint16_t*>(panel + nb * 512);
  for (std::int64_t b = 0; b < nb; ++b) {
    for (int g = 0; g < 8; ++g)
      for (int c = 0; c < 4; ++c)
        panel[b * 512 + 64 * g + 4 * i + c] =
            static_cast<std::uint8_t>(row[b].qs[4 * g + c] + 128);
    scales[b * detail::panel_rows + i] = row[b].d;
  }
}

void store_value(kv_cache_type t, const float* v, std::int64_t head_dim, void* values,
                 std::int64_t pos) noexcept {
  auto* at = static_cast<std::uint8_t*>(values) +
             static_cast<std::size_t>(pos) * kv_position_bytes(t, head_dim);
  if (t == kv_cache_type::f16) {
    fp32_to_fp16_row(v, reinterpret_cast<std::uint16_t*>(at), head_dim);
  } else {
    quantize_row_q8_0(v, at, head_dim);
  }
}

std::size_t attention_scratch_floats(std::int64_t n_q, std::int64_t /*n_ctx*/,
                                     std::int64_t head_dim) noexcept {
  return static_cast<std::size_t>(n_q) *
         static_cast<std::size_t>(attention_chunk + head_dim + query_state_floats);
}

void attend(const attention_block& a) noexcept {
  if (a.n_q <= 0) return;
  const std::int64_t hd = a.head_dim, nq_all = a.n_q;
  std::int64_t n_max = 0;
  for (std::int64_t i = 0; i < nq_all; ++i) n_max = std::max(n_max, a.n_att[i]);
  const isa level = active_isa();
  // Scratch: the chunk's scores, the queries (as the kernel takes them), each query's state.
  float* scores = a.scratch;
  float* qbuf = scores + nq_all * attention_chunk;
  float* state = qbuf + nq_all * hd;
  const std::size_t q_stride = prepare_queries(a, level, qbuf);
  for (std::int64_t i = 0; i < nq_all; ++i) {
    state[i * query_state_floats] = -3.4e38f;
    std::fill_n(state + i * query_state_floats + 1, query_state_floats - 1, 0.0f);
  }
  // The panel kernels are not instrumented in ASan builds: their ranges are checked here.
  const std::size_t pb = kv_position_bytes(a.type, hd);
  detail::check_rows_addressable(a.keys, key_cache_positions(n_max), pb, pb, "attention keys");
  for (std::int64_t j0 = 0; j0 < n_max; j0 += attention_chunk) {
    const std::int64_t j1 = std::min(n_max, j0 + attention_chunk);
    chunk_scores(a, level, qbuf, q_stride, j0, key_cache_positions(j1 - j0), scores);
    for (std::int64_t i0 = 0; i0 < nq_all; i0 += 4) {
      const int nq = static_cast<int>(std::min<std::int64_t>(4, nq_all - i0));
      const std::int64_t* n_att = a.n_att + i0;
      float* const* out = a.out + i0;
      const float* p[4];
      for (int i = 0; i < nq; ++i) {
        float* s = scores + (i0 + i) * attention_chunk;
        p[i] = s;
        const std::int64_t end = std::min(j1, n_att[i]);
        if (end > j0)
          softmax_chunk(s, j0, end - j0, n_att[i], a.scale, level,
                        state + (i0 + i) * query_state_floats, out[i], hd);
      }
      values_chunk(a.type, level, p, n_att, nq, a.values, hd, j0, j1, out);
    }
  }
  // Divided by each query's sum.
  for (std::int64_t i = 0; i < nq_all; ++i) {
    const float* sum = state + i * query_state_floats + 1;
    double total = 0;
    for (int k = 0; k < state_sums; ++k) total += sum[k];
    const auto inv = static_cast<float>(1.0 / total);
    for (std::int64_t d = 0; d < hd; ++d) a.out[i][d] *= inv;
  }
}

}  // namespace tessera::inference
