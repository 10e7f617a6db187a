// clock: where the runtime (and protocol code running on it) reads the time.
//
// real_clock reads std::chrono::steady_clock. virtual_clock only moves when told to, which is what
// makes deterministic mode replayable: time is an input like any message.
#pragma once

#include <atomic>
#include <chrono>

namespace tessera::actors {

/// Source of the current time. Implementations are thread-safe.
class clock {
 public:
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~clock() = default;
  [[nodiscard]] virtual time_point now() const noexcept = 0;
};

/// The machine's monotonic clock.
class real_clock final : public clock {
 public:
  [[nodiscard]] time_point now() const noexcept override { return std::chrono::steady_clock::now(); }
};

/// A clock that starts at time_point{} (zero) and moves only through advance_to / advance.
class virtual_clock final : public clock {
 public:
  [[nodiscard]] time_point now() const noexcept override {
    return time_point(duration(now_ns_.load(std::memory_order_acquire)));
  }
  /// Moves the clock to `t`; time never goes backwards (earlier values are ignored).
  void advance_to(time_point t) noexcept;
  void advance(duration d) noexcept { advance_to(now() + d); }

 private:
  std::atomic<std::int64_t> now_ns_{0};
};

}  // namespace tessera::actors
