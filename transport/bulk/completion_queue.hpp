// completion_queue: the bounded hand-off of completions from a backend's I/O thread (or its
// posting calls) to whichever thread polls the link. Shared by the tcp backend and available to the
// others. Implements the link-down rule: queued completions first, then one link_down, then
// errc::closed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>

#include "transport/bulk/link.hpp"

namespace tessera::transport::bulk {

class completion_queue {
 public:
  /// `max_received`: remote completions held before push_received() blocks (backpressure);
  /// `max_outstanding`: local operations posted and not yet polled.
  completion_queue(std::uint32_t max_received, std::uint32_t max_outstanding, std::uint32_t spin_us);

  /// Claims `count` outstanding slots for operations about to be posted: all or none.
  /// errc::overloaded when they do not fit under the bound, errc::closed (with the down reason)
  /// once down.
  [[nodiscard]] result<void> reserve_local(std::uint32_t count = 1);
  /// Returns `count` slots claimed by reserve_local() whose operations were not posted after all.
  void cancel_local(std::uint32_t count = 1) noexcept;
  /// Queues the completion of a posted operation (its slot is freed when it is polled).
  void push_local(completion c);
  /// Queues a received completion, blocking while max_received are queued. Returns false (and
  /// drops `c`) when the queue went down meanwhile.
  bool push_received(completion c);
  /// Marks the link down (first reason wins). Wakes every waiter. Returns true the first time.
  bool set_down(error reason);
  [[nodiscard]] bool is_down() const noexcept { return down_.load(std::memory_order_acquire); }
  /// The reason given to set_down(); empty error before.
  [[nodiscard]] error down_reason() const;

  [[nodiscard]] std::size_t poll(std::span<completion> out);
  [[nodiscard]] result<std::size_t> wait(std::span<completion> out,
                                         std::chrono::microseconds timeout);

 private:
  std::size_t take_locked(std::span<completion> out);

  const std::uint32_t max_received_;
  const std::uint32_t max_outstanding_;
  const std::uint32_t spin_us_;
  mutable std::mutex mutex_;
  std::condition_variable consumer_cv_;  // a poller waits for completions
  std::condition_variable producer_cv_;  // push_received waits for room
  std::deque<completion> queue_;
  std::uint32_t received_queued_ = 0;
  std::uint32_t outstanding_ = 0;
  std::uint32_t consumers_waiting_ = 0;
  std::optional<error> down_reason_;
  bool down_delivered_ = false;
  std::atomic<std::size_t> available_{0};  // spinning pollers read this without the lock
  std::atomic<bool> down_{false};
};

}  // namespace tessera::transport::bulk
