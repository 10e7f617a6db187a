// Helpers shared by the kernel tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "inference/kernels/cpu.hpp"

namespace tessera::inference::test {

// Restores the active ISA when a test leaves.
struct isa_guard {
  isa saved = active_isa();
  ~isa_guard() { (void)set_active_isa(saved); }
};

// n normally distributed floats (mean 0, standard deviation `scale`), the same for the same seed.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace tessera::inference::test
