// Choosing the next token from logits: greedy, or a seeded random draw after the usual filters.
//
// Order (llama.cpp's default chain): repetition, frequency and presence penalties over the last
// `repeat_window` tokens ->
// top-k -> top-p (nucleus) -> min-p -> temperature -> draw. temperature <= 0 is greedy (argmax
// after the repetition penalty). The random generator is xoshiro256** seeded by splitmix64(seed):
// the same seed and the same logits give the same tokens on every machine.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::inference::model {

struct sampler_options {
  float temperature = 0.8f;     ///< <= 0: greedy
  std::int32_t top_k = 40;      ///< <= 0: off
  float top_p = 0.95f;          ///< >= 1: off
  float min_p = 0.05f;          ///< <= 0: off (keep tokens with p >= min_p * p_max)
  float repeat_penalty = 1.0f;  ///< 1: off; > 1 discourages recent tokens (llama.cpp's rule)
  std::int32_t repeat_window = 64;
  /// OpenAI's penalties, as llama.cpp applies them over the same window: a token seen c > 0 times
  /// there loses c * frequency_penalty + presence_penalty from its logit. 0: off.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::uint64_t seed = 0;

  /// Greedy decoding, no penalty.
  [[nodiscard]] static sampler_options greedy() noexcept {
    sampler_options o;
    o.temperature = 0.0f;
    return o;
  }
};

/// The seed token `index` (0-based, generated tokens only) of a stream with `seed` is drawn with.
/// The sampler is reseeded with it before every token, by the serving peers and by `tessera run`
/// alike: a stream is then the same whichever peer draws which index (a resumed stream continues
/// the lost one) and the same as `tessera run --seed` with the same sampling settings.
[[nodiscard]] std::uint64_t index_seed(std::uint64_t seed, std::uint64_t index) noexcept;

/// Checks the ranges (temperature finite and <= 100, top_p/min_p in [0, 1], penalty > 0, window
/// in [0, 1 << 16], frequency/presence penalties in [-2, 2]); the error names the option.
result<void> validate(const sampler_options& o);

/// A token's log-probability under the model's distribution (the log-softmax of the raw logits:
/// before penalties, temperature and filters, as OpenAI reports them), and the `top` most probable
/// tokens with theirs (ties to the lower id).
struct token_logprobs {
  float chosen = 0.0f;
  std::vector<std::pair<std::int32_t, float>> top;
};
/// `top` is at most 20; `chosen` must be a token of `logits`.
[[nodiscard]] token_logprobs logprobs_of(std::span<const float> logits, std::int32_t chosen,
                                         int top);

class sampler {
 public:
  explicit sampler(const sampler_options& o);

  /// Picks a token from `logits` (n_vocab floats; modified: penalties and filters are applied in
  /// place). `history`: the tokens so far (the last repeat_window are penalised).
  std::int32_t sample(std::span<float> logits, std::span<const std::int32_t> history);
  /// sample() of the stream's token `index`: reseeds with index_seed(options().seed, index) first.
  std::int32_t sample_at(std::span<float> logits, std::span<const std::int32_t> history,
                         std::uint64_t index);

  [[nodiscard]] const sampler_options& options() const noexcept { return o_; }
  /// Restarts the random sequence from `seed`.
  void reseed(std::uint64_t seed) noexcept;
  /// A uniform double in [0, 1) from the generator (exposed for tests).
  double uniform() noexcept;

 private:
  std::uint64_t next() noexcept;

  sampler_options o_;
  std::uint64_t s_[4]{};
  struct cand {
    std::int32_t id;
    float logit;
  };
  std::vector<cand> cands_;  // reused between calls (no per-token allocation once grown)
  std::vector<double> probs_;
};

}  // namespace tessera::inference::model
