#include "mesh/runtime/member_feed.hpp"

#include <spdlog/spdlog.h>

namespace tessera::mesh::runtime {

bool member_feed::send(const subscriber& s, member_changed m) {
  auto r = s.system->send(s.who, std::move(m));
  if (r) {
    ++sent_;
    return true;
  }
  if (r.error().code == errc::not_found || r.error().code == errc::closed) {
    spdlog::debug("node {}: membership subscriber {} dropped: {}", hex_, s.who.id(),
                  r.error().describe());
    return false;
  }
  ++dropped_;  // a full mailbox: this change is missed, the next ones still go
  return true;
}

std::size_t member_feed::deliver(const member_changed& m) {
  std::size_t gone = 0;
  std::erase_if(subscribers_, [&](const subscriber& s) {
    const bool keep = send(s, m);
    gone += keep ? 0 : 1;
    return !keep;
  });
  return gone;
}

bool member_feed::add(actors::actor_system& system, const actors::actor_ref& who,
                      const std::vector<member_changed>& snapshot) {
  subscriber s{&system, who};
  for (const auto& m : snapshot)
    if (!send(s, m)) return false;
  subscribers_.push_back(std::move(s));
  return true;
}

std::size_t member_feed::remove(const actors::actor_ref& who) {
  return std::erase_if(subscribers_, [&](const subscriber& s) { return s.who == who; });
}

void member_feed::status_into(nlohmann::ordered_json& stats) const {
  stats["member_subscribers"] = subscribers_.size();
  stats["member_events_sent"] = sent_;
  stats["member_events_dropped"] = dropped_;
}

}  // namespace tessera::mesh::runtime
