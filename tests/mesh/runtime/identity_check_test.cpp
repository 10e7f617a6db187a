// The duplicate-identity check: reading a status document (pure), and the check's actor asking a
// node that answers the status protocol over a real, authenticated control plane.
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "actors/system.hpp"
#include "mesh/runtime/identity_check.hpp"
#include "mesh/runtime/runtime.hpp"
#include "mesh/runtime/status_client.hpp"
#include "tests/support/child_process.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::mesh::runtime {
namespace {

namespace ctl = transport::control;
using namespace std::chrono_literals;

constexpr const char* kHex = "0123456789abcdef0123456789abcdef";
constexpr const char* kOther = "fedcba9876543210fedcba9876543210";

node_instance self_instance() {
  node_instance n;
  n.id = *node_id::parse(kHex);
  n.control_endpoint = "tcp://10.0.0.2:7400";
  n.started_unix_ms = 2000;
  n.nonce = 0x22;
  return n;
}

std::string node_doc(const std::string& id, const std::string& endpoint, std::int64_t started,
                     std::uint64_t nonce,
                     const nlohmann::json& membership = nlohmann::json::array()) {
  nlohmann::json j;
  j["node"] = {{"id", id},
               {"endpoint", endpoint},
               {"started_unix_ms", started},
               {"instance_nonce", fmt::format("{:016x}", nonce)}};
  j["membership"] = membership;
  return j.dump();
}

identity_reading read(const std::string& doc) {
  return read_identity_answer(doc, self_instance(), kHex, "tcp://10.0.0.2:7400", "/var/lib/t");
}

TEST(IdentityCheck, AnEarlierProcessUnderOurIdMakesUsRefuse) {
  auto r = read(node_doc(kHex, "tcp://10.0.0.9:7400", 1000, 0x11));
  ASSERT_TRUE(r.refuse.has_value());
  EXPECT_NE(r.refuse->find("is already running at tcp://10.0.0.9:7400"), std::string::npos)
      << *r.refuse;
  EXPECT_NE(r.refuse->find("/var/lib/t/node.id"), std::string::npos) << *r.refuse;
  EXPECT_NE(r.refuse->find("--reset-identity"), std::string::npos) << *r.refuse;
}

TEST(IdentityCheck, ALaterProcessOurEchoAndAStaleRecordDoNot) {
  EXPECT_FALSE(read(node_doc(kHex, "tcp://10.0.0.9:7400", 3000, 0x11)).refuse);  // it yields
  EXPECT_FALSE(read(node_doc(kHex, "tcp://10.0.0.2:7400", 2000, 0x22)).refuse);  // ourselves
  EXPECT_FALSE(read(node_doc(kHex, "tcp://10.0.0.2:7400", 1000, 0x33)).refuse);  // an old run
}

TEST(IdentityCheck, AnotherNodeNamesWhereOurIdRunsElsewhere) {
  nlohmann::json members = nlohmann::json::array(
      {{{"id", kHex}, {"status", "alive"}, {"address", "tcp://10.0.0.9:7400"}},
       {{"id", kHex}, {"status", "suspect"}, {"address", "tcp://10.0.0.8:7400"}},
       {{"id", kHex}, {"status", "dead"}, {"address", "tcp://10.0.0.7:7400"}},
       {{"id", kHex}, {"status", "alive"}, {"address", "tcp://10.0.0.2:7400"}},  // us
       {{"id", kOther}, {"status", "alive"}, {"address", "tcp://10.0.0.5:7400"}}});
  auto r = read(node_doc(kOther, "tcp://10.0.0.5:7400", 10, 1, members));
  EXPECT_FALSE(r.refuse);
  EXPECT_EQ(r.more_targets, (std::vector<std::string>{"10.0.0.9:7400", "10.0.0.8:7400"}));
}

TEST(IdentityCheck, ADocumentWithoutTheFieldsSaysNothing) {
  for (const std::string doc : {"", "not json", "[]", R"({"node": 3})", R"({"node": {"id": 7}})",
                                R"({"node": {"id": "x"}, "membership": [{"id": 1}]})"}) {
    auto r = read(doc);
    EXPECT_FALSE(r.refuse) << doc;
    EXPECT_TRUE(r.more_targets.empty()) << doc;
  }
}

/// A node of the cluster that answers status requests with `doc` (what node_runtime does).
struct status_answerer {
  std::unique_ptr<ctl::control_node> node;
  std::atomic<int> asked{0};

