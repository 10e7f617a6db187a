// discovery_source: the common interface of mDNS, UDP beacons and seed lists.
//
// A source runs on its own thread (started by start(), joined by stop()) and hands every hint to
// a sink on that thread. The sink must be quick and must not call back into the source (the node
// forwards hints into an actor mailbox). Sources never decide membership: they only say where a
// peer may be. Everything a source reads from the network is bounded and validated; what fails
// validation is dropped and counted in stats().
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "actors/base/result.hpp"
#include "mesh/discovery/peer_hint.hpp"

namespace tessera::mesh {

using hint_sink = std::function<void(const peer_hint&)>;

/// Counters every source keeps (a source leaves the ones it has no use for at zero).
struct discovery_stats {
  std::uint64_t hints = 0;            ///< hints handed to the sink
  std::uint64_t foreign_cluster = 0;  ///< valid announcements of another cluster, ignored
  std::uint64_t malformed = 0;        ///< undecodable datagrams / TXT records, ignored
  std::uint64_t unauthenticated = 0;  ///< beacons without a valid MAC while a key is set
  std::uint64_t self = 0;             ///< our own announcements heard back
  std::uint64_t sent = 0;             ///< announcements sent (beacons)
  std::uint64_t send_errors = 0;
  std::uint64_t reconnects = 0;  ///< avahi: connections lost and retried
  std::uint64_t dropped = 0;     ///< work shed at a bound (e.g. too many pending resolves)
};

class discovery_source {
 public:
  virtual ~discovery_source() = default;

  /// "mdns", "beacon" or "seed".
  [[nodiscard]] virtual const char* name() const noexcept = 0;
  /// Starts announcing and listening; hints go to `sink` from the source's thread. An error
  /// means the source cannot run at all (bad configuration, socket refused); a missing avahi
  /// daemon is not an error: the source keeps retrying in the background.
  [[nodiscard]] virtual result<void> start(hint_sink sink) = 0;
  /// Stops announcing and joins the thread. Idempotent. Never call it from the sink.
  virtual void stop() = 0;
  [[nodiscard]] virtual discovery_stats stats() const = 0;
};

}  // namespace tessera::mesh
