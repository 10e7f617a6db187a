// loopback_router: a remote_router joining several actor_systems in one process.
//
// Each envelope is packed to bytes and unpacked again (the same wire format the transport will
// carry), then delivered to the system registered for its receiver node. Used by tests, the demo
// and the deterministic simulator. Thread-safe.
#pragma once

#include <mutex>
#include <unordered_map>

#include "actors/remote_router.hpp"

namespace tessera::actors {

class actor_system;

class loopback_router final : public remote_router {
 public:
  /// Makes `sys` reachable as its node id. The system must outlive the router's use.
  void attach(actor_system& sys);
  void detach(node_id node);
  [[nodiscard]] result<void> route(envelope&& env) override;
  /// Envelopes routed so far.
  [[nodiscard]] std::uint64_t routed() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<node_id, actor_system*> systems_;
  std::uint64_t routed_ = 0;
};

}  // namespace tessera::actors
