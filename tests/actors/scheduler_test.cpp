// The thread-pool scheduler: pinned actors, the cross-thread hand-off, parking, sender counts.
#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "actors/system.hpp"
#include "tests/actors/test_support.hpp"

namespace tessera::actors {
namespace {
using test::burst;
using test::burster;
using test::counter;
using test::eventually;
using test::ping;
using test::pong;

struct pinned_hold {
  TESSERA_MESSAGE("tessera.test.sched.pinned_hold");
  MSGPACK_DEFINE();
};

/// Blocks its worker in `pinned_hold` until released.
class blocker : public actor {
 public:
  blocker(std::shared_future<void> release, std::atomic<bool>& holding)
      : release_(std::move(release)), holding_(holding) {
    on<pinned_hold>([this](pinned_hold&) {
      holding_ = true;
      release_.wait();
    });
  }

 private:
  std::shared_future<void> release_;
  std::atomic<bool>& holding_;
};

/// Records (its tag, its thread) for every ping.
struct run_log {
  std::mutex mutex;
  std::vector<std::pair<int, std::thread::id>> runs;
  std::size_t size() {
    std::lock_guard lock(mutex);
    return runs.size();
  }
};
class tag_recorder : public actor {
 public:
  tag_recorder(int tag, run_log& log) : tag_(tag), log_(log) {
    on<ping>([this](ping&) {
      std::lock_guard lock(log_.mutex);
      log_.runs.emplace_back(tag_, std::this_thread::get_id());
    });
  }

 private:
  int tag_;
  run_log& log_;
};

config two_workers() {
  config c;
  c.workers = 2;
  return c;
}

spawn_options on_worker(int w) {
  spawn_options o;
  o.worker = w;
  return o;
}

// Regression: a worker used to count another worker's pinned actors as work it could take, so
// it spun on them (taking that worker's lock) instead of parking while that worker was busy.
TEST(Scheduler, IdleWorkerParksWhileAnotherWorkersPinnedActorWaits) {
  actor_system sys(two_workers());
  std::promise<void> release;
  std::atomic<bool> holding{false};
  run_log log;
  auto b = sys.spawn(std::make_unique<blocker>(release.get_future().share(), holding),
                     on_worker(0));
  auto r = sys.spawn(std::make_unique<tag_recorder>(1, log), on_worker(0));
  ASSERT_TRUE(b && r);
  ASSERT_TRUE(sys.send(*b, pinned_hold{}));
  ASSERT_TRUE(eventually([&] { return holding.load(); }));
  ASSERT_TRUE(sys.send(*r, ping{}));  // waits in worker 0's inbox: worker 1 must not take it
  EXPECT_TRUE(eventually([&] { return sys.parked_workers() == 1; }));
  EXPECT_EQ(log.size(), 0u);
  release.set_value();
  ASSERT_TRUE(eventually([&] { return log.size() == 1; }));
  // And with nothing left to run, both workers park.
  EXPECT_TRUE(eventually([&] { return sys.parked_workers() == 2; }));
}

TEST(Scheduler, PinnedActorsRunOnTheirWorkerInArrivalOrder) {
  actor_system sys(two_workers());
  std::promise<void> release;
  std::atomic<bool> holding{false};
  run_log log;
  auto b = sys.spawn(std::make_unique<blocker>(release.get_future().share(), holding),
                     on_worker(0));
  ASSERT_TRUE(b);
  std::vector<actor_ref> pinned;
  for (int i = 0; i < 5; ++i) {
    auto r = sys.spawn(std::make_unique<tag_recorder>(i, log), on_worker(0));
    ASSERT_TRUE(r);
    pinned.push_back(*r);
  }
  // Let every tag_recorder's first turn (on_start) pass before worker 0 is blocked.
  ASSERT_TRUE(eventually([&] { return sys.parked_workers() == 2; }));
  ASSERT_TRUE(sys.send(*b, pinned_hold{}));
  ASSERT_TRUE(eventually([&] { return holding.load(); }));
  for (auto& p : pinned) ASSERT_TRUE(sys.send(p, ping{}));  // all queue in worker 0's inbox
  release.set_value();
  ASSERT_TRUE(eventually([&] { return log.size() == pinned.size(); }));
  std::lock_guard lock(log.mutex);
  for (std::size_t i = 0; i < log.runs.size(); ++i) {
    EXPECT_EQ(log.runs[i].first, static_cast<int>(i)) << "pinned actors ran out of order";
    EXPECT_EQ(log.runs[i].second, log.runs[0].second) << "a pinned actor left its worker";
  }
}

struct volley {
  TESSERA_MESSAGE("tessera.test.sched.volley");
  std::uint64_t left = 0;
  MSGPACK_DEFINE(left);
};
struct peer_is {
  TESSERA_MESSAGE("tessera.test.sched.peer_is");
  actor_ref peer;
  MSGPACK_DEFINE(peer);
};

/// Returns the volley to its peer until it runs out; remembers every thread it ran on.
class player : public actor {
 public:
  player(std::promise<void>& done, std::vector<std::thread::id>& threads)
      : done_(done), threads_(threads) {
    on<peer_is>([this](peer_is& p) { peer_ = p.peer; });
    on<volley>([this](volley& v) {
      if (threads_.empty() || threads_.back() != std::this_thread::get_id()) {
        threads_.push_back(std::this_thread::get_id());
      }
      if (v.left == 0) {
        done_.set_value();
        return;
      }
      (void)send(peer_, volley{v.left - 1});
    });
  }

 private:
  std::promise<void>& done_;
  std::vector<std::thread::id>& threads_;
  actor_ref peer_;
};

TEST(Scheduler, CrossWorkerPingPongStaysOnTwoThreads) {
  actor_system sys(two_workers());
  std::promise<void> done;
  std::vector<std::thread::id> threads_a, threads_b;
  auto a = sys.spawn(std::make_unique<player>(done, threads_a), on_worker(0));
  auto b = sys.spawn(std::make_unique<player>(done, threads_b), on_worker(1));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(sys.send(*a, peer_is{*b}));
  ASSERT_TRUE(sys.send(*b, peer_is{*a}));
  ASSERT_TRUE(sys.send(*a, volley{4000}));  // 2000 round trips, every message cross-thread
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  sys.shutdown();
  ASSERT_EQ(threads_a.size(), 1u);
  ASSERT_EQ(threads_b.size(), 1u);
  EXPECT_NE(threads_a[0], threads_b[0]);
}

// The receiver drops its senders' counts in runs; senders that stopped while their messages
// were queued must still be freed exactly once (ASan: no leak, no use after free).
TEST(Scheduler, FanInFromSendersThatStopCountsEverySenderRefOnce) {
  actor_system sys(two_workers());
  std::atomic<std::uint64_t> seen{0};
  spawn_options big;
  big.data_capacity = 8 * 2000;
  auto sink = sys.spawn(std::make_unique<counter>(seen), big);
  ASSERT_TRUE(sink);
  for (int i = 0; i < 8; ++i) {
    auto s = sys.spawn<burster>();
    ASSERT_TRUE(s);
    ASSERT_TRUE(sys.send(*s, burst{*sink, 2000}));
  }
  ASSERT_TRUE(eventually([&] { return seen.load() == 8u * 2000u; }));
  ASSERT_TRUE(eventually([&] { return sys.live_actors() == 1; }));
}

}  // namespace
}  // namespace tessera::actors
