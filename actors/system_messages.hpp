// Messages the runtime itself sends to actors. They travel on the control lane.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/actor_ref.hpp"
#include "actors/message.hpp"

namespace tessera::actors {

/// A watched actor stopped (sent to every monitor; also sent at once when the watched actor was
/// already dead or never existed, with that as the reason).
struct down {
  TESSERA_MESSAGE("tessera.actors.down");
  actor_ref who;
  exit_reason reason;
  MSGPACK_DEFINE(who, reason);
};

/// A child stopped (sent to the parent named in spawn_options::parent, i.e. its supervisor).
struct child_exit {
  TESSERA_MESSAGE("tessera.actors.child_exit");
  actor_ref who;
  exit_reason reason;
  MSGPACK_DEFINE(who, reason);
};

/// Asks the receiver to stop with `reason` (actor_system::stop).
struct stop_request {
  TESSERA_MESSAGE("tessera.actors.stop");
  exit_reason reason;
  MSGPACK_DEFINE(reason);
};

}  // namespace tessera::actors
