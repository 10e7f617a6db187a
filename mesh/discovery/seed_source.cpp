#include "mesh/discovery/seed_source.hpp"

#include <algorithm>

namespace tessera::mesh {

result<std::unique_ptr<seed_source>> seed_source::create(const std::vector<std::string>& seeds) {
  if (seeds.size() > max_seeds) {
    return make_error(errc::invalid_argument, "{} seeds given, at most {} allowed", seeds.size(),
                      max_seeds);
  }
  std::vector<endpoint> parsed;
  for (const auto& text : seeds) {
    auto e = parse_endpoint(text);
    if (!e) return make_error(errc::invalid_argument, "seed {}", e.error().message);
    if (std::find(parsed.begin(), parsed.end(), *e) == parsed.end()) parsed.push_back(*e);
  }
  return std::unique_ptr<seed_source>(new seed_source(std::move(parsed)));
}

result<void> seed_source::start(hint_sink sink) {
  TESSERA_ASSERT(sink != nullptr, "seed_source::start without a sink");
  auto now = std::chrono::system_clock::now();
  for (const auto& e : seeds_) {
    peer_hint hint;
    hint.control.push_back(e);
    hint.source = hint_source::seed;
    hint.seen_at = now;
    hints_.fetch_add(1, std::memory_order_relaxed);
    sink(hint);
  }
  return ok();
}

discovery_stats seed_source::stats() const {
  discovery_stats s;
  s.hints = hints_.load();
  return s;
}

}  // namespace tessera::mesh
