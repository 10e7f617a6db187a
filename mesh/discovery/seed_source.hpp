// seed_source: a static list of control endpoints (--seed host:port) for routed networks where
// neither mDNS nor beacons reach. Hints carry no node id or cluster id: both are learned when the
// node first talks to the seed over the control plane.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "mesh/discovery/discovery_source.hpp"

namespace tessera::mesh {

class seed_source final : public discovery_source {
 public:
  /// At most max_seeds entries, each host:port or [v6]:port; duplicates are merged.
  static constexpr std::size_t max_seeds = 256;
  [[nodiscard]] static result<std::unique_ptr<seed_source>> create(
      const std::vector<std::string>& seeds);

  const char* name() const noexcept override { return "seed"; }
  /// Emits one hint per seed, synchronously on the calling thread (there is nothing to wait for).
  result<void> start(hint_sink sink) override;
  void stop() override {}
  discovery_stats stats() const override;

  [[nodiscard]] const std::vector<endpoint>& seeds() const noexcept { return seeds_; }

 private:
  explicit seed_source(std::vector<endpoint> seeds) : seeds_(std::move(seeds)) {}
  std::vector<endpoint> seeds_;
  std::atomic<std::uint64_t> hints_{0};
};

}  // namespace tessera::mesh
