#include "actors/timer_service.hpp"

#include "actors/base/thread.hpp"

namespace tessera::actors {

timer_service::timer_service(const clock& clk, bool threaded) : clock_(clk) {
  if (threaded) thread_ = std::thread([this] { thread_main(); });
}

timer_service::~timer_service() { stop(); }

timer_id timer_service::schedule(clock::time_point when, clock::duration period, fire_fn fn) {
  std::lock_guard lock(mutex_);
  timer_id id = next_id_++;
  if (stopping_) return id;  // never fires; the system refuses the message anyway
  bool earliest = queue_.empty() || std::pair{when, id} < queue_.begin()->first;
  queue_.emplace(std::pair{when, id}, true);
  entries_.emplace(id, entry{when, period, std::move(fn)});
  if (earliest) cv_.notify_one();
  return id;
}

bool timer_service::cancel(timer_id id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  queue_.erase({it->second.when, id});  // absent while firing; after_fire sees the erase
  entries_.erase(it);
  return true;
}

std::optional<clock::time_point> timer_service::next_due() const {
  std::lock_guard lock(mutex_);
  if (queue_.empty()) return std::nullopt;
  return queue_.begin()->first.first;
}

bool timer_service::pop_due(clock::time_point now, timer_id& id, entry*& out) {
  if (queue_.empty() || queue_.begin()->first.first > now) return false;
  id = queue_.begin()->first.second;
  queue_.erase(queue_.begin());
  out = &entries_.at(id);
  return true;
}

void timer_service::after_fire(timer_id id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;  // cancelled while firing
  if (it->second.period <= clock::duration::zero() || stopping_) {
    entries_.erase(it);
    return;
  }
  it->second.when += it->second.period;
  queue_.emplace(std::pair{it->second.when, id}, true);
}

std::size_t timer_service::fire_due(clock::time_point now) {
  std::size_t fired = 0;
  std::unique_lock lock(mutex_);
  timer_id id = 0;
  entry* e = nullptr;
  while (pop_due(now, id, e)) {
    fire_fn fn = e->fn;  // copy: the entry may be cancelled while fn runs
    lock.unlock();
    fn(id);
    ++fired;
    lock.lock();
    after_fire(id);
  }
  return fired;
}

void timer_service::thread_main() {
  name_this_thread("actor-timer");
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (queue_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto due = queue_.begin()->first.first;
    if (due > clock_.now()) {
      cv_.wait_until(lock, due);
      continue;
    }
    timer_id id = 0;
    entry* e = nullptr;
    while (!stopping_ && pop_due(clock_.now(), id, e)) {
      fire_fn fn = e->fn;
      lock.unlock();
      fn(id);
      lock.lock();
      after_fire(id);
    }
  }
}

void timer_service::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
    entries_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::size_t timer_service::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace tessera::actors
