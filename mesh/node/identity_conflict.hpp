// The run-time duplicate-identity rule: what a node does when it hears its own node id announced
// by someone else. Pure (no clock, no I/O) so discovery, membership and the simulator can share it.
//
// Every running node has an *instance*: its node id, the control endpoint it announces, the wall
// time it started (ms) and a random 64-bit instance nonce drawn at process start. Announcements
// (mDNS TXT, beacons, membership joins) carry all four.
//
// Rule, evaluated by each node on every announcement carrying its own node id:
//   same nonce                               -> our own announcement echoed back: ignore
//   same endpoint, different nonce, older    -> a stale record of an earlier run of ourselves
//                                               (avahi cache, a peer's memory): ignore
//   otherwise                                -> two live processes share one id: the LATER one
//                                               (larger (started_unix_ms, nonce)) must refuse to
//                                               run: it logs the error and exits non-zero.
// Both sides evaluate the same total order, so exactly one of them refuses and the earlier node
// keeps serving; the nonce breaks ties of equal start times.
#pragma once

#include <cstdint>
#include <string>

#include "mesh/node/node_id.hpp"

namespace tessera::mesh {

/// One announcement of a node instance.
struct node_instance {
  node_id id;
  std::string control_endpoint;  ///< "host:port" as announced
  std::int64_t started_unix_ms = 0;
  std::uint64_t nonce = 0;
};

enum class identity_verdict {
  unrelated,        ///< a different node id: not an identity question at all
  own_echo,         ///< our own announcement came back
  stale_self,       ///< an older run of this node at our endpoint; ignore
  peer_must_yield,  ///< a duplicate that started after us: it will refuse, we keep running
  we_must_refuse,   ///< a duplicate that started before us: we refuse to run
};

/// Applies the rule above. `self` is this process, `heard` the announcement.
[[nodiscard]] identity_verdict judge_identity(const node_instance& self,
                                              const node_instance& heard);

[[nodiscard]] const char* to_string(identity_verdict v) noexcept;

}  // namespace tessera::mesh
