// rng: the seeded random source of the runtime (xoshiro256**, seeded through splitmix64).
//
// Deterministic mode draws every scheduling choice from one rng; each actor gets its own stream
// derived from the system seed and its id, so protocol code can draw randomness (election
// timeouts, gossip targets) that replays exactly from the seed.
#pragma once

#include <cstdint>

namespace tessera::actors {

/// Small, fast, seeded PRNG. Not thread-safe: one owner at a time.
class rng {
 public:
  explicit rng(std::uint64_t seed = 0) noexcept;
  /// Next 64 random bits.
  std::uint64_t next() noexcept;
  /// Uniform in [0, bound); bound must be > 0.
  std::uint64_t uniform(std::uint64_t bound) noexcept;
  /// Uniform in [0, 1).
  double unit() noexcept;

 private:
  std::uint64_t s_[4];
};

}  // namespace tessera::actors
