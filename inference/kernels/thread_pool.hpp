// A small pool of pinned compute threads for the kernels (not the actor scheduler).
//
// run(task) executes task(index, size) on every thread, the calling thread as index 0, and
// returns when all are done. Hand-off and completion use a counter that is spun on briefly and
// then slept on with a futex: spinning alone collapses when the host deschedules one vCPU (the
// spinner burns the slice the other thread needs), sleeping alone costs ~20 us per wake-up here.
// Idle workers sleep; nothing polls while no task runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::inference {

/// A node's CPU budget for compute. Pools that share one gate run their tasks one at a time, in
/// the order they asked (a ticket lock: a pool that runs task after task cannot shut the others
/// out), so the compute threads running at any moment never exceed the largest pool's size — the
/// cores given with --threads — however many split groups a node serves beside its own engine;
/// the protocol threads keep the remaining cores. It is held for one task, never across a forward
/// pass: a task is pure compute, while a pass waits on collectives, and a gate held there by two
/// nodes' ranks of two groups would deadlock them.
class compute_gate {
 public:
  void enter() noexcept;
  void leave() noexcept;
  /// Tasks that found the gate taken by another pool and waited.
  [[nodiscard]] std::uint64_t waits() const noexcept {
    return waits_.load(std::memory_order_relaxed);
  }

 private:
  alignas(64) std::atomic<std::uint32_t> next_{0};     // the next ticket to hand out
  alignas(64) std::atomic<std::uint32_t> serving_{0};  // the ticket that may run
  std::atomic<std::uint32_t> sleepers_{0};
  std::atomic<std::uint64_t> waits_{0};
};

struct thread_pool_options {
  bool pin = true;            ///< pin worker i to the i-th CPU of the process's affinity set
  std::uint32_t spin_us = 50; ///< how long a waiting thread spins before it sleeps on the futex
  /// Workers' nice value (actors/base/thread.hpp: compute gives way to protocol threads); 0 keeps
  /// the creator's. The calling thread, worker 0, keeps its own.
  int nice = 0;
  /// Shared with the node's other pools: one task at a time among them (see compute_gate).
  std::shared_ptr<compute_gate> gate;
};

class thread_pool {
 public:
  static constexpr int max_threads = 256;

  /// A pool of `n_threads` threads including the caller (n_threads - 1 workers are started).
  /// Error when n_threads is outside [1, max_threads] or a thread cannot be started.
  [[nodiscard]] static result<std::unique_ptr<thread_pool>> create(
      int n_threads, thread_pool_options options = {});

  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  [[nodiscard]] int size() const noexcept { return n_threads_; }
  /// Shares a compute_gate: callers run even a one-thread pool's heavy work (mat-muls,
  /// attention) through run(), so the gate counts it; light element-wise work may bypass.
  [[nodiscard]] bool gated() const noexcept { return options_.gate != nullptr; }

  /// Runs task(index, size()) on every thread of the pool (the caller is index 0) and returns
  /// when every call has returned. One caller at a time (asserted); the task must not throw.
  template <class Task>
  void run(Task&& task) {
    using task_type = std::remove_reference_t<Task>;
    run_erased(
        [](void* obj, int index, int size) { (*static_cast<task_type*>(obj))(index, size); },
        const_cast<void*>(static_cast<const void*>(&task)));
  }

 private:
  using trampoline = void (*)(void*, int, int);

  thread_pool(int n_threads, thread_pool_options options);
  void run_erased(trampoline fn, void* obj);
  void worker_loop(int index);

  int n_threads_;
  thread_pool_options options_;
  std::vector<std::thread> workers_;
  trampoline task_fn_ = nullptr;
  void* task_obj_ = nullptr;
  alignas(64) std::atomic<std::uint32_t> generation_{0};  // bumped per task; workers wait on it
  std::atomic<std::uint32_t> sleeping_workers_{0};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<std::uint32_t> pending_{0};  // workers still running the current task
  std::atomic<std::uint32_t> caller_sleeping_{0};
  std::atomic<bool> running_{false};
};

}  // namespace tessera::inference
