// The remote seam: two real actor systems joined by a loopback router (envelopes go through their
// msgpack wire form), and envelopes that must be rejected.
#include <gtest/gtest.h>

#include "actors/loopback_router.hpp"
#include "actors/system.hpp"
#include "tests/actors/test_support.hpp"

namespace tessera::actors {
namespace {
using namespace std::chrono_literals;
using test::echo;
using test::eventually;
using test::ping;
using test::pong;

config node(node_id id) {
  config c;
  c.node = id;
  c.workers = 2;
  return c;
}

struct mystery {
  TESSERA_MESSAGE("tessera.test.mystery");
  int x = 0;
  MSGPACK_DEFINE(x);
};

struct remote_pair : ::testing::Test {
  actor_system a{node(1)};
  actor_system b{node(2)};
  std::shared_ptr<loopback_router> router = std::make_shared<loopback_router>();
  void SetUp() override {
    router->attach(a);
    router->attach(b);
    a.set_router(router);
    b.set_router(router);
  }
  void TearDown() override {
    a.shutdown();
    b.shutdown();
  }
};

TEST_F(remote_pair, RequestCrossesNodesAndTheReplyComesBack) {
  auto e = b.spawn<echo>();
  ASSERT_TRUE(e);
  actor_ref remote(2, e->id());  // what a peer learns from the wire: no local cell
  auto r = a.ask<pong>(remote, ping{77}, 10s);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(r->seq, 77u);
  EXPECT_GE(router->routed(), 2u);
}

TEST_F(remote_pair, OneWayMessageArrivesDecodedByTheReceiversHandler) {
  std::atomic<std::uint64_t> got{0};
  struct sink : actor {
    explicit sink(std::atomic<std::uint64_t>& got) {
      on<ping>([&got](ping& p) { got = p.seq; });
    }
  };
  auto s = b.spawn<sink>(got);
  ASSERT_TRUE(a.send(actor_ref(2, s->id()), ping{5}));
  ASSERT_TRUE(eventually([&] { return got.load() == 5; }));
}

TEST_F(remote_pair, RequestToAMissingRemoteActorFailsWithNotFound) {
  auto r = a.ask<pong>(actor_ref(2, 424242), ping{1}, 10s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::not_found);
  EXPECT_EQ(b.stats().rejected_envelopes, 1u);
}

TEST_F(remote_pair, NoRouteToAnUnknownNode) {
  auto r = a.send(actor_ref(9, 1), ping{1});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::not_found);
}

TEST_F(remote_pair, UnknownTypeIdIsRejectedAndAnsweredNotCrashed) {
  auto e = b.spawn<echo>();
  auto r = a.ask<pong>(actor_ref(2, e->id()), mystery{3}, 10s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::unsupported);
  EXPECT_EQ(b.stats().rejected_envelopes, 1u);
  EXPECT_EQ(b.ask<pong>(*e, ping{1}, 10s)->seq, 1u);  // still alive
}

TEST(RemoteSeam, BadEnvelopesAreRejectedAndCounted) {
  actor_system sys(node(2));
  auto e = sys.spawn<echo>();
  ASSERT_TRUE(e);
  envelope good;
  good.receiver = actor_ref(2, e->id());
  good.type_id = ping::type_id;
  good.body = pack_message(ping{1});

  envelope wrong_version = good;
  wrong_version.version = 99;
  auto r1 = sys.deliver_remote(wrong_version);
  ASSERT_FALSE(r1);
  EXPECT_EQ(r1.error().code, errc::unsupported);
  EXPECT_NE(r1.error().message.find("version 99"), std::string::npos);

  envelope wrong_node = good;
  wrong_node.receiver = actor_ref(3, e->id());
  EXPECT_EQ(sys.deliver_remote(wrong_node).error().code, errc::invalid_argument);

  envelope local_kind = good;
  local_kind.kind = message_kind::stop;
  EXPECT_EQ(sys.deliver_remote(local_kind).error().code, errc::protocol);

  envelope nobody = good;
  nobody.receiver = actor_ref(2, 999);
  EXPECT_EQ(sys.deliver_remote(nobody).error().code, errc::not_found);
  EXPECT_EQ(sys.stats().rejected_envelopes, 4u);

  // Accepted by the system, then rejected by the receiver's handler table / decoder.
  envelope garbage = good;
  garbage.body = {'\xc1', '\x00'};
  ASSERT_TRUE(sys.deliver_remote(garbage));
  envelope unknown = good;
  unknown.type_id = 0xdeadbeef;
  ASSERT_TRUE(sys.deliver_remote(unknown));
  ASSERT_TRUE(eventually([&] { return sys.stats().rejected_envelopes == 6; }));
  EXPECT_EQ(sys.ask<pong>(*e, ping{2}, 10s)->seq, 2u);

  // Bytes that are not an envelope at all.
  std::vector<char> junk{'\x93', '\x01'};
  auto decoded = decode_envelope(junk);
  ASSERT_FALSE(decoded);
  EXPECT_EQ(decoded.error().code, errc::corrupt);
}

TEST(RemoteSeam, EnvelopeRoundTripsThroughItsWireForm) {
  envelope env;
  env.sender = actor_ref(1, 5);
  env.receiver = actor_ref(2, 6);
  env.type_id = ping::type_id;
  env.request_id = 99;
  env.kind = message_kind::request;
  env.lane_ = lane::data;
  env.body = pack_message(ping{3});
  auto back = decode_envelope(encode_envelope(env));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->version, envelope_version);
  EXPECT_EQ(back->sender, env.sender);
  EXPECT_EQ(back->receiver, env.receiver);
  EXPECT_EQ(back->request_id, 99u);
  EXPECT_EQ(back->kind, message_kind::request);
  EXPECT_EQ(unpack_message<ping>(back->body)->seq, 3u);
}

}  // namespace
}  // namespace tessera::actors
