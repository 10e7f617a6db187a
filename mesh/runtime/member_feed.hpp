// The membership changes a node delivers to subscribing actors (node_runtime::subscribe_members):
// the subscribers, each on its actor system, and what reaching them cost. Used on the control
// actor's turns only, so it needs no lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/system.hpp"
#include "mesh/runtime/runtime.hpp"

namespace tessera::mesh::runtime {

class member_feed {
 public:
  explicit member_feed(std::string node_hex) : hex_(std::move(node_hex)) {}

  /// Sends `m` to every subscriber. Returns how many went for good (stopped, or their system
  /// closed); a full mailbox misses this change only (counted).
  std::size_t deliver(const member_changed& m);

  /// A new subscriber, sent `snapshot` first (one `initial` change per member). False when it is
  /// gone before the snapshot's end: it is not kept.
  bool add(actors::actor_system& system, const actors::actor_ref& who,
           const std::vector<member_changed>& snapshot);

  /// Ends `who`'s subscription; returns how many entries went (0 or 1).
  std::size_t remove(const actors::actor_ref& who);

  /// stats: member_subscribers, member_events_sent, member_events_dropped.
  void status_into(nlohmann::ordered_json& stats) const;

 private:
  struct subscriber {
    actors::actor_system* system;
    actors::actor_ref who;
  };
  /// False when `s` is gone for good.
  bool send(const subscriber& s, member_changed m);

  std::string hex_;                      // for the log
  std::vector<subscriber> subscribers_;  // bounded by kMaxMemberSubscribers (subscribe_members)
  std::uint64_t sent_ = 0, dropped_ = 0;
};

}  // namespace tessera::mesh::runtime
