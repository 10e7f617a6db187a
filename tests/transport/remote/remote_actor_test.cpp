// Remote actors over the real control plane: two actor systems in one process, each with its own
// control node on tcp loopback with CURVE keys from the test cluster secret.
#include <gtest/gtest.h>

#include "tests/transport/remote/test_support.hpp"
#include "transport/remote/control_router.hpp"

namespace tessera::transport::remote {
namespace {
using namespace std::chrono_literals;
using actors::actor_ref;
using actors::actor_system;
using test::down_log;
using test::ping;
using test::pong;
using test::wait_for;

actors::config sys_config(actors::node_id id) {
  actors::config c;
  c.node = id;
  c.workers = 2;
  return c;
}

bool peer_up(control::control_node& n, const std::string& peer) {
  for (const auto& p : n.peers()) {
    if (p.id == peer) return p.state == control::link_state::up;
  }
  return false;
}

struct two_nodes : ::testing::Test {
  actor_system a{sys_config(1)};
  actor_system b{sys_config(2)};
  std::unique_ptr<remote_node> ra, rb;

  void SetUp() override {
    auto na = remote_node::start(a, test::control_config("node-1", test::kSecretHex));
    auto nb = remote_node::start(b, test::control_config("node-2", test::kSecretHex));
    ASSERT_TRUE(na) << na.error().describe();
    ASSERT_TRUE(nb) << nb.error().describe();
    ra = std::move(*na);
    rb = std::move(*nb);
    ASSERT_TRUE(ra->add_node(2, "node-2", rb->endpoint()));
    ASSERT_TRUE(rb->add_node(1, "node-1", ra->endpoint()));
    ASSERT_TRUE(wait_for([&] {
      return peer_up(ra->control(), "node-2") && peer_up(rb->control(), "node-1");
    }));
  }
  void TearDown() override {
    a.shutdown();
    b.shutdown();
    if (ra) ra->stop();
    if (rb) rb->stop();
  }
};

TEST_F(two_nodes, UnmappedNodeHasNoRoute) {
  auto r = a.send(actor_ref(9, 1), ping{1});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::not_found);
  EXPECT_NE(r.error().message.find("node 9"), std::string::npos) << r.error().message;
}

TEST_F(two_nodes, RequestToAnUnknownRemoteActorFailsWithNotFound) {
  auto r = a.ask<pong>(actor_ref(2, 424242), ping{1}, 30s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::not_found);
  EXPECT_NE(r.error().message.find("424242"), std::string::npos) << r.error().message;
}

TEST_F(two_nodes, OneWayMessagesArrive) {
  std::atomic<std::uint64_t> seen{0};
  auto e = b.spawn<test::echo>(&seen);
  ASSERT_TRUE(e);
  const actor_ref remote(2, e->id());  // what node 1 learns from the wire: no local cell
  for (int i = 0; i < 200; ++i) {
    auto r = a.send(remote, ping{static_cast<std::uint64_t>(i)});
    ASSERT_TRUE(r) << r.error().describe();
  }
  ASSERT_TRUE(wait_for([&] { return seen.load() == 200; })) << seen.load();
  EXPECT_GE(ra->router().stats().envelopes_sent, 200u);
}

TEST_F(two_nodes, RequestResponseCrossesNodes) {
  auto e = b.spawn<test::echo>();
  ASSERT_TRUE(e);
  for (std::uint64_t i = 1; i <= 20; ++i) {
    auto r = a.ask<pong>(actor_ref(2, e->id()), ping{i}, 30s);
    ASSERT_TRUE(r) << r.error().describe();
    EXPECT_EQ(r->seq, i);
  }
  EXPECT_TRUE(wait_for([&] { return ra->router().tracked_requests() == 0; }));
}

TEST_F(two_nodes, DeadlineExpiresWhenTheRemoteActorNeverAnswers) {
  auto s = b.spawn<test::silent>();
  ASSERT_TRUE(s);
  auto r = a.ask<pong>(actor_ref(2, s->id()), ping{1}, 300ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::timeout) << r.error().describe();
}

TEST_F(two_nodes, RemoteActorStopsAndTheWatcherGetsDownWithTheRealReason) {
  auto e = b.spawn<test::echo>();
  ASSERT_TRUE(e);
  down_log log;
  auto w = a.spawn<test::watcher>(log);
  ASSERT_TRUE(w);
  const actor_ref remote(2, e->id());
  ASSERT_TRUE(a.monitor(remote, *w));
  EXPECT_EQ(ra->router().watch_count(), 1u);
  // The watch and `die` travel the same link in order: the watch is in place before the stop.
  ASSERT_TRUE(a.send(remote, test::die{"disk on fire"}));
  ASSERT_TRUE(wait_for([&] { return log.size() == 1; }));
  auto d = log.all().front();
  EXPECT_EQ(d.who, remote);
  EXPECT_EQ(d.reason.kind, actors::exit_kind::failed);
  EXPECT_EQ(d.reason.detail, "disk on fire");
  EXPECT_TRUE(wait_for([&] { return ra->router().watch_count() == 0; }));
}

TEST_F(two_nodes, MonitoringAMissingRemoteActorGivesDownAtOnce) {
  down_log log;
  auto w = a.spawn<test::watcher>(log);
  ASSERT_TRUE(w);
  ASSERT_TRUE(a.monitor(actor_ref(2, 999999), *w));
  ASSERT_TRUE(wait_for([&] { return log.size() == 1; }));
  EXPECT_EQ(log.all().front().reason.detail, "no such actor");
}

TEST_F(two_nodes, MonitoringAnActorOnAnUnmappedNodeGivesDownAtOnce) {
  down_log log;
  auto w = a.spawn<test::watcher>(log);
  ASSERT_TRUE(w);
  ASSERT_TRUE(a.monitor(actor_ref(9, 1), *w));
  ASSERT_TRUE(wait_for([&] { return log.size() == 1; }));
  EXPECT_NE(log.all().front().reason.detail.find("no route to node 9"), std::string::npos);
}

TEST_F(two_nodes, PeerLossSendsDownsAndFailsPendingRequestsBeforeTheirDeadline) {
  auto e = b.spawn<test::echo>();
  auto s = b.spawn<test::silent>();
  ASSERT_TRUE(e && s);
  down_log log;
  auto w = a.spawn<test::watcher>(log);
  ASSERT_TRUE(w);
  ASSERT_TRUE(a.monitor(actor_ref(2, e->id()), *w));
  ASSERT_TRUE(a.monitor(actor_ref(2, s->id()), *w));
  std::promise<result<pong>> answer;
  auto future = answer.get_future();
  // A deadline far beyond the test's waits: only the loss of node 2 can end this request in time.
  ASSERT_TRUE(a.request<pong>(actor_ref(2, s->id()), ping{1}, std::chrono::hours(1),
                              [&answer](result<pong> r) { answer.set_value(std::move(r)); }));
  ASSERT_TRUE(wait_for([&] { return ra->router().tracked_requests() == 1; }));
  rb->stop();  // node 2's control plane goes away: silence, then peer down on node 1
  ASSERT_TRUE(wait_for([&] { return log.size() == 2; })) << log.size();
  for (const auto& d : log.all()) {
    EXPECT_EQ(d.reason.kind, actors::exit_kind::unknown);
    EXPECT_EQ(d.reason.detail.rfind("node 2 lost: ", 0), 0u) << d.reason.detail;
  }
  ASSERT_EQ(future.wait_for(test::kWait), std::future_status::ready);
  auto r = future.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::closed);
  EXPECT_NE(r.error().message.find("node 2 lost"), std::string::npos) << r.error().message;
  // While node 2 is lost, new requests fail at once instead of waiting for their deadline.
  auto again = a.ask<pong>(actor_ref(2, e->id()), ping{2}, std::chrono::hours(1));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, errc::closed);
  EXPECT_NE(again.error().message.find("unreachable"), std::string::npos) << again.error().message;
}

