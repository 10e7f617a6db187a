// A model split over the ranks of a collectives::group, driven by rank 0: pipeline parallelism
// (rank r holds a layer range; hidden states flow 0 -> 1 -> ... -> n-1, logits come back to 0),
// tensor parallelism (every rank holds a slice of the heads and FFN columns of every layer; the
// partial outputs are all-reduced twice per layer, in rank order, so every rank holds the same
// bits), or both (hybrid: pipeline stages, each a team of tensor-parallel ranks that all-reduce
// among themselves; the first rank of a stage — its leader — sends the stage's hidden states to
// every rank of the next stage, the last stage's leader sends the logits to rank 0).
//
// Rank 0 owns the sequences: open / eval / close are commands it sends to every other rank (a fixed
// size float vector over the group's send/recv), then it does its own part. The other ranks sit in
// follow() executing commands until rank 0 sends shutdown or the group fails. Rank 0 sends a ping
// when idle (ping()), so followers can bound their waits: a silent rank 0 is a dead rank 0.
//
// Sequences: up to max_sequences at once, each a KV context on every rank; a command carries at
// most max_chunk tokens (longer prompts are evaluated in several commands). eval_batch runs several
// sequences' tokens in one forward pass on every rank (continuous batching: the ranks stream their
// weights once for all of them; one hidden-state message per stage, or one all-reduce per layer
// half, for the whole batch).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>

#include "actors/base/result.hpp"
#include "inference/collectives/group.hpp"
#include "inference/model/model.hpp"

namespace tessera::inference::sharded {

enum class layout : std::uint8_t { pipeline, tensor, hybrid };

inline constexpr std::uint32_t max_sequences = 64;
inline constexpr std::uint32_t max_chunk = 64;

/// One sequence's share of runner::eval_batch.
struct batch_request {
  std::uint32_t seq = 0;
  std::span<const model::token_id> tokens;  ///< at least one
  std::span<float> logits;                  ///< empty: none; else n_vocab floats (last token's)
};

class runner {
 public:
  /// `m` is this rank's shard (pipeline: layer range of stage = rank; tensor: head/FFN slice),
  /// `g` the group (rank() and size() say who is who). Both must outlive the runner.
  /// invalid_argument when the shard does not fit the layout (a pipeline rank 0 without the
  /// embedding, a last rank without the output, a tensor rank that is not a full-depth slice).
  [[nodiscard]] static result<std::unique_ptr<runner>> create(const model::model& m,
                                                              collectives::group& g, layout kind,
                                                              thread_pool* pool);
  /// Hybrid: `stage_of_rank[r]` is rank r's pipeline stage (0, then non-decreasing in steps of at
  /// most 1, rank 0 in stage 0). A stage's ranks hold the same layers; with more than one rank
  /// they hold tensor-parallel slices. The first stage's ranks need the embedding, exactly the
  /// last stage's the output layer.
  [[nodiscard]] static result<std::unique_ptr<runner>> create(
      const model::model& m, collectives::group& g, std::vector<std::uint32_t> stage_of_rank,
      thread_pool* pool);
  ~runner();
  runner(const runner&) = delete;
  /// The KV cache type of the sequences this rank opens from now on (f16 by default).
  void set_kv_cache(kv_cache_type t) noexcept { kv_cache_ = t; }
  runner& operator=(const runner&) = delete;

  // --- rank 0 ---
  /// Creates sequence `seq` (< max_sequences, not open) with room for `n_ctx` tokens on every rank.
  [[nodiscard]] result<void> open(std::uint32_t seq, std::int64_t n_ctx);
  /// Evaluates `tokens` (any number; sent in chunks of max_chunk) after what `seq` holds. With a
  /// non-empty `logits` (n_vocab floats) it receives the last token's logits.
  [[nodiscard]] result<void> eval(std::uint32_t seq, std::span<const model::token_id> tokens,
                                  std::span<float> logits);
  /// Evaluates several open sequences in one pass per rank: each request's tokens after what its
  /// sequence holds, the last token's logits where asked. At most max_chunk tokens in all, each
  /// sequence once. Errors before anything is sent: a sequence not open or repeated, a context
  /// that would overflow (no_capacity), too many tokens, a short logits buffer.
  [[nodiscard]] result<void> eval_batch(std::span<const batch_request> requests);
  [[nodiscard]] result<void> close(std::uint32_t seq);
  /// Tells the followers rank 0 is alive (call when idle, well within the group's timeout).
  [[nodiscard]] result<void> ping();
  /// Ends every follower's follow() with success.
  [[nodiscard]] result<void> shutdown();
  /// Positions held by `seq` (rank 0's view), -1 when not open.
  [[nodiscard]] std::int64_t pos(std::uint32_t seq) const;

  // --- ranks 1..n-1 ---
  /// Executes rank 0's commands until shutdown (ok) or an error (the group failed, rank 0 died,
  /// a command was malformed).
  [[nodiscard]] result<void> follow();

 private:
  runner(const model::model& m, collectives::group& g, std::vector<std::uint32_t> stages,
         thread_pool* pool);
  result<void> broadcast(const std::vector<float>& cmd);
  result<void> do_open(std::uint32_t seq, std::int64_t n_ctx);
  /// Every rank's part of eval_batch; `logits` (rank 0 only) per request, empty elsewhere.
  result<void> do_eval_batch(std::span<const std::uint32_t> seqs,
                             std::span<const std::uint32_t> counts,
                             std::span<const std::uint8_t> want,
                             std::span<const model::token_id> tokens,
                             std::span<const std::span<float>> logits);

  const model::model* m_;
  collectives::group* g_;
  thread_pool* pool_;
  kv_cache_type kv_cache_ = kv_cache_type::f16;
  std::vector<std::uint32_t> stage_of_;  // per rank
  std::uint32_t stage_ = 0, n_stages_ = 1;
  std::vector<std::uint32_t> team_;       // the ranks of our stage (team_[0] leads it)
  std::vector<std::uint32_t> next_team_;  // the ranks of the next stage (none for the last)
  std::uint32_t prev_leader_ = 0, last_leader_ = 0;
  model::reduce_fn reduce_;               // the stage's all-reduce (empty: a stage of one)
  std::map<std::uint32_t, std::unique_ptr<model::context>> seqs_;
  std::vector<float> hidden_, logits_;
  std::unique_ptr<model::workspace> ws_;  // eval_batch's scratch, sized for the longest context
};

}  // namespace tessera::inference::sharded
