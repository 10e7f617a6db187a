#include "actors/scheduler.hpp"

#include <utility>

#include <algorithm>
#include <string>

#include "actors/actor_cell.hpp"
#include "actors/base/thread.hpp"

namespace tessera::actors {
namespace {
thread_local const void* tl_pool = nullptr;
thread_local void* tl_worker = nullptr;
constexpr unsigned next_slot_streak_limit = 32;
// Idle spin: checks between two sched_yield calls (one check with its pause is ~50-100 ns; 16
// measured no better on a quiet machine and worse beside CPU hogs: 3.9 vs 1.1 µs a round trip).
constexpr unsigned yield_every = 64;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

thread_pool_scheduler::thread_pool_scheduler(unsigned workers, std::size_t max_batch,
                                             std::chrono::microseconds spin)
    : max_batch_(max_batch), spin_(spin) {
  if (workers == 0) workers = 1;
  for (unsigned i = 0; i < workers; ++i) {
    workers_.push_back(std::make_unique<worker>());
    workers_.back()->index = i;
  }
  for (auto& w : workers_) {
    worker* wp = w.get();
    w->thread = std::thread([this, wp] {
      name_this_thread("actor-" + std::to_string(wp->index));
      worker_main(*wp);
    });
  }
}

thread_pool_scheduler::~thread_pool_scheduler() { stop(); }

bool thread_pool_scheduler::on_worker_thread() const noexcept { return tl_pool == this; }

void thread_pool_scheduler::push_back(worker& w, actor_cell* cell, bool pinned) {
  if (pinned) {
    push_pinned(w, tl_pool == this ? static_cast<worker*>(tl_worker) : nullptr, cell);
    return;
  }
  {
    std::lock_guard lock(w.mutex);
    w.queue.push_back(cell);
  }
  w.queued.fetch_add(1, std::memory_order_seq_cst);
}

void thread_pool_scheduler::push_pinned(worker& target, worker* self, actor_cell* cell) {
  if (&target == self) {
    target.pinned.push_back(cell);  // our own deque: no atomics
    return;
  }
  // Guess an empty inbox (the usual case of a hand-off) rather than load it first: the CAS then
  // takes the line in one transfer, where a load and a CAS took two.
  actor_cell* head = nullptr;
  do {
    cell->sched_next = head;
  } while (!target.inbox.compare_exchange_weak(head, cell, std::memory_order_seq_cst,
                                               std::memory_order_relaxed));
  // No fence needed (TSan cannot model fences anyway): the inbox's seq_cst RMW and this seq_cst
  // load pair with park()'s seq_cst store and re-check (store-buffer pattern).
  if (target.parked.load(std::memory_order_seq_cst)) wake(target);
}

actor_cell* thread_pool_scheduler::take_pinned(worker& w) {
  if (w.pinned.empty() && w.inbox.load(std::memory_order_relaxed) != nullptr) {
    // The stack holds the newest first: reverse it so pinned actors run in arrival order.
    actor_cell* list = w.inbox.exchange(nullptr, std::memory_order_acquire);
    std::size_t first = w.pinned.size();
    for (; list != nullptr; list = list->sched_next) w.pinned.push_back(list);
    std::reverse(w.pinned.begin() + static_cast<std::ptrdiff_t>(first), w.pinned.end());
  }
  if (w.pinned.empty()) return nullptr;
  actor_cell* c = w.pinned.front();
  w.pinned.pop_front();
  return c;
}

void thread_pool_scheduler::schedule(actor_cell* cell) noexcept {
  int pin = cell->pinned_worker();
  worker* self = tl_pool == this ? static_cast<worker*>(tl_worker) : nullptr;
  if (pin >= 0) {
    push_pinned(*workers_[static_cast<std::size_t>(pin) % workers_.size()], self, cell);
    return;
  }
  if (self != nullptr) {
    actor_cell* displaced = self->next;
    self->next = cell;
    if (displaced == nullptr) return;  // this worker runs it right after the current turn
    push_back(*self, displaced, false);  // the next slot never holds a pinned actor
  } else {
    {
      std::lock_guard lock(global_mutex_);
      global_.push_back(cell);
    }
    global_queued_.fetch_add(1, std::memory_order_seq_cst);
  }
  notify_if_needed();
}

void thread_pool_scheduler::notify_if_needed() noexcept {
  // Callers just did a seq_cst RMW on a queue counter; with the seq_cst loads below and park()'s
  // seq_cst announce-then-recheck, either we see the parked worker or it sees the work.
  if (spinning_.load(std::memory_order_seq_cst) > 0) return;  // a spinner will find it
  if (parked_.load(std::memory_order_seq_cst) == 0) return;
  for (auto& w : workers_) {
    if (w->parked.load(std::memory_order_seq_cst)) {
      wake(*w);
      return;
    }
  }
}

void thread_pool_scheduler::wake(worker& w) noexcept {
  {
    std::lock_guard lock(w.park_mutex);
    w.wake_token = true;
  }
  w.park_cv.notify_one();
}

bool thread_pool_scheduler::has_work(const worker& w) const noexcept {
  if (!w.pinned.empty()) return true;  // owner thread only, like every caller of has_work
  if (w.inbox.load(std::memory_order_seq_cst) != nullptr) return true;
  if (w.queued.load(std::memory_order_seq_cst) > 0) return true;
  if (global_queued_.load(std::memory_order_seq_cst) > 0) return true;
  for (const auto& other : workers_) {
    if (other.get() != &w && other->queued.load(std::memory_order_seq_cst) > 0) return true;
  }
  return false;
}

actor_cell* thread_pool_scheduler::find_work(worker& w) {
  if (w.next != nullptr) {
    if (++w.streak <= next_slot_streak_limit) return std::exchange(w.next, nullptr);
    // Two actors keep waking each other: let the queue in, and others steal the pair.
    actor_cell* n = std::exchange(w.next, nullptr);
    push_back(w, n, n->pinned_worker() >= 0);
  }
  w.streak = 0;
  auto take = [](worker& from, std::deque<actor_cell*>& q) -> actor_cell* {
    if (from.queued.load(std::memory_order_acquire) == 0) return nullptr;
    std::lock_guard lock(from.mutex);
    if (q.empty()) return nullptr;
    actor_cell* c = q.front();
    q.pop_front();
    from.queued.fetch_sub(1, std::memory_order_relaxed);
    return c;
  };
  auto take_global = [this]() -> actor_cell* {
    if (global_queued_.load(std::memory_order_acquire) == 0) return nullptr;
    std::lock_guard lock(global_mutex_);
    if (global_.empty()) return nullptr;
    actor_cell* c = global_.front();
    global_.pop_front();
    global_queued_.fetch_sub(1, std::memory_order_relaxed);
    return c;
  };
  // Local work first (cache-warm), but never forever: the global queue gets every 8th turn.
  if (++w.ticks % 8 == 0) {
    if (actor_cell* c = take_global()) return c;
  }
  if (actor_cell* c = take_pinned(w)) return c;
  if (actor_cell* c = take(w, w.queue)) return c;
  if (actor_cell* c = take_global()) return c;
  for (std::size_t i = 1; i < workers_.size(); ++i) {
    worker& victim = *workers_[(w.index + i) % workers_.size()];
    if (actor_cell* c = take(victim, victim.queue)) return c;
  }
  return nullptr;
}

void thread_pool_scheduler::run(worker& w, actor_cell* cell) {
  resume_result r = cell->resume(max_batch_);
  if (r == resume_result::again) {
    // Read before the push: once queued, the cell is the queue's (our count goes with it), and
    // another worker may run it, stop it and free it before the next line here (TSan caught
    // the second pinned_worker() read racing the delete).
    const bool pinned = cell->pinned_worker() >= 0;
    push_back(w, cell, pinned);  // the queue keeps our count
    if (!pinned) notify_if_needed();
    return;
  }
  intrusive_release(cell);
}

void thread_pool_scheduler::park(worker& w) {
  w.parked.store(true, std::memory_order_seq_cst);
  parked_.fetch_add(1, std::memory_order_seq_cst);
  // Re-check after announcing: a producer that pushed before seeing `parked` is caught here.
  if (!has_work(w) && !stopping_.load(std::memory_order_seq_cst)) {
    std::unique_lock lock(w.park_mutex);
    w.park_cv.wait(lock, [&] { return w.wake_token || stopping_.load(); });
    w.wake_token = false;
  }
  parked_.fetch_sub(1, std::memory_order_seq_cst);
  w.parked.store(false, std::memory_order_seq_cst);
}

void thread_pool_scheduler::worker_main(worker& w) {
  tl_pool = this;
  tl_worker = &w;
  bool was_spinning = false;
  while (!stopping_.load(std::memory_order_acquire)) {
    actor_cell* cell = find_work(w);
    if (cell != nullptr && std::exchange(was_spinning, false) && has_work(w)) {
      // We were idle (spinning, or parked and woken) and found work, and more is left. A
      // producer that saw us spinning woke nobody for it, and one that saw us still parked may
      // have woken us, not a sleeping peer; if our turn now runs long (or blocks), that work
      // would wait for us while another worker sleeps. Pass it on (Go's scheduler does the same
      // when its last spinning thread finds work).
      notify_if_needed();
    }
    if (cell == nullptr) {
      spinning_.fetch_add(1, std::memory_order_seq_cst);
      auto until = std::chrono::steady_clock::now() + spin_;
      bool found = false;
      // Pause spin, a sched_yield every `yield_every` checks (see the header): new work is seen
      // within ~100 ns, and a thread queued behind this one on its core runs within a few µs.
      const bool spin = spin_.count() > 0;  // config::spin 0: park at once
      for (unsigned spins = 1; spin && !stopping_.load(std::memory_order_relaxed); ++spins) {
        if ((found = has_work(w))) break;
        if (spins % yield_every != 0) {
          cpu_relax();
          continue;
        }
        if (std::chrono::steady_clock::now() >= until) break;  // the clock at yields only
        std::this_thread::yield();
      }
      spinning_.fetch_sub(1, std::memory_order_seq_cst);
      if (!found) park(w);
      was_spinning = true;
      continue;
    }
    run(w, cell);
  }
  if (w.next != nullptr) intrusive_release(std::exchange(w.next, nullptr));
  tl_pool = nullptr;
  tl_worker = nullptr;
}

void thread_pool_scheduler::stop() {
  if (stopping_.exchange(true)) return;
  for (auto& w : workers_) wake(*w);
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
  auto release_all = [](std::deque<actor_cell*>& q) {
    for (actor_cell* c : q) intrusive_release(c);
    q.clear();
  };
  for (auto& w : workers_) {
    release_all(w->queue);
    release_all(w->pinned);
    for (actor_cell* c = w->inbox.exchange(nullptr); c != nullptr;) {
      actor_cell* next = c->sched_next;
      intrusive_release(c);
      c = next;
    }
  }
  release_all(global_);
}

deterministic_scheduler::~deterministic_scheduler() { stop(); }

void deterministic_scheduler::schedule(actor_cell* cell) noexcept { ready_.push_back(cell); }

bool deterministic_scheduler::run_one() {
  if (ready_.empty()) return false;
  std::size_t i = static_cast<std::size_t>(rng_.uniform(ready_.size()));
  actor_cell* cell = ready_[i];
  // Keep the order of the rest stable (erase, not swap) so only the rng decides.
  ready_.erase(ready_.begin() + static_cast<std::ptrdiff_t>(i));
  if (cell->resume(1) == resume_result::again) {
    ready_.push_back(cell);
  } else {
    intrusive_release(cell);
  }
  return true;
}

void deterministic_scheduler::stop() {
  for (actor_cell* c : ready_) intrusive_release(c);
  ready_.clear();
}

}  // namespace tessera::actors
