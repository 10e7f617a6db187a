// Plugs the fault layer (transport/faults) into a control node's fault hooks: every frame this
// node sends to a peer — heartbeats included — is judged by the shared fault_injector for the
// directed pair (self -> peer), and fault.set / fault.clear messages from authenticated peers
// change the injector's rules at run time (what `tessera fault` will send).
#pragma once

#include <memory>
#include <string>

#include "actors/base/result.hpp"
#include "transport/control/control_node.hpp"
#include "transport/faults/fault_policy.hpp"

namespace tessera::transport::control {

/// Hooks backed by `injector` for the node named `self`. The injector may be shared with the
/// bulk decorators and other nodes of a simulated cluster (it is thread-safe).
[[nodiscard]] fault_hooks make_fault_hooks(std::shared_ptr<faults::fault_injector> injector,
                                           std::string self);

/// The msgpack body of a fault.set message carrying `command`.
[[nodiscard]] std::string encode_fault_command(const faults::fault_command& command);

/// Decodes a fault.set body. errc::invalid_argument when it is not a fault_command.
[[nodiscard]] result<faults::fault_command> decode_fault_command(std::span<const std::byte> body);

}  // namespace tessera::transport::control
