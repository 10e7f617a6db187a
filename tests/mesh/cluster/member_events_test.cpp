// Membership changes delivered to a subscribing actor, for real: a node runtime in this process
// (with its own actor system) joins two `tessera node` processes; an actor subscribed to it hears
// the members it starts with, then `suspect` and `dead` for the peer that is SIGKILLed and `left`
// for the one that gets SIGTERM (a graceful leave: at once, not after a timeout).
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "actors/system.hpp"
#include "mesh/runtime/runtime.hpp"
#include "tests/mesh/cluster/cluster_fixture.hpp"

namespace tessera::mesh::runtime {
namespace {

using namespace std::chrono_literals;
using test::cluster_fixture;

/// What the watcher actor heard, readable from the test thread.
struct heard {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<member_changed> events;

  /// Waits until an event for `node` with `status` arrived (the non-initial ones when `live`).
  bool wait_for(const std::string& node, const std::string& status, bool live,
                std::chrono::milliseconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] {
      for (const auto& e : events)
        if (e.node == node && e.status == status && (!live || !e.initial)) return true;
      return false;
    });
  }
  std::vector<std::string> statuses_of(const std::string& node) {
    std::lock_guard lock(mu);
    std::vector<std::string> out;
    for (const auto& e : events)
      if (e.node == node) out.push_back(e.status);
    return out;
  }
};

class watcher : public actors::actor {
 public:
  explicit watcher(heard* h) {
    on<member_changed>([h](member_changed& m) {
      {
        std::lock_guard lock(h->mu);
        h->events.push_back(m);
      }
      h->cv.notify_all();
    });
  }
};

/// A node configuration for this process on the ports of the fixture's slot `i` (which the
/// fixture does not start): no HTTP, no mDNS or beacons, one compute thread.
node_config in_process(cluster_fixture& cluster, std::size_t i) {
  node_config cfg;
  cfg.data_dir = cluster.dir() + "/in-process";
  cfg.cluster_key_file = cluster.key_file();
  cfg.listen.address = "127.0.0.1";
  const auto port = cluster.node(i).port;
  cfg.listen.control_port = port;
  cfg.listen.bulk_port = static_cast<std::uint16_t>(port + 1);
  cfg.listen.client_request_port = static_cast<std::uint16_t>(port + 2);
  cfg.listen.client_response_port = static_cast<std::uint16_t>(port + 3);
  cfg.http.enabled = false;
  cfg.discovery.mdns = false;
  cfg.discovery.beacon = false;
  cfg.threads = 1;
  return cfg;
}

