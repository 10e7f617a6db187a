// scheduler: decides which thread runs which runnable actor, and when.
//
// thread_pool_scheduler (threaded mode)
//  - N workers. Each has a "next" slot, a local FIFO queue (stealable) and a pinned inbox; one
//    global FIFO queue takes actors made runnable from outside the pool (timers, other threads).
//  - Pinned actors (spawn_options::worker) go to their worker's inbox: a lock-free stack that any
//    thread pushes with one CAS and the owner takes whole with one exchange (then reverses it, so
//    the order stays FIFO). A cross-thread hand-off thus costs no lock and no deque traffic.
//    Only the stealable queue is counted in `queued`: a worker never mistakes another worker's
//    pinned actor for work it could take (it would spin on it instead of parking).
//  - An actor made runnable by an actor running on worker W goes to W's next slot (LIFO, not
//    stealable: the message it was just sent is hot in W's cache); what the slot held moves to the
//    back of W's local queue, where idle workers may steal it. A streak bound keeps two actors
//    that message each other from starving W's queue.
//  - Fairness: an actor handles at most `max_batch` messages per turn, then goes to the back of a
//    queue.
//  - Idle: a worker with nothing to do spins for at most `spin` (config::spin, 50 µs by default),
//    then parks on a condition variable. It spins with pause instructions between checks of the
//    queue counters and calls sched_yield every 64 checks: the pause spin sees a hand-off within
//    ~100 ns (a sched_yield round costs ~250 ns in this VM, which a yield-only spin put on every
//    cross-thread message), and the yields let the thread it waits for (often the other worker,
//    queued on the same core when the machine has more runnable threads than cores) run within
//    a few µs instead of after a spinner's time slice. Measured: cross-thread ping-pong 0.84 µs
//    yield-only vs 0.39 µs; with two CPU hogs beside it 254 µs vs 1.1 µs. The bound keeps a
//    message arriving within `spin` from paying a futex wake-up, and keeps an idle system at zero
//    CPU: past it every worker sleeps. Producers wake a parked worker only when no worker is
//    spinning, so wake-ups are not wasted.
//
// deterministic_scheduler (deterministic mode)
//  - No threads. The caller runs one actor turn at a time (one message per turn); which runnable
//    actor goes next is drawn from the system's seeded rng.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/rng.hpp"

namespace tessera::actors {

class actor_cell;

/// What an actor's turn ended with.
enum class resume_result { idle, again, done };

class scheduler {
 public:
  virtual ~scheduler() = default;
  /// Makes `cell` runnable. Takes over one reference count of the cell.
  virtual void schedule(actor_cell* cell) noexcept = 0;
  /// Stops the workers (after every actor has stopped) and releases queued cells.
  virtual void stop() = 0;
};

class thread_pool_scheduler final : public scheduler {
 public:
  thread_pool_scheduler(unsigned workers, std::size_t max_batch, std::chrono::microseconds spin);
  ~thread_pool_scheduler() override;
  void schedule(actor_cell* cell) noexcept override;
  void stop() override;
  /// True on one of this pool's worker threads.
  [[nodiscard]] bool on_worker_thread() const noexcept;
  [[nodiscard]] unsigned worker_count() const noexcept {
    return static_cast<unsigned>(workers_.size());
  }
  /// Workers parked right now (diagnostics and tests: an idle pool ends with all of them parked).
  [[nodiscard]] unsigned parked_workers() const noexcept {
    return static_cast<unsigned>(parked_.load(std::memory_order_seq_cst));
  }

 private:
  struct worker {
    std::mutex mutex;
    std::deque<actor_cell*> queue;   // stealable (under `mutex`)
    alignas(64) std::atomic<std::size_t> queued{0};  // size of `queue`
    // Pinned cells pushed by other threads (lock-free stack linked through sched_next).
    alignas(64) std::atomic<actor_cell*> inbox{nullptr};
    alignas(64) std::deque<actor_cell*> pinned;  // owner thread only, FIFO
    actor_cell* next = nullptr;  // owner thread only
    unsigned streak = 0;
    unsigned ticks = 0;  // every few turns the global queue goes first
    std::mutex park_mutex;
    std::condition_variable park_cv;
    bool wake_token = false;
    std::atomic<bool> parked{false};
    unsigned index = 0;
    std::thread thread;
  };

  void worker_main(worker& w);
  actor_cell* find_work(worker& w);
  bool has_work(const worker& w) const noexcept;
  void run(worker& w, actor_cell* cell);
  void push_back(worker& w, actor_cell* cell, bool pinned);
  void push_pinned(worker& target, worker* self, actor_cell* cell);
  actor_cell* take_pinned(worker& w);
  void notify_if_needed() noexcept;
  void wake(worker& w) noexcept;
  void park(worker& w);

  std::vector<std::unique_ptr<worker>> workers_;
  std::size_t max_batch_;
  std::chrono::microseconds spin_;
  std::mutex global_mutex_;
  std::deque<actor_cell*> global_;
  alignas(64) std::atomic<std::size_t> global_queued_{0};
  alignas(64) std::atomic<int> spinning_{0};
  alignas(64) std::atomic<int> parked_{0};
  std::atomic<bool> stopping_{false};
};

class deterministic_scheduler final : public scheduler {
 public:
  explicit deterministic_scheduler(rng& order) : rng_(order) {}
  ~deterministic_scheduler() override;
  void schedule(actor_cell* cell) noexcept override;
  void stop() override;
  /// Runs one turn of one runnable actor (chosen by the rng); false when nothing is runnable.
  bool run_one();
  [[nodiscard]] bool idle() const noexcept { return ready_.empty(); }

 private:
  rng& rng_;
  std::vector<actor_cell*> ready_;
};

}  // namespace tessera::actors