  status_answerer(const ctl::cluster_keys& keys, std::string doc) {
    ctl::node_config cc;
    cc.node_id = kOther;
    cc.keys = keys;
    ctl::node_handlers h;
    h.on_message = [this, doc = std::move(doc)](ctl::inbound_message&& m) {
      if (m.type != static_cast<std::uint16_t>(runtime_msg::status_request)) return;
      const auto oh = msgpack::unpack(m.body.data(), m.body.size());
      const auto reply_to = oh.get().as<std::string>();
      ++asked;
      (void)node->add_peer(m.sender, reply_to);
      msgpack::sbuffer body;
      msgpack::pack(body, doc);
      (void)node->send(m.sender, static_cast<std::uint16_t>(runtime_msg::status_reply),
                       std::span(reinterpret_cast<const std::byte*>(body.data()), body.size()));
    };
    node = std::move(ctl::control_node::start(cc, h)).value();
  }
  [[nodiscard]] std::string host_port() const { return node->endpoint().substr(6); }
};

ctl::cluster_keys test_keys(std::uint8_t fill) {
  ctl::cluster_secret s;
  s.bytes.fill(fill);
  return *ctl::derive_cluster_keys(s);
}

// The actor asks the seed, hears our id running there since before us, and refuses; its status
// client and the actor itself are gone afterwards.
TEST(IdentityCheck, TheActorRefusesWhenASeedRunsUnderOurIdSinceBefore) {
  const auto keys = test_keys(7);
  status_answerer seed(keys, node_doc(kHex, "tcp://127.0.0.1:1", 1000, 0x11));
  actors::actor_system sys;
  std::mutex mu;
  std::string why;
  identity_check_options o;
  o.self = self_instance();
  o.hex = kHex;
  o.endpoint = "tcp://10.0.0.2:7400";
  o.data_dir = "/var/lib/t";
  o.seeds = {"tcp://" + seed.host_port()};
  o.client.keys = keys;
  o.client.id_seed = 42;
  o.rounds = {10ms, 200ms};
  o.answer_wait = 200ms;
  o.refuse = [&](std::string w) {
    std::lock_guard lock(mu);
    why = std::move(w);
  };
  auto ref =
      sys.spawn(make_identity_check(std::move(o)), actors::spawn_options{.name = "identity"});
  ASSERT_TRUE(ref);
  ASSERT_TRUE(test::wait_until(
      [&] {
        std::lock_guard lock(mu);
        return !why.empty();
      },
      20s));
  EXPECT_NE(why.find("already running at tcp://127.0.0.1:1"), std::string::npos) << why;
  EXPECT_TRUE(test::wait_until([&] { return sys.named_actors().empty(); }, 10s));
}

// Nothing to refuse: the actor asks the seed in both rounds, then stops by itself.
TEST(IdentityCheck, TheActorAsksEveryRoundAndThenStops) {
  const auto keys = test_keys(8);
  status_answerer seed(keys, node_doc(kOther, "tcp://127.0.0.1:1", 1000, 0x11));
  actors::actor_system sys;
  std::atomic<bool> refused{false};
  identity_check_options o;
  o.self = self_instance();
  o.hex = kHex;
  o.endpoint = "tcp://10.0.0.2:7400";
  o.seeds = {seed.host_port()};
  o.client.keys = keys;
  o.client.id_seed = 43;
  o.rounds = {10ms, 300ms};
  o.answer_wait = 300ms;
  o.refuse = [&](std::string) { refused = true; };
  ASSERT_TRUE(
      sys.spawn(make_identity_check(std::move(o)), actors::spawn_options{.name = "identity"}));
  EXPECT_TRUE(test::wait_until([&] { return sys.named_actors().empty(); }, 20s));
  EXPECT_EQ(seed.asked.load(), 2);
  EXPECT_FALSE(refused.load());
}

// `tessera status`'s path: one question, one answer; a node of another cluster refuses our key.
TEST(IdentityCheck, StatusClientGetsTheAnswerAndNamesAForeignCluster) {
  const auto keys = test_keys(9);
  status_answerer node(keys, node_doc(kOther, "tcp://127.0.0.1:1", 1, 1));
  std::mutex mu;
  std::string got;
  status_client_options so;
  so.keys = keys;
  auto c = status_client::start(so, [&](const std::string& from, std::string doc) {
    std::lock_guard lock(mu);
    got = from + " " + doc;
  });
  ASSERT_TRUE(c) << c.error().describe();
  ASSERT_TRUE((*c)->ask(node.host_port()));
  ASSERT_TRUE(test::wait_until(
      [&] {
        std::lock_guard lock(mu);
        return !got.empty();
      },
      10s));
  EXPECT_EQ(got.rfind(std::string(kOther) + " {", 0), 0u) << got;
  EXPECT_FALSE((*c)->ask("no-port"));
  (*c)->stop();
  EXPECT_EQ((*c)->ask(node.host_port()).error().code, errc::closed);

  so.keys = test_keys(10);  // another cluster's secret
  auto foreign = status_client::start(so, [](const std::string&, std::string) {});
  ASSERT_TRUE(foreign);
  ASSERT_TRUE((*foreign)->ask(node.host_port()));
  EXPECT_TRUE(test::wait_until([&] { return (*foreign)->handshakes_refused() > 0; }, 10s));
}

}  // namespace
}  // namespace tessera::mesh::runtime
