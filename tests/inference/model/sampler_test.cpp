// Each sampling filter on hand-made logits, the repetition penalty and its window, seeded
// determinism, and option validation.
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "inference/model/sampler.hpp"

namespace tessera::inference::model {
namespace {

sampler_options plain(float temp = 1.0f) {
  sampler_options o;
  o.temperature = temp;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.repeat_penalty = 1.0f;
  o.seed = 42;
  return o;
}

// Logits whose softmax is `probs`.
std::vector<float> from_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<std::int32_t, int> draw(sampler& s, const std::vector<float>& logits, int n,
                                 const std::vector<std::int32_t>& history = {}) {
  std::map<std::int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    ++counts[s.sample(l, history)];
  }
  return counts;
}

TEST(ModelSampler, GreedyPicksTheFirstMaximum) {
  sampler s(sampler_options::greedy());
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(ModelSampler, TopKKeepsOnlyTheKBest) {
  auto o = plain();
  o.top_k = 2;
  sampler s(o);
  const auto counts = draw(s, from_probs({0.1, 0.4, 0.2, 0.3}), 2000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_TRUE(counts.count(1) && counts.count(3));
  o.top_k = 1;
  sampler one(o);
  EXPECT_EQ(draw(one, from_probs({0.1, 0.4, 0.2, 0.3}), 100).size(), 1u);
}

TEST(ModelSampler, TopPKeepsTheNucleus) {
  auto o = plain();
  o.top_p = 0.7f;  // 0.5 < 0.7 <= 0.5 + 0.3: keeps two
  sampler s(o);
  const auto counts = draw(s, from_probs({0.05, 0.5, 0.15, 0.3}), 2000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_TRUE(counts.count(1) && counts.count(3));
}

TEST(ModelSampler, MinPDropsUnlikelyTokens) {
  auto o = plain();
  o.min_p = 0.25f;  // threshold 0.125: 0.05 goes
  sampler s(o);
  const auto counts = draw(s, from_probs({0.05, 0.5, 0.15, 0.3}), 3000);
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_FALSE(counts.count(0));
}

TEST(ModelSampler, TemperatureOneFollowsTheDistribution) {
  sampler s(plain());
  const std::vector<double> p = {0.1, 0.6, 0.3};
  const int n = 20000;
  const auto counts = draw(s, from_probs(p), n);
  for (int i = 0; i < 3; ++i) {
    const double f = counts.count(i) ? static_cast<double>(counts.at(i)) / n : 0.0;
    EXPECT_NEAR(f, p[static_cast<std::size_t>(i)], 0.02) << i;
  }
  // A low temperature sharpens towards the argmax; a high one flattens.
  sampler cold(plain(0.05f));
  EXPECT_GE(draw(cold, from_probs(p), 500)[1], 495);
  sampler hot(plain(20.0f));
  const auto flat = draw(hot, from_probs(p), 6000);
  EXPECT_GT(flat.count(0) ? flat.at(0) : 0, 1500);
}

TEST(ModelSampler, RepetitionPenaltyWithinTheWindow) {
  auto o = sampler_options::greedy();
  o.repeat_penalty = 1.5f;
  o.repeat_window = 2;
  sampler s(o);
  std::vector<float> pos = {2.0f, 1.9f};
  EXPECT_EQ(s.sample(pos, std::vector<std::int32_t>{0}), 1);  // 2.0 / 1.5 < 1.9
  std::vector<float> neg = {-1.0f, -1.2f};
  EXPECT_EQ(s.sample(neg, std::vector<std::int32_t>{0}), 1);  // -1.5 < -1.2
  std::vector<float> outside = {2.0f, 1.9f};
  EXPECT_EQ(s.sample(outside, std::vector<std::int32_t>{0, 1, 1}), 0);  // 0 left the window
  // A token repeated in the window is penalised once.
  std::vector<float> twice = {2.0f, 1.0f};
  EXPECT_EQ(s.sample(twice, std::vector<std::int32_t>{0, 0}), 0);  // 2.0 / 1.5 = 1.33 > 1.0
  std::vector<float> ids_out_of_range = {1.0f, 2.0f};
  EXPECT_EQ(s.sample(ids_out_of_range, std::vector<std::int32_t>{-3, 99}), 1);
}

// OpenAI's frequency and presence penalties over the window: a token seen c times loses
// c * frequency + presence, once per distinct token; negative values favour it.
TEST(ModelSampler, FrequencyAndPresencePenaltiesCountWithinTheWindow) {
  auto o = sampler_options::greedy();
  o.frequency_penalty = 0.5f;
  o.repeat_window = 4;
  {
    sampler s(o);
    std::vector<float> l = {3.0f, 2.2f, 0.0f};
    EXPECT_EQ(s.sample(l, std::vector<std::int32_t>{0, 0}), 1);  // 3.0 - 2 x 0.5 = 2.0 < 2.2
    EXPECT_FLOAT_EQ(l[0], 2.0f);
    EXPECT_FLOAT_EQ(l[1], 2.2f);
    std::vector<float> once = {3.0f, 2.2f, 0.0f};
    EXPECT_EQ(s.sample(once, std::vector<std::int32_t>{0, 9, 9, 9, 0}), 0);  // one 0 in the window
    EXPECT_FLOAT_EQ(once[0], 2.5f);
  }
  o.frequency_penalty = 0.0f;
  o.presence_penalty = 1.0f;
  {
    sampler s(o);
    std::vector<float> l = {3.0f, 2.2f, 0.0f};
    EXPECT_EQ(s.sample(l, std::vector<std::int32_t>{0, 0, 0}), 1);  // 3.0 - 1 = 2.0, whatever c
    EXPECT_FLOAT_EQ(l[0], 2.0f);
  }
  o.presence_penalty = -1.0f;  // favours what was said
  {
    sampler s(o);
    std::vector<float> l = {2.0f, 2.2f};
    EXPECT_EQ(s.sample(l, std::vector<std::int32_t>{0}), 0);
  }
  o.presence_penalty = 2.5f;
  EXPECT_FALSE(validate(o));
  o.presence_penalty = 0.0f;
  o.frequency_penalty = -2.1f;
  EXPECT_FALSE(validate(o));
}

// Log-probabilities under the model's distribution: the log-softmax of the raw logits, the top k
// most probable first (ties to the lower id), whatever the sampler would then do.
TEST(ModelSampler, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double z = 0;
  for (float v : l)
    z += std::exp(static_cast<double>(v));
  const auto lp = logprobs_of(l, 4, 3);
  EXPECT_NEAR(lp.chosen, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // 3.0, the lower id of the tie
  EXPECT_EQ(lp.top[1].first, 2);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_TRUE(logprobs_of(l, 1, 0).top.empty());
  EXPECT_EQ(logprobs_of(l, 1, 99).top.size(), 5u);  // no more than the vocabulary
  double mass = 0;
  for (const auto& [id, v] : logprobs_of(l, 0, 5).top)
    mass += std::exp(static_cast<double>(v));
  EXPECT_NEAR(mass, 1.0, 1e-6);
}

TEST(ModelSampler, SameSeedSameTokens) {
  const auto logits = from_probs({0.2, 0.2, 0.2, 0.2, 0.2});
  auto seq = [&](std::uint64_t seed) {
    auto o = plain();
    o.seed = seed;
    sampler s(o);
    std::vector<std::int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = logits;
      out.push_back(s.sample(l, {}));
    }
    return out;
  };
  EXPECT_EQ(seq(1), seq(1));
  EXPECT_NE(seq(1), seq(2));
  sampler s(plain());
  const double a = s.uniform();
  s.reseed(42);
  EXPECT_EQ(s.uniform(), a);
  EXPECT_GE(a, 0.0);
  EXPECT_LT(a, 1.0);
}

TEST(ModelSampler, OptionsAreValidated) {
  EXPECT_TRUE(validate(sampler_options{}));
  auto o = sampler_options{};
  o.temperature = NAN;
  EXPECT_NE(validate(o).error().message.find("temperature"), std::string::npos);
  o = {};
  o.top_p = 1.5f;
  EXPECT_NE(validate(o).error().message.find("top-p"), std::string::npos);
  o = {};
  o.min_p = -0.1f;
  EXPECT_NE(validate(o).error().message.find("min-p"), std::string::npos);
  o = {};
  o.repeat_penalty = 0.0f;
  EXPECT_NE(validate(o).error().message.find("repeat penalty"), std::string::npos);
  o = {};
  o.top_k = -1;
  EXPECT_FALSE(validate(o));
  o = {};
  o.repeat_window = 1 << 20;
  EXPECT_FALSE(validate(o));
}

}  // namespace
}  // namespace tessera::inference::model