TEST(remote_backpressure, AFullControlQueueIsOverloadedAtTheSender) {
  actor_system c(sys_config(3));
  auto cfg = test::control_config("node-3", test::kSecretHex);
  cfg.send_queue_capacity = 4;
  auto n = remote_node::start(c, cfg);
  ASSERT_TRUE(n) << n.error().describe();
  // Node 4 never answers (nothing listens there): frames queue up to the bound.
  ASSERT_TRUE((*n)->add_node(4, "node-4", "tcp://127.0.0.1:1"));
  std::size_t accepted = 0;
  result<void> last = ok();
  for (int i = 0; i < 10 && last; ++i) {
    last = c.send(actor_ref(4, 1), ping{1});
    if (last) ++accepted;
  }
  ASSERT_FALSE(last);
  EXPECT_EQ(last.error().code, errc::overloaded) << last.error().describe();
  EXPECT_EQ(accepted, 4u);
  // A request is refused the same way, at once, and leaves nothing tracked.
  auto r = c.ask<pong>(actor_ref(4, 1), ping{1}, std::chrono::hours(1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::overloaded);
  EXPECT_EQ((*n)->router().tracked_requests(), 0u);
  EXPECT_GE((*n)->router().stats().send_refused, 2u);
  c.shutdown();
  (*n)->stop();
}

TEST(remote_auth, APeerWithoutTheSecretCannotReachActors) {
  actor_system b(sys_config(2));
  actor_system evil(sys_config(3));
  auto nb = remote_node::start(b, test::control_config("node-2", test::kSecretHex));
  auto ne = remote_node::start(evil, test::control_config("node-3", test::kForeignSecretHex));
  ASSERT_TRUE(nb && ne);
  std::atomic<std::uint64_t> seen{0};
  auto e = b.spawn<test::echo>(&seen);
  ASSERT_TRUE(e);
  // node-2 even maps node 3: only the cluster secret stands in the way.
  ASSERT_TRUE((*nb)->add_node(3, "node-3", (*ne)->endpoint()));
  ASSERT_TRUE((*ne)->add_node(2, "node-2", (*nb)->endpoint()));
  // Queued (or refused once node-3 gives node-2 up as silent): never delivered either way.
  (void)evil.send(actor_ref(2, e->id()), ping{1});
  auto r = evil.ask<pong>(actor_ref(2, e->id()), ping{2}, 1s);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().code == errc::timeout || r.error().code == errc::closed)
      << r.error().describe();
  ASSERT_TRUE(wait_for([&] {
    auto s = (*nb)->control().stats();
    return s.zap_denied + s.handshake_failed_inbound > 0;
  }));
  EXPECT_EQ(seen.load(), 0u);
  EXPECT_EQ((*nb)->router().stats().envelopes_received, 0u);
  b.shutdown();
  evil.shutdown();
  (*nb)->stop();
  (*ne)->stop();
}

}  // namespace
}  // namespace tessera::transport::remote

