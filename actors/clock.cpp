#include "actors/clock.hpp"

namespace tessera::actors {

void virtual_clock::advance_to(time_point t) noexcept {
  std::int64_t target = t.time_since_epoch().count();
  std::int64_t current = now_ns_.load(std::memory_order_relaxed);
  while (current < target &&
         !now_ns_.compare_exchange_weak(current, target, std::memory_order_acq_rel)) {
  }
}

}  // namespace tessera::actors
