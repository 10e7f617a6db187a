// Deterministic mode: one thread, virtual clock, seeded order; whole scenarios replay from a seed.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "actors/supervisor.hpp"
#include "actors/system.hpp"
#include "tests/actors/test_support.hpp"

namespace tessera::actors {
namespace {
using namespace std::chrono_literals;
using test::boom;
using test::echo;
using test::ping;
using test::pong;
using test::tick;

config deterministic(std::uint64_t seed) {
  config c;
  c.mode = run_mode::deterministic;
  c.seed = seed;
  return c;
}

struct gossip {
  TESSERA_MESSAGE("tessera.test.gossip");
  std::uint32_t hops = 0;
  MSGPACK_DEFINE(hops);
};

/// A peer that forwards gossip to random peers, asks a random peer with a short deadline on
/// every tick, and sometimes fails (its supervisor restarts it).
class peer : public actor {
 public:
  explicit peer(std::vector<std::string> names) : names_(std::move(names)) {
    on<gossip>([this](gossip& g) {
      if (g.hops == 0) return;
      auto to = system().lookup(names_[random().uniform(names_.size())]);
      if (to) (void)send(*to, gossip{g.hops - 1});
      if (random().uniform(20) == 0) throw std::runtime_error("random crash");
    });
    on<tick>([this](tick&) {
      for (auto& p : held_) (void)p.deliver(pong{0});  // late: some deadlines have passed
      held_.clear();
      auto to = system().lookup(names_[random().uniform(names_.size())]);
      if (!to) return;
      (void)request<pong>(*to, ping{random().uniform(1000)}, 3ms, [](result<pong>) {});
    });
    on<ping>([this](ping& p) {
      switch (random().uniform(3)) {
        case 0: (void)defer_reply<pong>().fail(error{errc::no_capacity, "busy"}); break;
        case 1: held_.push_back(defer_reply<pong>()); break;
        default: (void)defer_reply<pong>().deliver(pong{p.seq});
      }
    });
  }
  void on_start() override {
    every(std::chrono::milliseconds(1 + random().uniform(5)), tick{});
  }

 private:
  std::vector<std::string> names_;
  std::vector<reply_promise<pong>> held_;
};

std::vector<std::string> run_scenario(std::uint64_t seed) {
  std::vector<std::string> trace;
  config c = deterministic(seed);
  actor_system* sys_ptr = nullptr;
  c.trace = [&](const trace_event& e) {
    trace.push_back(fmt::format("{} {}<-{} {:x} {}", e.time.time_since_epoch().count(), e.receiver,
                                e.sender.id(), e.type_id, static_cast<int>(e.kind)));
  };
  actor_system sys(c);
  sys_ptr = &sys;
  std::vector<std::string> names{"p0", "p1", "p2", "p3", "p4"};
  std::vector<child_spec> children;
  for (auto& n : names) {
    children.push_back({n, [names] { return std::make_unique<peer>(names); }, {}});
  }
  auto sup = sys.spawn<supervisor>(
      supervisor_spec{.max_restarts = 1000, .backoff_initial = 2ms}, std::move(children));
  EXPECT_TRUE(sup);
  sys.run_until_idle();
  for (std::uint32_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(sys.send(*sys_ptr->lookup(names[i]), gossip{40}));
  }
  sys.advance(50ms);
  EXPECT_GT(sys.stats().late_replies, 0u);
  sys.shutdown();
  return trace;
}

TEST(Deterministic, SameSeedReplaysTheSameTrace) {
  auto a = run_scenario(42);
  auto b = run_scenario(42);
  // The scenario exercised timers, request deadlines, failures and restarts.
  auto count = [&](const std::string& needle) {
    return std::count_if(a.begin(), a.end(),
                         [&](const std::string& e) { return e.find(needle) != std::string::npos; });
  };
  EXPECT_GT(count(fmt::format(" {:x} 16", tick::type_id)), 20);       // periodic timers
  EXPECT_GT(count(" 17"), 0);                                         // request deadlines
  EXPECT_GT(count(fmt::format(" {:x} ", child_exit::type_id)), 0);    // failures
  EXPECT_GT(count(fmt::format(" {:x} 3", error_reply::type_id)), 0);  // error replies
  EXPECT_EQ(a, b);
}

TEST(Deterministic, DifferentSeedsInterleaveDifferently) {
  auto base = run_scenario(42);
  int differing = 0;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) differing += run_scenario(seed) != base;
  EXPECT_GT(differing, 0);
}

TEST(Deterministic, VirtualTimeDrivesTimersInOrderAndCancelStopsThem) {
  actor_system sys(deterministic(1));
  std::vector<std::string> seen;
  struct timed : actor {
    explicit timed(std::vector<std::string>& seen) {
      on<tick>([this, &seen](tick& t) {
        seen.push_back(fmt::format("{}@{}", t.n, now().time_since_epoch() / 1ms));
        if (t.n == 1 && ++periodic_count_ == 3) cancel_timer(periodic_);
      });
    }
    void on_start() override {
      periodic_ = every(10ms, tick{1});
      after(25ms, tick{2});
      timer_id never = after(5ms, tick{3});
      cancel_timer(never);
    }
    timer_id periodic_ = 0;
    int periodic_count_ = 0;
  };
  ASSERT_TRUE(sys.spawn<timed>(seen));
  sys.advance(100ms);
  EXPECT_EQ(seen, (std::vector<std::string>{"1@10", "1@20", "2@25", "1@30"}));
  EXPECT_EQ(sys.active_timers(), 0u);
  EXPECT_EQ(sys.clock().now().time_since_epoch(), 100ms);
}

TEST(Deterministic, RequestTimeoutInVirtualTimeLeavesNothingBehind) {
  actor_system sys(deterministic(3));
  struct never_answers : actor {
    never_answers() {
      on<ping>([this](ping&) { kept_.push_back(defer_reply<pong>()); });
    }
    std::vector<reply_promise<pong>> kept_;
  };
  auto mute = sys.spawn<never_answers>();
  auto r = sys.ask<pong>(*mute, ping{1}, 250ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::timeout);
  EXPECT_EQ(sys.clock().now().time_since_epoch(), 250ms);
  sys.run_until_idle();
  EXPECT_EQ(sys.pending_requests(), 0u);
  EXPECT_EQ(sys.active_timers(), 0u);
  EXPECT_EQ(sys.live_actors(), 1u);  // the asker is gone
}

TEST(Deterministic, ShutdownFailsPendingRequests) {
  actor_system sys(deterministic(9));
  struct never_answers : actor {
    never_answers() {
      on<ping>([this](ping&) { kept_.push_back(defer_reply<pong>()); });
    }
    std::vector<reply_promise<pong>> kept_;
  };
  auto mute = sys.spawn<never_answers>();
  std::vector<result<pong>> outcomes;
  ASSERT_TRUE(sys.request<pong>(*mute, ping{1}, 1h,
                                [&](result<pong> r) { outcomes.push_back(std::move(r)); }));
  sys.run_until_idle();
  EXPECT_EQ(sys.pending_requests(), 1u);
  sys.shutdown();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].error().code, errc::closed);
  EXPECT_EQ(sys.pending_requests(), 0u);
}

}  // namespace
}  // namespace tessera::actors
