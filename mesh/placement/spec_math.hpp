// The arithmetic of a model's shape that planning (placement.cpp) and the shape checks and
// tensor slices (shapes.cpp) share: head and KV-group sizes, which KV heads a range of query heads
// needs, and what a rank's share of a model costs in memory. Internal to mesh/placement.
#pragma once

#include <cstdint>
#include <utility>

#include "mesh/placement/placement.hpp"

namespace tessera::mesh::placement::detail {

using u128 = unsigned __int128;

inline std::uint64_t ceil_div(u128 a, u128 b) {
  return static_cast<std::uint64_t>((a + b - 1) / b);
}

inline std::uint32_t head_dim(const model_spec& s) {
  return s.dim / s.n_heads;
}
inline std::uint32_t kv_group(const model_spec& s) {
  return s.n_heads / s.n_kv_heads;
}
inline std::uint32_t ffn_units(const model_spec& s) {
  return (s.ffn_size + s.ffn_block - 1) / s.ffn_block;
}

// Tensor parallelism splits attn_output by columns at head boundaries: each boundary must fall on
// a quantization block, so head_dim must be a multiple of column_block.
inline bool tp_allowed(const model_spec& s) {
  return head_dim(s) % s.column_block == 0;
}

// KV heads a rank needs for query heads [hf, hl): consecutive query heads share a KV head
// (query head h uses KV head h / group), so the range is [hf / g, ceil(hl / g)). Two neighbouring
// ranks whose query heads straddle one KV group both hold that KV head (replicated).
inline std::pair<std::uint32_t, std::uint32_t> kv_range(const model_spec& s, std::uint32_t hf,
                                                        std::uint32_t hl) {
  const std::uint32_t g = kv_group(s);
  return {hf / g, (hl + g - 1) / g};
}

struct rank_cost {
  std::uint64_t per_layer = 0;  // weights + KV cache of one layer
  std::uint64_t extras = 0;     // embeddings / output share
};

inline rank_cost cost_of(const model_spec& s, std::uint32_t heads, std::uint32_t kv_heads,
                         std::uint32_t ffn_cols, std::uint32_t vocab_rows, bool first, bool last) {
  const u128 hd = head_dim(s);
  const u128 layer_params = u128{s.dim} * hd * (2 * u128{s.n_heads} + 2 * u128{s.n_kv_heads}) +
                            3 * u128{s.dim} * s.ffn_size;
  const u128 rank_params =
      u128{s.dim} * hd * (2 * u128{heads} + 2 * u128{kv_heads}) + 3 * u128{s.dim} * ffn_cols;
  rank_cost c;
  c.per_layer = ceil_div(u128{s.bytes_per_layer} * rank_params, layer_params) +
                ceil_div(u128{s.kv_bytes_per_token} * s.context_tokens * kv_heads,
                         u128{s.n_layers} * s.n_kv_heads);
  // Embedding rows are split like the output rows: a rank looks up the tokens whose rows it
  // holds and the stage all-reduces (every row is held once, so the sum is exact).
  if (first) c.extras += ceil_div(u128{s.bytes_embeddings} * vocab_rows, s.n_vocab);
  if (last && !(first && s.tied_embeddings)) {
    const std::uint64_t out = s.tied_embeddings ? s.bytes_embeddings : s.bytes_output;
    c.extras += ceil_div(u128{out} * vocab_rows, s.n_vocab);
  }
  return c;
}

}  // namespace tessera::mesh::placement::detail
