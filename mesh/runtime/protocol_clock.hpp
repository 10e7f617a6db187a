// protocol_clock: the time a node's protocol state machines (membership, election, topology,
// plans) read — the real monotonic clock, unless the operator skews it with `tessera fault clock`
// (Jepsen's clock nemesis: a node whose timers run fast or slow, or whose clock jumps forward).
// Pure: real time in, local time out; monotonic whatever the faults do.
#pragma once

#include <cmath>
#include <cstdint>

namespace tessera::mesh::runtime {

class protocol_clock {
 public:
  /// Local time (ms) at real time `real_ms` (which must not go back between calls).
  [[nodiscard]] std::uint64_t at(std::uint64_t real_ms) const {
    const double d = static_cast<double>(real_ms - anchor_real_) * rate_;
    return anchor_local_ + static_cast<std::uint64_t>(d);
  }

  /// Real milliseconds until local time has moved `local_ms` forward (for sleeping until a timer).
  [[nodiscard]] std::uint64_t real_wait(std::uint64_t local_ms) const {
    return static_cast<std::uint64_t>(std::ceil(static_cast<double>(local_ms) / rate_));
  }

  /// The fault in force changed at real time `real_ms`: from now on local time runs at `rate`,
  /// and it jumps forward by however much `bump_total_ms` grew since the last call (a bump total
  /// that shrank — the fault was cleared — jumps nothing: local time never goes back).
  void apply(double rate, std::uint64_t bump_total_ms, std::uint64_t real_ms) {
    anchor_local_ = at(real_ms);
    anchor_real_ = real_ms;
    if (bump_total_ms > bump_seen_ms_) anchor_local_ += bump_total_ms - bump_seen_ms_;
    bump_seen_ms_ = bump_total_ms;
    rate_ = rate > 0 ? rate : 1.0;
  }

  [[nodiscard]] double rate() const { return rate_; }
  /// Local minus real time now (ms): what the bumps and the rate have added up to.
  [[nodiscard]] std::int64_t offset_ms(std::uint64_t real_ms) const {
    return static_cast<std::int64_t>(at(real_ms)) - static_cast<std::int64_t>(real_ms);
  }

 private:
  std::uint64_t anchor_real_ = 0, anchor_local_ = 0, bump_seen_ms_ = 0;
  double rate_ = 1.0;
};

}  // namespace tessera::mesh::runtime