TEST(MemberEvents, ASubscribedActorHearsAliveSuspectDeadAndLeft) {
  auto c = cluster_fixture::create(TESSERA_BINARY, 2);
  ASSERT_TRUE(c) << c.error().describe();
  auto& cluster = *c;
  const std::size_t mine = cluster.add_node();  // its ports; this process runs it
  ASSERT_TRUE(cluster.start(0));
  ASSERT_TRUE(cluster.start(1));

  node_config cfg = in_process(cluster, mine);
  cfg.discovery.seeds = {cluster.node(0).endpoint(), cluster.node(1).endpoint()};
  // The fixture's timeouts (a 2-core machine shared with parallel builds).
  cfg.timeouts.heartbeat_interval_ms = 200;
  cfg.timeouts.suspect_timeout_ms = 1500;
  cfg.timeouts.dead_timeout_ms = 3000;
  cfg.timeouts.election_timeout_min_ms = 1000;
  cfg.timeouts.election_timeout_max_ms = 2000;
  auto rt = node_runtime::start(runtime_options{cfg});
  ASSERT_TRUE(rt) << rt.error().describe();

  heard h;
  actors::actor_system sys(actors::config{.workers = 1});
  auto w = sys.spawn<watcher>(&h);
  ASSERT_TRUE(w);
  ASSERT_TRUE((*rt)->subscribe_members(sys, *w));

  // The snapshot holds this node (alive); the two processes come alive as membership meets them.
  // The processes write their node.id at start: wait for both.
  std::string a, b;
  for (int i = 0; i < 100 && (a.empty() || b.empty()); ++i) {
    a = cluster.node_id(0);
    b = cluster.node_id(1);
    if (a.empty() || b.empty()) std::this_thread::sleep_for(100ms);
  }
  ASSERT_FALSE(a.empty() || b.empty()) << cluster.logs();
  const std::string self = (*rt)->node_id();
  ASSERT_TRUE(h.wait_for(self, "alive", false, 5s));
  {
    std::lock_guard lock(h.mu);
    ASSERT_FALSE(h.events.empty());
    EXPECT_TRUE(h.events.front().initial);
    EXPECT_EQ(h.events.front().node, self);
    EXPECT_EQ(h.events.front().member.size(), 16u);
  }
  ASSERT_TRUE(h.wait_for(a, "alive", false, 30s)) << cluster.logs();
  ASSERT_TRUE(h.wait_for(b, "alive", false, 30s)) << cluster.logs();

  // SIGKILL: silence, then suspicion, then death (suspect 1.5 s + dead 3 s here).
  cluster.kill9(0);
  ASSERT_TRUE(h.wait_for(a, "suspect", true, 15s)) << cluster.logs();
  ASSERT_TRUE(h.wait_for(a, "dead", true, 15s)) << cluster.logs();
  auto seq = h.statuses_of(a);
  ASSERT_GE(seq.size(), 3u);
  EXPECT_EQ(seq[seq.size() - 2], "suspect");
  EXPECT_EQ(seq.back(), "dead");

  // SIGTERM: the peer says it leaves; heard well before any timeout could declare it dead.
  const auto t0 = std::chrono::steady_clock::now();
  cluster.term(1);
  ASSERT_TRUE(h.wait_for(b, "left", true, 15s)) << cluster.logs();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 1500ms) << "a graceful leave took as long as a failure timeout";
  for (const auto& st : h.statuses_of(b)) EXPECT_NE(st, "dead");

  // The node's status counts the deliveries; after unsubscribing nothing more is sent.
  auto st = cluster.status(mine);
  ASSERT_TRUE(st);
  EXPECT_EQ((*st)["stats"]["member_subscribers"], 1);
  // Control links follow the configured suspicion timeout (1.5 s here; 1 s at least).
  EXPECT_EQ((*st)["node"]["link_dead_after_ms"], 1500);
  EXPECT_GE((*st)["stats"]["member_events_sent"].get<int>(), 5);
  (*rt)->unsubscribe_members(*w);
  for (int i = 0; i < 50; ++i) {
    st = cluster.status(mine);
    if (st && (*st)["stats"]["member_subscribers"] == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(st);
  EXPECT_EQ((*st)["stats"]["member_subscribers"], 0);
  (*rt)->leave_and_stop(500);
  auto late = (*rt)->subscribe_members(sys, *w);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, errc::closed);
}

TEST(MemberEvents, SubscriptionsAreBounded) {
  auto c = cluster_fixture::create(TESSERA_BINARY, 1);
  ASSERT_TRUE(c) << c.error().describe();
  auto rt = node_runtime::start(runtime_options{in_process(*c, 0)});
  ASSERT_TRUE(rt) << rt.error().describe();
  heard h;
  actors::actor_system sys(actors::config{.workers = 1});
  auto w = sys.spawn<watcher>(&h);
  ASSERT_TRUE(w);
  for (std::size_t i = 0; i < kMaxMemberSubscribers; ++i)
    ASSERT_TRUE((*rt)->subscribe_members(sys, *w)) << i;
  auto over = (*rt)->subscribe_members(sys, *w);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, errc::overloaded);
  EXPECT_NE(over.error().message.find("64 membership subscriptions"), std::string::npos)
      << over.error().message;
  // Unsubscribing (all 64 are the one actor) frees the places once the loop thread handled it.
  (*rt)->unsubscribe_members(*w);
  bool again = false;
  for (int i = 0; i < 50 && !again; ++i) {
    again = static_cast<bool>((*rt)->subscribe_members(sys, *w));
    if (!again) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(again);
  (*rt)->leave_and_stop(200);
}

}  // namespace
}  // namespace tessera::mesh::runtime
