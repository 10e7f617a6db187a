#include "actors/loopback_router.hpp"

#include "actors/system.hpp"

namespace tessera::actors {

void loopback_router::attach(actor_system& sys) {
  std::lock_guard lock(mutex_);
  systems_[sys.node()] = &sys;
}

void loopback_router::detach(node_id node) {
  std::lock_guard lock(mutex_);
  systems_.erase(node);
}

result<void> loopback_router::route(envelope&& env) {
  actor_system* target = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = systems_.find(env.receiver.node());
    if (it == systems_.end()) {
      return make_error(errc::not_found, "loopback: no node {}", env.receiver.node());
    }
    target = it->second;
    ++routed_;
  }
  std::vector<char> wire = encode_envelope(env);
  auto decoded = decode_envelope(wire);
  if (!decoded) return std::move(decoded).error();
  return target->deliver_remote(std::move(*decoded));
}

std::uint64_t loopback_router::routed() const {
  std::lock_guard lock(mutex_);
  return routed_;
}

}  // namespace tessera::actors
