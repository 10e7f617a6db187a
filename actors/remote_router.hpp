// remote_router: the seam between the actor runtime and the transport.
//
// When an actor sends to an actor_ref on another node, the system packs the message into an
// envelope and calls route(). The transport (issue 3) implements this interface over ZeroMQ; on
// the receiving node it decodes the envelope and calls actor_system::deliver_remote(). In one
// process, loopback_router connects several actor_systems (tests, the deterministic simulator).
#pragma once

#include "actors/base/result.hpp"
#include "actors/envelope.hpp"

namespace tessera::actors {

/// Carries envelopes to other nodes. route() may be called from any worker thread concurrently;
/// it must not block for long (queue and return) and must not call back into the sending actor.
class remote_router {
 public:
  virtual ~remote_router() = default;
  /// Takes the envelope for `env.receiver.node()`. Errors: errc::not_found (no route to that
  /// node), errc::overloaded (the link's queue is full), errc::closed (transport stopped).
  [[nodiscard]] virtual result<void> route(envelope&& env) = 0;
  /// `watcher` (a local actor) gets `down` when `target` (on another node) stops or its node is
  /// lost; the router delivers it with actor_system::deliver_remote. Default: errc::unsupported.
  [[nodiscard]] virtual result<void> monitor(const actor_ref& target, const actor_ref& watcher) {
    (void)watcher;
    return make_error(errc::unsupported, "monitoring {} on another node: this router cannot",
                      target);
  }
};

}  // namespace tessera::actors
