// Attention over the F16 KV cache, a block of queries at a time (issue 35).
//
// Keys are stored in panels of 16 positions (the f16 weight panel layout of gemm_kernels.hpp, with
// positions as rows and head_dim as columns), so the scores of a block of queries are one f16
// panel mat-mul: each key converted once for 8 queries, one FMA per 16 positions and query, no
// horizontal sums. Values stay position-major; the weighted sum loads each value row once for a
// group of queries. A block is the query heads of one KV head for up to a few consecutive tokens
// of one sequence (prefill and decode alike): every score and every output lane is summed in the
// same order whatever the block, so a token's attention is bit for bit the same in a prefill
// chunk, in a batch and alone.
//
// The cache is F16 (as llama.cpp's default): keys and values are rounded once when stored and every
// product is accumulated in f32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::inference {

/// Positions a key cache holds room for: n_ctx rounded up to a whole panel of 16.
[[nodiscard]] constexpr std::int64_t key_cache_positions(std::int64_t n_ctx) noexcept {
  return (n_ctx + 15) / 16 * 16;
}

/// Stores position `pos`'s key (head_dim f32, rounded to f16) in one KV head's key panels.
void store_key_f16(const float* k, std::int64_t head_dim, std::uint16_t* keys,
                   std::int64_t pos) noexcept;

/// Queries of one KV head. Query i sees positions [0, n_att[i]) (causal: each n_att >= 1); its
/// output is out[i][d] = sum_j softmax_j(scale * q_i . k_j) * v_j[d].
struct attention_block {
  const float* const* q = nullptr;    ///< n_q query vectors of head_dim f32
  float* const* out = nullptr;        ///< n_q outputs of head_dim f32
  const std::int64_t* n_att = nullptr;
  std::int64_t n_q = 0;
  const std::uint16_t* keys = nullptr;    ///< the head's key panels (store_key_f16)
  const std::uint16_t* values = nullptr;  ///< the head's values, [position][head_dim] f16
  std::int64_t head_dim = 0;
  float scale = 1.0f;
  float* scratch = nullptr;  ///< attention_scratch_floats(n_q, max n_att, head_dim) floats
};

/// Scratch one attend_f16() call needs (scores rounded to whole panels, and the gathered queries).
[[nodiscard]] std::size_t attention_scratch_floats(std::int64_t n_q, std::int64_t n_ctx,
                                                   std::int64_t head_dim) noexcept;

/// Runs one block with the active ISA's kernels (on the calling thread).
void attend_f16(const attention_block& a) noexcept;

}  // namespace tessera::inference
