// Memory read bandwidth probe: the physical limit of decoding (each generated token streams every
// weight once), used by `tessera bench` to print the roofline beside decode figures.
#pragma once

#include <cstddef>
#include <cstdint>

#include "actors/base/result.hpp"
#include "inference/kernels/thread_pool.hpp"

namespace tessera::inference {

struct bandwidth_sample {
  double median_gb_per_s = 0;  ///< median over the repetitions (1 GB = 1e9 bytes)
  double best_gb_per_s = 0;
  std::size_t bytes = 0;       ///< buffer size read per repetition
  int threads = 1;
  bool huge_pages = false;     ///< whether madvise(MADV_HUGEPAGE) was accepted
};

inline constexpr std::size_t max_probe_bytes = std::size_t{8} << 30;

/// Reads an anonymous buffer of `bytes` (populated first; transparent huge pages requested with
/// madvise) `repetitions` times with wide SIMD loads, split across `pool`'s threads when given.
/// Pick bytes well past the last-level cache (default 256 MiB). Errors: bytes outside
/// [1 MiB, max_probe_bytes], repetitions outside [1, 1000], mmap failure.
[[nodiscard]] result<bandwidth_sample> measure_read_bandwidth(std::size_t bytes = 256u << 20,
                                                              int repetitions = 7,
                                                              thread_pool* pool = nullptr);

/// Decode roofline: tokens/s if each token reads `bytes_per_token` at `gb_per_s`.
[[nodiscard]] inline double roofline_tokens_per_s(std::size_t bytes_per_token,
                                                  double gb_per_s) noexcept {
  return bytes_per_token == 0 ? 0.0 : gb_per_s * 1e9 / static_cast<double>(bytes_per_token);
}

}  // namespace tessera::inference
