// timer_service: one-shot and periodic timers for one actor system.
//
// A timer is a time and a function; when the time comes the function runs (it posts a message to
// an actor's control lane; it never runs actor code). Threaded mode has one timer thread that
// sleeps until the earliest deadline; deterministic mode fires timers only from
// actor_system::advance, in (time, id) order, so a replay fires them identically.
// Cancelled timers are erased at once (no tombstones: a high request rate with long deadlines
// does not grow the queue).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "actors/clock.hpp"

namespace tessera::actors {

using timer_id = std::uint64_t;

class timer_service {
 public:
  /// Called with the timer's own id: a timer due at once may fire before schedule() returns,
  /// so the id must not be learnt from its return value.
  using fire_fn = std::function<void(timer_id)>;

  /// `threaded`: run a timer thread on `clk` (a real clock); otherwise fire only in fire_due().
  timer_service(const clock& clk, bool threaded);
  ~timer_service();
  timer_service(const timer_service&) = delete;
  timer_service& operator=(const timer_service&) = delete;

  /// Runs `fn` at `when`, then every `period` if period > 0. Returns the id to cancel it with.
  timer_id schedule(clock::time_point when, clock::duration period, fire_fn fn);
  /// Cancels a timer; false when it already fired (one-shot) or never existed.
  bool cancel(timer_id id);
  /// Deterministic mode: the earliest deadline, if any.
  [[nodiscard]] std::optional<clock::time_point> next_due() const;
  /// Deterministic mode: fires every timer due at or before `now`; returns how many fired.
  std::size_t fire_due(clock::time_point now);
  /// Stops the timer thread and drops every timer. Idempotent.
  void stop();
  /// Timers scheduled and not yet fired or cancelled.
  [[nodiscard]] std::size_t size() const;

 private:
  struct entry {
    clock::time_point when;
    clock::duration period;
    fire_fn fn;
  };
  void thread_main();
  // Pops one due timer into `out`; requires mutex_.
  bool pop_due(clock::time_point now, timer_id& id, entry*& out);
  void after_fire(timer_id id);

  const clock& clock_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<clock::time_point, timer_id>, bool> queue_;  // ordered deadlines
  std::unordered_map<timer_id, entry> entries_;
  timer_id next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera::actors
