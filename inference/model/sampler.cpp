#include "inference/model/sampler.hpp"

#include <algorithm>
#include <cmath>

namespace tessera::inference::model {

namespace {

std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

}  // namespace

result<void> validate(const sampler_options& o) {
  if (!std::isfinite(o.temperature) || o.temperature > 100.0f)
    return make_error(errc::invalid_argument, "sampler: temperature {} must be finite and <= 100",
                      o.temperature);
  if (!(o.top_p >= 0.0f && o.top_p <= 1.0f))
    return make_error(errc::invalid_argument, "sampler: top-p {} must be in [0, 1]", o.top_p);
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f))
    return make_error(errc::invalid_argument, "sampler: min-p {} must be in [0, 1]", o.min_p);
  if (!(o.repeat_penalty > 0.0f) || !std::isfinite(o.repeat_penalty))
    return make_error(errc::invalid_argument, "sampler: repeat penalty {} must be > 0",
                      o.repeat_penalty);
  for (auto [name, v] :
       {std::pair{"frequency", o.frequency_penalty}, std::pair{"presence", o.presence_penalty}})
    if (!(v >= -2.0f && v <= 2.0f))
      return make_error(errc::invalid_argument, "sampler: {} penalty {} must be in [-2, 2]", name,
                        v);
  if (o.repeat_window < 0 || o.repeat_window > (1 << 16))
    return make_error(errc::invalid_argument, "sampler: repeat window {} must be in [0, 65536]",
                      o.repeat_window);
  if (o.top_k < 0)
    return make_error(errc::invalid_argument, "sampler: top-k {} must be >= 0", o.top_k);
  return ok();
}

namespace {

// splitmix64's finaliser as a stateless mix (the same function as mesh's mix64: the serving
// protocol's per-index seeds were defined with it, so streams stay what they were).
constexpr std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t index_seed(std::uint64_t seed, std::uint64_t index) noexcept {
  return mix(seed ^ mix(index));
}

sampler::sampler(const sampler_options& o) : o_(o) { reseed(o.seed); }

std::int32_t sampler::sample_at(std::span<float> logits, std::span<const std::int32_t> history,
                                std::uint64_t index) {
  reseed(index_seed(o_.seed, index));
  return sample(logits, history);
}

void sampler::reseed(std::uint64_t seed) noexcept {
  std::uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

std::uint64_t sampler::next() noexcept {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double sampler::uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

token_logprobs logprobs_of(std::span<const float> logits, std::int32_t chosen, int top) {
  token_logprobs out;
  if (logits.empty()) return out;
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float l : logits)
    sum += std::exp(static_cast<double>(l - mx));
  const double log_z = static_cast<double>(mx) + std::log(sum);
  const auto lp = [&](std::int32_t id) {
    return static_cast<float>(static_cast<double>(logits[static_cast<std::size_t>(id)]) - log_z);
  };
  if (chosen >= 0 && static_cast<std::size_t>(chosen) < logits.size()) out.chosen = lp(chosen);
  const int k = std::clamp(top, 0, std::min(20, static_cast<int>(logits.size())));
  // The k largest by a bounded selection (k <= 20): ids in descending logit, ties to the lower id.
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(logits.size()); ++id) {
    const float l = logits[static_cast<std::size_t>(id)];
    if (static_cast<int>(out.top.size()) == k &&
        (k == 0 || !(l > logits[static_cast<std::size_t>(out.top.back().first)])))
      continue;
    auto at = std::find_if(out.top.begin(), out.top.end(), [&](const auto& e) {
      return l > logits[static_cast<std::size_t>(e.first)];
    });
    out.top.insert(at, {id, 0.0f});
    if (static_cast<int>(out.top.size()) > k) out.top.pop_back();
  }
  for (auto& [id, v] : out.top)
    v = lp(id);
  return out;
}

std::int32_t sampler::sample(std::span<float> logits, std::span<const std::int32_t> history) {
  const auto n = static_cast<std::int32_t>(logits.size());
  if (n == 0) return -1;

  // Penalties over the window (llama.cpp's), once per distinct token of it, knowing how often it
  // occurs there: repetition (a positive logit divided, a negative one multiplied), then
  // OpenAI's frequency (per occurrence) and presence (once) subtracted.
  const bool repeat = o_.repeat_penalty != 1.0f;
  const bool counted = o_.frequency_penalty != 0.0f || o_.presence_penalty != 0.0f;
  if ((repeat || counted) && o_.repeat_window > 0 && !history.empty()) {
    const std::size_t w =
        std::min<std::size_t>(history.size(), static_cast<std::size_t>(o_.repeat_window));
    const auto recent = history.subspan(history.size() - w);
    for (std::size_t i = 0; i < recent.size(); ++i) {
      const std::int32_t id = recent[i];
      if (id < 0 || id >= n) continue;
      const auto at = recent.begin() + static_cast<std::ptrdiff_t>(i);
      if (std::find(recent.begin(), at, id) != at) continue;  // done at its first occurrence
      float& l = logits[static_cast<std::size_t>(id)];
      if (repeat) l = l > 0 ? l / o_.repeat_penalty : l * o_.repeat_penalty;
      if (counted)
        l -= static_cast<float>(std::count(at, recent.end(), id)) * o_.frequency_penalty +
             o_.presence_penalty;
    }
  }

  if (o_.temperature <= 0.0f) {
    // Greedy: the first maximum (ties go to the lower id, like numpy's argmax).
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

  cands_.resize(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) cands_[static_cast<std::size_t>(i)] = {i, logits[static_cast<std::size_t>(i)]};
  auto by_logit = [](const cand& a, const cand& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  std::size_t keep = cands_.size();
  if (o_.top_k > 0 && static_cast<std::size_t>(o_.top_k) < keep) {
    keep = static_cast<std::size_t>(o_.top_k);
    std::partial_sort(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(keep), cands_.end(),
                      by_logit);
  } else {
    std::sort(cands_.begin(), cands_.end(), by_logit);
  }
  cands_.resize(keep);

  // Probabilities at temperature 1 for the filters (as llama.cpp: filters before temperature).
  auto softmax_into = [&](float temp) {
    probs_.resize(cands_.size());
    const double mx = cands_[0].logit;
    double sum = 0;
    for (std::size_t i = 0; i < cands_.size(); ++i) {
      probs_[i] = std::exp((static_cast<double>(cands_[i].logit) - mx) / temp);
      sum += probs_[i];
    }
    for (auto& p : probs_) p /= sum;
  };
  softmax_into(1.0f);
  if (o_.top_p < 1.0f) {
    double cum = 0;
    std::size_t k = 0;
    while (k < cands_.size()) {
      cum += probs_[k++];
      if (cum >= o_.top_p) break;
    }
    cands_.resize(std::max<std::size_t>(k, 1));
    probs_.resize(cands_.size());
  }
  if (o_.min_p > 0.0f) {
    const double threshold = static_cast<double>(o_.min_p) * probs_[0];
    std::size_t k = 1;
    while (k < cands_.size() && probs_[k] >= threshold) ++k;
    cands_.resize(k);
  }
  softmax_into(o_.temperature);
  double r = uniform();
  for (std::size_t i = 0; i < cands_.size(); ++i) {
    r -= probs_[i];
    if (r < 0) return cands_[i].id;
  }
  return cands_.back().id;
}

}  // namespace tessera::inference::model
