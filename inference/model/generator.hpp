// A generation session over one context: prefill the prompt, then step token by token, with the
// sampler, stop conditions and streamed UTF-8 text (the tokenizer's stream_decoder).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"
#include "inference/model/model.hpp"
#include "inference/model/sampler.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::inference::model {

enum class stop_reason { none, end_of_generation, max_tokens, context_full, cancelled };
std::string_view to_string(stop_reason r) noexcept;

struct generation_stats {
  std::int64_t prompt_tokens = 0;
  std::int64_t generated_tokens = 0;
  double prefill_s = 0;
  double decode_s = 0;   ///< time of the steps after the first sampled token
  stop_reason stop = stop_reason::none;
  [[nodiscard]] double prefill_tok_per_s() const noexcept {
    return prefill_s > 0 ? static_cast<double>(prompt_tokens) / prefill_s : 0;
  }
  [[nodiscard]] double decode_tok_per_s() const noexcept {
    return decode_s > 0 && generated_tokens > 1
               ? static_cast<double>(generated_tokens - 1) / decode_s
               : 0;
  }
};

/// Receives each decoded text piece (complete UTF-8 only); return false to stop generating.
using text_callback = std::function<bool(std::string_view piece)>;

class generator {
 public:
  /// `tok` may be null when only token ids are needed (no text, no end-of-generation detection).
  generator(const model& m, context& ctx, const tokenizer::tokenizer* tok, const sampler_options& s);

  /// Evaluates `tokens` (appended after what the context holds) and keeps the last logits.
  result<void> prefill(std::span<const token_id> tokens);
  /// Samples the next token from the last logits, feeds it to the model, returns it. Errors:
  /// nothing prefilled yet, the context is full (errc::no_capacity).
  result<token_id> step();
  /// The logits the next step() samples from (n_vocab floats).
  [[nodiscard]] std::span<const float> logits() const noexcept { return logits_; }
  [[nodiscard]] const std::vector<token_id>& history() const noexcept { return history_; }

  /// prefill(prompt), then step() until EOS/EOT, `max_tokens`, a full context or the callback
  /// returning false. Streams text through `on_text` (may be empty). The end-of-generation token is
  /// not streamed. The last sampled token is not fed to the model (no wasted forward pass).
  result<generation_stats> generate(std::span<const token_id> prompt, std::int64_t max_tokens,
                                    const text_callback& on_text);

 private:
  const model* m_;
  context* ctx_;
  const tokenizer::tokenizer* tok_;
  sampler sampler_;
  std::vector<float> logits_;
  std::vector<float> work_;  // sampler input (it modifies the logits)
  std::vector<token_id> history_;
  std::uint64_t generated_ = 0;  // tokens drawn so far: the next one's index (its sampling seed)
  bool have_logits_ = false;
};

}  // namespace tessera::inference::model
