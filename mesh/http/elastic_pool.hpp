// The HTTP gateway's handler threads: a pool that grows with the connections it is given and
// shrinks back when they go.
//
// Why not cpp-httplib's own ThreadPool: it starts all of its threads at once and keeps them, and a
// connection holds its thread for as long as it stays open (keep-alive, or a token stream), so the
// pool must be as large as the connections it should serve at once (40). An idle node then had
// 41 parked HTTP threads out of 53 (issue 30). This pool starts `min_threads`, adds one whenever a
// connection arrives and every thread is busy (up to `max_threads`), and a thread that had nothing
// to do for `idle_exit_ms` leaves (never below `min_threads`). Threads are named `<prefix>-<slot>`.
//
// Bounds: at most `max_threads` threads, and `max_queued` tasks waiting for one. A queued task
// owns an accepted socket, which only the task closes, so it cannot be refused here without
// leaking its descriptor: at the bound, enqueue() waits instead. The accept loop that calls it
// then stops accepting, and further connections wait in the kernel's listen backlog, holding no
// descriptor of ours (issue 32: connections a stranger holds must not take the descriptors the
// control plane needs). `release` (when set) ends such waits: at shutdown every task is taken.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::mesh::http {

struct elastic_pool_options {
  std::size_t min_threads = 1;
  std::size_t max_threads = 40;
  std::uint32_t idle_exit_ms = 10'000;
  std::string name_prefix = "http";
  std::size_t max_queued = 0;  ///< 0: unbounded
  const std::atomic<bool>* release = nullptr;
};

class elastic_pool {
 public:
  explicit elastic_pool(elastic_pool_options options);
  ~elastic_pool();
  elastic_pool(const elastic_pool&) = delete;
  elastic_pool& operator=(const elastic_pool&) = delete;

  /// Queues `fn`; starts a thread for it when none is free and the bound allows.
  void enqueue(std::function<void()> fn);
  /// Runs what is queued, then joins every thread. Idempotent.
  void shutdown();

  /// Threads alive now, and the most there ever were (for tests and status).
  [[nodiscard]] std::size_t threads() const;
  [[nodiscard]] std::size_t peak_threads() const;

 private:
  void start_one();  // under mu_
  void work(std::size_t slot);

  elastic_pool_options opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable space_;  // a queued task was taken (enqueue waits at max_queued)
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;   // by slot; a slot whose thread left is reused
  std::vector<bool> running_;          // by slot
  std::vector<std::thread> finished_;  // left their slot, joined by the next start or shutdown
  std::size_t alive_ = 0, idle_ = 0, peak_ = 0;
  bool stop_ = false;
};

}  // namespace tessera::mesh::http
