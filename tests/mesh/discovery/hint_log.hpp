// hint_log: a thread-safe record of the hints a source delivered, for the discovery tests.
#pragma once

#include <mutex>
#include <vector>

#include "mesh/discovery/discovery_source.hpp"

namespace tessera::mesh::test {

class hint_log {
 public:
  hint_sink sink() {
    return [this](const peer_hint& h) {
      std::lock_guard lock(mu_);
      hints_.push_back(h);
    };
  }
  std::vector<peer_hint> snapshot() const {
    std::lock_guard lock(mu_);
    return hints_;
  }
  /// True when some hint came from `node_id`.
  bool saw(const std::string& node_id) const {
    std::lock_guard lock(mu_);
    for (const auto& h : hints_) {
      if (h.node_id == node_id) return true;
    }
    return false;
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return hints_.size();
  }
  void clear() {
    std::lock_guard lock(mu_);
    hints_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::vector<peer_hint> hints_;
};

}  // namespace tessera::mesh::test