namespace tessera::transport::remote {
namespace {

// A member of the cluster speaks only for its own node: an envelope whose sender names another
// node, or one from a control peer that carries no actor node, is dropped and counted.
TEST(remote_inbound, SpoofedSenderNodeAndUnmappedPeersAreRejected) {
  actors::actor_system b(sys_config(2));
  auto nb = remote_node::start(b, test::control_config("node-2", test::kSecretHex));
  ASSERT_TRUE(nb);
  std::atomic<std::uint64_t> seen{0};
  auto e = b.spawn<test::echo>(&seen);
  ASSERT_TRUE(e);
  ASSERT_TRUE((*nb)->router().map_node(3, "node-3"));
  // Raw control nodes with the cluster secret: "node-3" is mapped to node 3, "node-4" to nothing.
  auto raw3 = control::control_node::start(test::control_config("node-3", test::kSecretHex), {});
  auto raw4 = control::control_node::start(test::control_config("node-4", test::kSecretHex), {});
  ASSERT_TRUE(raw3 && raw4);
  ASSERT_TRUE((*raw3)->add_peer("node-2", (*nb)->endpoint()));
  ASSERT_TRUE((*raw4)->add_peer("node-2", (*nb)->endpoint()));
  auto envelope_from = [&](actors::node_id sender_node) {
    actors::envelope env;
    env.sender = actor_ref(sender_node, 5);
    env.receiver = actor_ref(2, e->id());
    env.type_id = ping::type_id;
    env.body = actors::pack_message(ping{1});
    return actors::encode_envelope(env);
  };
  auto send = [](control::control_node& n, const std::vector<char>& body) {
    return n.send("node-2", control::msg_type::actor_envelope,
                  std::span<const std::byte>(reinterpret_cast<const std::byte*>(body.data()),
                                             body.size()));
  };
  ASSERT_TRUE(send(**raw4, envelope_from(4)));  // unmapped control peer
  ASSERT_TRUE(send(**raw3, envelope_from(1)));  // node 3 claiming to speak for node 1
  ASSERT_TRUE(send(**raw3, envelope_from(3)));  // the honest one, after the spoof on one link
  ASSERT_TRUE(wait_for([&] { return seen.load() == 1; }));
  ASSERT_TRUE(wait_for([&] { return (*nb)->router().stats().rejected_inbound == 2; }))
      << (*nb)->router().stats().rejected_inbound;
  EXPECT_EQ(seen.load(), 1u);
  EXPECT_EQ((*nb)->router().stats().envelopes_received, 1u);
  b.shutdown();
  (*nb)->stop();
}

}  // namespace
}  // namespace tessera::transport::remote

namespace tessera::transport::remote {
namespace {

// The router's own tables are bounded: watches refuse beyond the bound, tracked requests forget
// the oldest (which then ends by its own deadline) and count it.
TEST(remote_bounds, WatchesAndTrackedRequestsStopAtTheirBounds) {
  actors::actor_system c(sys_config(3));
  router_options opts;
  opts.max_watches = 2;
  opts.max_tracked_requests = 2;
  auto n = remote_node::start(c, test::control_config("node-3", test::kSecretHex), opts);
  ASSERT_TRUE(n) << n.error().describe();
  // Node 4 never answers (nothing listens there): watches and requests stay outstanding.
  ASSERT_TRUE((*n)->add_node(4, "node-4", "tcp://127.0.0.1:1"));
  down_log log;
  auto w = c.spawn<test::watcher>(log);
  ASSERT_TRUE(w);
  ASSERT_TRUE(c.monitor(actor_ref(4, 1), *w));
  ASSERT_TRUE(c.monitor(actor_ref(4, 2), *w));
  auto third = c.monitor(actor_ref(4, 3), *w);
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().code, errc::no_capacity);
  EXPECT_EQ((*n)->router().watch_count(), 2u);
  std::atomic<int> answered{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.request<pong>(actor_ref(4, 1), ping{1}, std::chrono::hours(1),
                                [&answered](result<pong>) { answered.fetch_add(1); }));
  }
  ASSERT_TRUE(wait_for([&] { return (*n)->router().stats().tracked_requests_evicted == 1; }));
  EXPECT_EQ((*n)->router().tracked_requests(), 2u);
  c.shutdown();  // fails the three requests with errc::closed
  EXPECT_EQ(answered.load(), 3);
  (*n)->stop();
}

}  // namespace
}  // namespace tessera::transport::remote
