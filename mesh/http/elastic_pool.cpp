#include "mesh/http/elastic_pool.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "actors/base/thread.hpp"

namespace tessera::mesh::http {

elastic_pool::elastic_pool(elastic_pool_options options) : opt_(std::move(options)) {
  opt_.max_threads = std::max<std::size_t>(1, opt_.max_threads);
  opt_.min_threads = std::min(opt_.min_threads, opt_.max_threads);
  std::lock_guard lock(mu_);
  while (alive_ < opt_.min_threads)
    start_one();
}

elastic_pool::~elastic_pool() {
  shutdown();
}

void elastic_pool::start_one() {
  std::size_t slot = 0;
  while (slot < running_.size() && running_[slot])
    ++slot;
  if (slot == running_.size()) {
    running_.push_back(false);
    threads_.emplace_back();
  }
  // A thread that left this slot has returned from work() (it cleared the flag last): joining
  // it cannot block for long.
  if (threads_[slot].joinable()) finished_.push_back(std::move(threads_[slot]));
  running_[slot] = true;
  ++alive_;
  peak_ = std::max(peak_, alive_);
  threads_[slot] = std::thread([this, slot] { work(slot); });
}

void elastic_pool::enqueue(std::function<void()> fn) {
  std::vector<std::thread> done;
  {
    std::unique_lock lock(mu_);
    // At the bound the caller (the accept loop) waits; `release` is polled, it has no notify.
    while (opt_.max_queued != 0 && queue_.size() >= opt_.max_queued && !stop_ &&
           (opt_.release == nullptr || !opt_.release->load()))
      space_.wait_for(lock, std::chrono::milliseconds(100));
    queue_.push_back(std::move(fn));
    if (idle_ < queue_.size() && alive_ < opt_.max_threads && !stop_) start_one();
    done.swap(finished_);
  }
  cv_.notify_one();
  for (auto& t : done)
    t.join();
}

void elastic_pool::work(std::size_t slot) {
  name_this_thread(fmt::format("{}-{}", opt_.name_prefix, slot));
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    const bool woke = cv_.wait_for(lock, std::chrono::milliseconds(opt_.idle_exit_ms),
                                   [&] { return stop_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty() && (stop_ || (!woke && alive_ > opt_.min_threads))) break;
    if (queue_.empty()) continue;
    auto fn = std::move(queue_.front());
    queue_.pop_front();
    space_.notify_one();
    lock.unlock();
    fn();
    lock.lock();
  }
  --alive_;
  running_[slot] = false;
}

void elastic_pool::shutdown() {
  std::vector<std::thread> all;
  {
    std::lock_guard lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
    all.swap(threads_);
    for (auto& t : finished_)
      all.push_back(std::move(t));
    finished_.clear();
  }
  cv_.notify_all();
  space_.notify_all();
  for (auto& t : all)
    if (t.joinable()) t.join();
}

std::size_t elastic_pool::threads() const {
  std::lock_guard lock(mu_);
  return alive_;
}

std::size_t elastic_pool::peak_threads() const {
  std::lock_guard lock(mu_);
  return peak_;
}

}  // namespace tessera::mesh::http
