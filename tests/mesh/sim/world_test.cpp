// The simulated world itself: fault model, bounds, crash/restart, pause, clock skew, clogs, and
// the seeded order of simultaneous events (the actor runtime's deterministic mode).
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "mesh/sim/world.hpp"

namespace tessera::mesh::sim {
namespace {

// Records what it receives and when its timer fires; sends on demand.
class probe_node : public sim_node {
 public:
  void on_start(node_context& ctx) override {
    ++starts;
    if (!ctx.durable().empty()) restored = ctx.durable().front();
    ctx.durable() = {42};
  }
  void on_message(node_context& ctx, const envelope& msg) override {
    received.push_back(msg.payload.empty() ? 0 : msg.payload.front());
    received_at.push_back(ctx.now_ms());
  }
  void on_timer(node_context& ctx) override { fired_at.push_back(ctx.now_ms()); }

  int starts = 0;
  int restored = -1;
  std::vector<int> received;
  std::vector<std::uint64_t> received_at;
  std::vector<std::uint64_t> fired_at;
};

std::unique_ptr<world> make_world(std::size_t n) {
  auto w = std::make_unique<world>(7, [](member_id) { return std::make_unique<probe_node>(); });
  for (member_id i = 1; i <= n; ++i) {
    w->add_node(i);
    w->start(i);
  }
  return w;
}

probe_node& at(world& w, member_id id) { return *dynamic_cast<probe_node*>(w.node(id)); }

void send(world& w, member_id from, member_id to, std::uint8_t tag) {
  w.invoke(from, [&](sim_node&, node_context& ctx) { ctx.send(to, 1, bytes{tag}); });
}

// The world's network is transport/faults' fault_policy: the commands `tessera fault` sends to a
// live cluster act on simulated nodes the same way (nodes named by their decimal id).
TEST(SimWorld, FaultCommandsOfTheLiveClusterDriveTheSimulatedNetwork) {
  auto w = make_world(3);
  auto apply = [&](std::string_view text) {
    auto c = transport::faults::parse_fault_command(text);
    ASSERT_TRUE(c.has_value()) << c.error().describe();
    ASSERT_TRUE(transport::faults::apply(w->faults(), *c).has_value());
  };
  apply("partition 1 -> 2");  // one way
  apply("delay 1->3 40ms");
  send(*w, 1, 2, 1);
  send(*w, 2, 1, 2);
  send(*w, 1, 3, 3);
  w->run_for(20);
  EXPECT_TRUE(at(*w, 2).received.empty());
  EXPECT_EQ(at(*w, 1).received, std::vector<int>{2});
  EXPECT_TRUE(at(*w, 3).received.empty()) << "delayed 40 ms";
  w->run_for(30);
  EXPECT_EQ(at(*w, 3).received, std::vector<int>{3});
  EXPECT_EQ(w->counters().dropped_partition, 1u);
  apply("drop 2->3 1");
  for (int i = 0; i < 10; ++i)
    send(*w, 2, 3, 9);
  w->run_for(10);
  EXPECT_EQ(at(*w, 3).received.size(), 1u);
  EXPECT_EQ(w->counters().dropped_random, 10u);
  apply("heal");
  apply("clear");
  send(*w, 1, 2, 4);
  w->run_for(10);
  EXPECT_EQ(at(*w, 2).received, std::vector<int>{4});
}

TEST(SimWorld, PausedBacklogIsBoundedAndDropsAreCounted) {
  auto w = make_world(2);
  w->pause(2);
  const std::size_t extra = 25;
  for (std::size_t i = 0; i < world::max_paused_backlog + extra; ++i) send(*w, 1, 2, 1);
  w->run_for(100);
  EXPECT_TRUE(at(*w, 2).received.empty());
  EXPECT_EQ(w->counters().dropped_overflow, extra);
  w->resume(2);
  w->run_for(1);
  EXPECT_EQ(at(*w, 2).received.size(), world::max_paused_backlog);
}

TEST(SimWorld, PartitionsOneWayAndBridgeBlockTheRightLinks) {
  auto w = make_world(5);
  w->partition({{1, 2}, {3, 4, 5}});
  send(*w, 1, 3, 1);
  send(*w, 1, 2, 2);
  w->run_for(10);
  EXPECT_TRUE(at(*w, 3).received.empty());
  EXPECT_EQ(at(*w, 2).received, std::vector<int>{2});
  EXPECT_EQ(w->clean_partition().size(), 2u);

  w->heal();
  w->block(1, 3);
  send(*w, 1, 3, 3);
  send(*w, 3, 1, 4);
  w->run_for(10);
  EXPECT_TRUE(at(*w, 3).received.empty());
  EXPECT_EQ(at(*w, 1).received, std::vector<int>{4});
  EXPECT_TRUE(w->clean_partition().empty());

  w->bridge({1, 2}, 3, {4, 5});
  EXPECT_FALSE(w->can_deliver(1, 4));
  EXPECT_FALSE(w->can_deliver(5, 2));
  EXPECT_TRUE(w->can_deliver(1, 3));
  EXPECT_TRUE(w->can_deliver(3, 5));
  EXPECT_TRUE(w->can_deliver(1, 2));
}

// A clog holds messages from and to the node (nothing lost); they arrive once both ends are
// unclogged, in the order they were held; a partition in force then still applies.
TEST(SimWorld, ClogHoldsMessagesUntilBothEndsAreUnclogged) {
  auto w = make_world(3);
  w->clog(2);
  w->clog(3);
  send(*w, 1, 2, 1);
  send(*w, 2, 1, 2);
  send(*w, 2, 3, 3);
  w->run_for(5);
  send(*w, 1, 2, 4);
  w->run_for(100);
  EXPECT_TRUE(at(*w, 1).received.empty());
  EXPECT_TRUE(at(*w, 2).received.empty());
  EXPECT_EQ(w->counters().clogged, 4u);
  w->unclog(2);
  w->run_for(10);
  EXPECT_EQ(at(*w, 2).received, (std::vector<int>{1, 4}));  // held order kept
  EXPECT_EQ(at(*w, 1).received, std::vector<int>{2});
  EXPECT_TRUE(at(*w, 3).received.empty());  // 3 is still clogged
  w->partition({{1, 2}, {3}});
  w->heal();  // unclogs 3 too
  w->run_for(10);
  EXPECT_EQ(at(*w, 3).received, std::vector<int>{3});
  EXPECT_FALSE(w->is_clogged(3));
  EXPECT_EQ(w->counters().dropped_partition + w->counters().dropped_random, 0u);

  w->clog(1);
  send(*w, 1, 2, 5);
  w->run_for(10);
  w->partition({{1}, {2, 3}});
  w->unclog(1);  // released into a partition: lost like any message crossing it
  w->run_for(10);
  EXPECT_EQ(at(*w, 2).received, (std::vector<int>{1, 4}));
  EXPECT_EQ(w->counters().dropped_partition, 1u);
}

// The world runs on the actor runtime's deterministic mode: events due at the same instant reach
// their nodes (actors) in an order the seed picks — every order occurs over seeds, and a seed
// always picks the same one.
TEST(SimWorld, SimultaneousEventsRunInTheOrderTheSeedPicks) {
  std::vector<member_id> order;
  class logging_node : public sim_node {
   public:
    logging_node(member_id self, std::vector<member_id>& log) : self_(self), log_(log) {}
    void on_start(node_context&) override {}
    void on_message(node_context&, const envelope&) override { log_.push_back(self_); }
    void on_timer(node_context&) override {}

   private:
    member_id self_;
    std::vector<member_id>& log_;
  };
  auto first_of = [&](std::uint64_t seed) {
    order.clear();
    world w(seed, [&](member_id id) { return std::make_unique<logging_node>(id, order); });
    for (member_id i = 1; i <= 4; ++i) {
      w.add_node(i);
      w.start(i);
    }
    w.set_link_faults(link_faults{5, 5, 0, 0});  // no jitter: all arrive at t = 5
    w.invoke(1, [](sim_node&, node_context& ctx) {
      for (member_id to : {2, 3, 4}) ctx.send(to, 1, bytes{1});
    });
    w.run_for(10);
    EXPECT_EQ(order.size(), 3u);
    return order.empty() ? no_member : order.front();
  };
  std::set<member_id> firsts;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const member_id f = first_of(seed);
    EXPECT_EQ(first_of(seed), f) << "seed " << seed << " did not replay";
    firsts.insert(f);
  }
  EXPECT_EQ(firsts, (std::set<member_id>{2, 3, 4}));
}

TEST(SimWorld, CrashLosesVolatileStateAndInFlightMessagesButKeepsDurableBytes) {
  auto w = make_world(2);
  send(*w, 1, 2, 9);
  w->crash(2);
  EXPECT_FALSE(w->is_up(2));
  w->run_for(10);
  EXPECT_EQ(w->counters().dropped_down, 1u);
  w->restart(2);
  w->run_for(10);
  EXPECT_EQ(at(*w, 2).starts, 1);
  EXPECT_TRUE(at(*w, 2).received.empty());  // the message to the old life is gone
  EXPECT_EQ(at(*w, 2).restored, 42);        // durable bytes survived
}

TEST(SimWorld, ClockSkewConvertsTimersToTheNodesLocalTime) {
  auto w = make_world(1);
  w->set_clock(1, 1000, 100'000);  // offset 1 s, runs 10% fast
  w->invoke(1, [](sim_node&, node_context& ctx) { ctx.set_timer(ctx.now_ms() + 110); });
  w->run_for(200);
  ASSERT_EQ(at(*w, 1).fired_at.size(), 1u);
  EXPECT_GE(at(*w, 1).fired_at[0], 1000u + 110u);  // never early in local time
  EXPECT_LE(at(*w, 1).fired_at[0], 1000u + 112u);  // ~100 global ms later
}

// A clock fault mid-run: the clock continues from the time it shows, jumps, runs at the new rate,
// and the node's pending timer is looked at again (it is due at another global time now).
TEST(SimWorld, ClockFaultJumpsAndRunsFastButNeverGoesBack) {
  auto w = make_world(1);
  w->run_for(100);
  w->invoke(1, [](sim_node&, node_context& ctx) { ctx.set_timer(ctx.now_ms() + 5000); });
  const std::uint64_t before = w->local_time(1, w->now_ms());
  w->skew_clock(1, 1'000'000, 2000);  // twice as fast, 2 s forward
  EXPECT_EQ(w->local_time(1, w->now_ms()), before + 2000);
  w->run_for(100);
  EXPECT_EQ(w->local_time(1, w->now_ms()), before + 2200);
  w->run_for(1500);  // local +3000 more: the 5 s timer (3 s after the jump) is due
  ASSERT_FALSE(at(*w, 1).fired_at.empty());
  EXPECT_GE(at(*w, 1).fired_at.back(), before + 5000);
  const std::uint64_t t = w->local_time(1, w->now_ms());
  w->skew_clock(1, 0, 0);  // back to the real rate: no step back
  EXPECT_EQ(w->local_time(1, w->now_ms()), t);
  w->run_for(10);
  EXPECT_EQ(w->local_time(1, w->now_ms()), t + 10);
}

TEST(SimWorld, DropAndDuplicateFollowTheConfiguredRates) {
  auto w = make_world(2);
  w->set_link_faults(link_faults{1, 5, 500'000, 500'000});
  for (int i = 0; i < 1000; ++i) send(*w, 1, 2, 1);
  w->run_for(100);
  const auto& c = w->counters();
  EXPECT_GT(c.dropped_random, 400u);
  EXPECT_LT(c.dropped_random, 600u);
  EXPECT_GT(c.duplicated, 200u);
  EXPECT_EQ(at(*w, 2).received.size(), 1000 - c.dropped_random + c.duplicated);
}

}  // namespace
}  // namespace tessera::mesh::sim
