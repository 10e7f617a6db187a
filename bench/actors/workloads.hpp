// The three actor workloads, written once against Tessera and once against CAF 0.17, so one
// benchmark run compares them (bench/actors/actors_bench.cpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace tessera::bench {

/// One-shot completion signal between an actor and the benchmark thread.
class done_signal {
 public:
  void reset() {
    std::lock_guard lock(mutex_);
    done_ = false;
  }
  void notify() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

/// A running workload: set up once (actors spawned), then run() many times.
class workload {
 public:
  virtual ~workload() = default;
  /// Runs one batch to completion.
  virtual void run() = 0;
};

// Ping-pong: `round_trips` ping -> pong exchanges between two actors per run().
// Placement: by default each runtime places the actors itself (both mostly run the pair on one
// worker). `pinned`: Tessera pins them to workers 0 and 1. `detached`: CAF runs each on a thread
// of its own (CAF 0.17 has no pinning to scheduler workers).
std::unique_ptr<workload> tessera_ping_pong(unsigned threads, std::uint64_t round_trips,
                                            bool pinned);
std::unique_ptr<workload> caf_ping_pong(unsigned threads, std::uint64_t round_trips,
                                        bool detached);
// Fan-in: `senders` actors each send `per_sender` messages to one receiver per run().
std::unique_ptr<workload> tessera_fan_in(unsigned threads, unsigned senders,
                                         std::uint64_t per_sender);
std::unique_ptr<workload> caf_fan_in(unsigned threads, unsigned senders, std::uint64_t per_sender);
// Ring: `actors` actors pass one token `hops` times per run().
std::unique_ptr<workload> tessera_ring(unsigned threads, unsigned actors, std::uint64_t hops);
std::unique_ptr<workload> caf_ring(unsigned threads, unsigned actors, std::uint64_t hops);

}  // namespace tessera::bench
