// The forward passes of one engine round (continuous batching): every active stream adds its
// unit (a prefill chunk or its next token), and the units of one local model, or of one split
// group, run together in passes of at most max_batch_streams streams. Engine thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "actors/base/result.hpp"
#include "inference/kernels/thread_pool.hpp"
#include "mesh/serving/session.hpp"

namespace tessera::mesh::serving {

class round_passes {
 public:
  round_passes(std::uint32_t max_batch_streams, inference::thread_pool& pool)
      : max_batch_streams_(max_batch_streams), pool_(pool) {}

  /// Evaluates `tokens` for `s` on its local context or its group; the logits of the last one
  /// when asked. With batching the tokens join this round (run() evaluates them; they must stay
  /// valid until then: they point into s.history), else they are evaluated now. A group that
  /// fails is marked failed and the error returned (the stream ends "unavailable"; the client
  /// resumes it elsewhere once the plan moves on).
  [[nodiscard]] result<void> eval(session& s, std::span<const session::token_id> tokens,
                                  bool want_logits);

  struct failure {
    session* s;
    error why;
  };
  /// Runs the units eval() queued and empties the round.
  [[nodiscard]] std::vector<failure> run();

  /// Forward passes over local streams and groups, and the stream-units they carried (their
  /// ratio is the mean batch). Any thread.
  [[nodiscard]] std::uint64_t passes() const { return passes_.load(); }
  [[nodiscard]] std::uint64_t pass_streams() const { return pass_streams_.load(); }

 private:
  /// A stream's unit of this round, evaluated in one pass with the others of its model (local
  /// streams) or of its split group.
  struct unit {
    session* s;
    std::span<const session::token_id> tokens;  // into s->history: unchanged until the pass ran
    bool logits;
  };

  std::uint32_t max_batch_streams_;
  inference::thread_pool& pool_;
  std::vector<unit> round_;
  std::atomic<std::uint64_t> passes_{0}, pass_streams_{0};
};

}  // namespace tessera::mesh::serving
