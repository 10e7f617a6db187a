#include "inference/kernels/thread_pool.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <string>

#include "actors/base/thread.hpp"

namespace tessera::inference {

namespace {

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  // Returns at once when the word no longer holds `expected`; spurious wake-ups are re-checked by
  // the caller's loop.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until pred() holds or spin_us passed. True when pred() held.
template <class Pred>
bool spin_until(Pred pred, std::uint32_t spin_us) noexcept {
  if (pred()) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (pred()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

void pin_to_nth_allowed_cpu(int n) noexcept {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  const int count = CPU_COUNT(&allowed);
  if (count <= 1) return;
  int want = n % count;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (want-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pthread_setaffinity_np(pthread_self(), sizeof(one), &one);  // best effort
      return;
    }
  }
}

}  // namespace

void compute_gate::enter() noexcept {
  const std::uint32_t ticket = next_.fetch_add(1, std::memory_order_acq_rel);
  auto mine = [&] { return serving_.load(std::memory_order_acquire) == ticket; };
  if (mine()) return;
  waits_.fetch_add(1, std::memory_order_relaxed);
  if (spin_until(mine, 20)) return;
  for (;;) {
    // seq_cst pairs with leave(): either we see the new ticket or leave() sees us asleep.
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t now = serving_.load(std::memory_order_seq_cst);
    if (now != ticket) futex_wait(serving_, now);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    if (mine()) return;
  }
}

void compute_gate::leave() noexcept {
  serving_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(serving_);
}

result<std::unique_ptr<thread_pool>> thread_pool::create(int n_threads,
                                                         thread_pool_options options) {
  if (n_threads < 1 || n_threads > max_threads) {
    return make_error(errc::invalid_argument, "thread pool size {} is outside [1, {}]", n_threads,
                      max_threads);
  }
  std::unique_ptr<thread_pool> pool(new thread_pool(n_threads, options));
  try {
    for (int i = 1; i < n_threads; ++i) {
      pool->workers_.emplace_back([p = pool.get(), i] { p->worker_loop(i); });
    }
  } catch (const std::system_error& e) {
    pool->n_threads_ = static_cast<int>(pool->workers_.size()) + 1;  // join only those started
    return make_error(errc::io, "cannot start compute thread {} of {}: {}",
                      pool->workers_.size() + 1, n_threads, e.what());
  }
  return pool;
}

thread_pool::thread_pool(int n_threads, thread_pool_options options)
    : n_threads_(n_threads), options_(options) {
  workers_.reserve(static_cast<std::size_t>(n_threads));
}

thread_pool::~thread_pool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(generation_);
  for (auto& t : workers_) t.join();
}

void thread_pool::run_erased(trampoline fn, void* obj) {
  TESSERA_ASSERT(!running_.exchange(true, std::memory_order_acquire),
                 "thread_pool::run called while another run is in progress");
  if (options_.gate) options_.gate->enter();
  const auto n_workers = static_cast<std::uint32_t>(workers_.size());
  if (n_workers > 0) {
    task_fn_ = fn;
    task_obj_ = obj;
    pending_.store(n_workers, std::memory_order_relaxed);
    // seq_cst pairs with the workers' sleeping_workers_ increment: either a worker sees the new
    // generation before it sleeps, or we see it sleeping and wake it.
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(generation_);
  }
  fn(obj, 0, n_threads_);
  if (n_workers > 0) {
    auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(done, options_.spin_us)) {
      for (;;) {
        caller_sleeping_.store(1, std::memory_order_seq_cst);
        const std::uint32_t left = pending_.load(std::memory_order_seq_cst);
        if (left == 0) break;
        futex_wait(pending_, left);
      }
      caller_sleeping_.store(0, std::memory_order_relaxed);
    }
  }
  if (options_.gate) options_.gate->leave();
  running_.store(false, std::memory_order_release);
}

void thread_pool::worker_loop(int index) {
  name_this_thread("kpool-" + std::to_string(index));
  set_this_thread_nice(options_.nice);
  if (options_.pin) pin_to_nth_allowed_cpu(index);
  std::uint32_t seen = 0;
  for (;;) {
    auto changed = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(changed, options_.spin_us)) {
      for (;;) {
        sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
        const std::uint32_t now = generation_.load(std::memory_order_seq_cst);
        if (now == seen) futex_wait(generation_, seen);
        sleeping_workers_.fetch_sub(1, std::memory_order_seq_cst);
        if (generation_.load(std::memory_order_acquire) != seen) break;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    task_fn_(task_obj_, index, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
      futex_wake_all(pending_);
    }
  }
}

}  // namespace tessera::inference
