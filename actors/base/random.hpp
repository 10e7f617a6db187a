// Bytes from the kernel's CSPRNG, for everything that must be unguessable: node ids, cluster
// secrets, request ids (which are capabilities, docs/PROTOCOL.md).
#pragma once

#include <cstddef>
#include <span>

#include "actors/base/result.hpp"

namespace tessera {

/// Fills `out` from getrandom(2) (blocking only until the pool is first initialised at boot).
/// errc::io naming the errno if the kernel refuses; an interrupted call is retried.
[[nodiscard]] result<void> fill_random(std::span<std::byte> out);

}  // namespace tessera
