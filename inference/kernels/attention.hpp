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
// The cache is F16 by default (as llama.cpp's): keys and values are rounded once when stored and
// every product is accumulated in f32. It can be q8_0 instead (llama.cpp's `-ctk q8_0 -ctv q8_0`):
// half the bytes a long context streams for every token, and half its memory. Keys are then q8_0
// panels (the q8_0 weight panel layout, positions as rows), scored against queries quantized to
// q8_0 with the VNNI panel kernel; values are q8_0 rows (GGUF's blocks), each block's scale folded
// into the softmax weight. Both need head_dim a multiple of 32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera::inference {

/// How a KV cache stores keys and values.
enum class kv_cache_type : std::uint8_t { f16, q8_0 };

[[nodiscard]] std::string_view to_string(kv_cache_type t) noexcept;
/// "f16" or "q8_0"; anything else: nullopt.
[[nodiscard]] std::optional<kv_cache_type> parse_kv_cache_type(std::string_view s) noexcept;
/// Whether a cache of this type can hold heads of head_dim (q8_0: a multiple of 32, at most 1024).
[[nodiscard]] bool kv_cache_supports(kv_cache_type t, std::int64_t head_dim) noexcept;
/// Bytes one position of one KV head takes, for keys and for values alike.
[[nodiscard]] std::size_t kv_position_bytes(kv_cache_type t, std::int64_t head_dim) noexcept;

/// Positions a key cache holds room for: n_ctx rounded up to a whole panel of 16.
[[nodiscard]] constexpr std::int64_t key_cache_positions(std::int64_t n_ctx) noexcept {
  return (n_ctx + 15) / 16 * 16;
}

/// Stores position `pos`'s key (head_dim f32, rounded to f16) in one KV head's key panels.
void store_key_f16(const float* k, std::int64_t head_dim, std::uint16_t* keys,
                   std::int64_t pos) noexcept;

/// Stores position `pos`'s key, and its value, in one KV head's cache of type t (f16: the key in
/// panels, the value row rounded; q8_0: both quantized).
void store_key(kv_cache_type t, const float* k, std::int64_t head_dim, void* keys,
               std::int64_t pos) noexcept;
void store_value(kv_cache_type t, const float* v, std::int64_t head_dim, void* values,
                 std::int64_t pos) noexcept;

/// Queries of one KV head. Query i sees positions [0, n_att[i]) (causal: each n_att >= 1); its
/// output is out[i][d] = sum_j softmax_j(scale * q_i . k_j) * v_j[d].
struct attention_block {
  const float* const* q = nullptr;    ///< n_q query vectors of head_dim f32
  float* const* out = nullptr;        ///< n_q outputs of head_dim f32
  const std::int64_t* n_att = nullptr;
  std::int64_t n_q = 0;
  kv_cache_type type = kv_cache_type::f16;
  const void* keys = nullptr;    ///< the head's key panels (store_key)
  const void* values = nullptr;  ///< the head's values, [position][head_dim] (store_value)
  std::int64_t head_dim = 0;
  float scale = 1.0f;
  float* scratch = nullptr;  ///< attention_scratch_floats(n_q, max n_att, head_dim) floats
};

/// Scratch one attend() call needs: a chunk of scores, the queries as the kernel takes them and each
/// query's running maximum and sums, for n_q queries (n_ctx no longer matters: one pass in chunks).
[[nodiscard]] std::size_t attention_scratch_floats(std::int64_t n_q, std::int64_t n_ctx,
                                                   std::int64_t head_dim) noexcept;

/// Runs one block with the active ISA's kernels (on the calling thread).
void attend(const attention_block& a) noexcept;

}  // namespace tessera::inference
