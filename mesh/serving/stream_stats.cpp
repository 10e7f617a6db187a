#include "mesh/serving/stream_stats.hpp"

namespace tessera::mesh::serving {

namespace {

template <std::size_t N>
nlohmann::json histogram_json(const histogram<N>& h, const std::array<double, N>& bounds) {
  return {{"bounds", bounds}, {"counts", h.counts}, {"sum", h.sum}, {"count", h.count}};
}

}  // namespace

stream_stats::per_model* stream_stats::find(const std::string& model) {
  auto it = models_.find(model);
  if (it != models_.end()) return &it->second;
  if (models_.size() >= kMaxModels) return nullptr;
  return &models_[model];
}

void stream_stats::accepted(const std::string& model, std::uint64_t prompt_tokens) {
  std::lock_guard lock(mu_);
  if (auto* m = find(model)) m->prompt_tokens += prompt_tokens;
}

void stream_stats::token(const std::string& model, bool first, double seconds) {
  std::lock_guard lock(mu_);
  auto* m = find(model);
  if (m == nullptr) return;
  ++m->tokens;
  if (first)
    m->first_token.observe(kFirstTokenBounds, seconds);
  else
    m->token_gap.observe(kTokenGapBounds, seconds);
}

void stream_stats::finished(const std::string& model, double seconds) {
  std::lock_guard lock(mu_);
  auto* m = find(model);
  if (m == nullptr) return;
  ++m->streams;
  m->duration.observe(kDurationBounds, seconds);
}

nlohmann::json stream_stats::to_json() const {
  std::lock_guard lock(mu_);
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, m] : models_)
    j[name] = {{"prompt_tokens", m.prompt_tokens},
               {"tokens", m.tokens},
               {"streams", m.streams},
               {"first_token", histogram_json(m.first_token, kFirstTokenBounds)},
               {"token_gap", histogram_json(m.token_gap, kTokenGapBounds)},
               {"duration", histogram_json(m.duration, kDurationBounds)}};
  return j;
}

}  // namespace tessera::mesh::serving
