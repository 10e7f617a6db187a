// The keys of client authentication (`--client-auth`, docs/PROTOCOL.md "Security"): shared by the
// engine's options and the client port that applies them.
#pragma once

#include <array>
#include <cstdint>

#include "transport/control/cluster_key.hpp"

namespace tessera::mesh::serving {

/// The request SUB and the response XPUB become CURVE servers with `client_endpoint`, and the ZAP
/// handler admits only clients presenting `allowed_client` (the cluster's client access key).
struct client_auth_keys {
  transport::control::curve_keypair client_endpoint;
  std::array<std::uint8_t, 32> allowed_client{};
};

}  // namespace tessera::mesh::serving
