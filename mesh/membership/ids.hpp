// Member ids and the deterministic random source shared by the mesh protocol state machines.
#pragma once

#include <cstdint>
#include <string_view>

#include "actors/base/assert.hpp"

namespace tessera::mesh {

/// The id of a node inside the mesh protocols: an opaque 64-bit value. The node derives it from
/// its persistent 128-bit identity (mesh/node/node_id.hpp) as the low 64 bits, which are random,
/// so every peer computes the same member_id for a node. 0 means "no member" and is never valid.
using member_id = std::uint64_t;
inline constexpr member_id no_member = 0;

/// FNV-1a (64-bit) of `bytes`: stable across processes and builds, so every peer computes the
/// same routing hashes, plan hashes and group keys.
[[nodiscard]] inline constexpr std::uint64_t fnv1a64(std::string_view bytes,
                                                     std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// splitmix64's step as a stateless mix: rendezvous scores and per-index seeds.
[[nodiscard]] inline constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A small seeded generator (splitmix64). Protocol state machines own one, seeded by their
/// config, so a run is reproduced exactly from its seed: no std::random_device, no global state.
class det_rng {
 public:
  explicit det_rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  /// Uniform in [lo, hi); requires lo < hi.
  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) {
    TESSERA_ASSERT(lo < hi, "det_rng::uniform: empty range [{}, {})", lo, hi);
    return lo + next() % (hi - lo);
  }

  /// True with probability ppm / 1'000'000.
  bool chance_ppm(std::uint32_t ppm) { return ppm > 0 && next() % 1'000'000 < ppm; }

 private:
  std::uint64_t state_;
};

}  // namespace tessera::mesh
