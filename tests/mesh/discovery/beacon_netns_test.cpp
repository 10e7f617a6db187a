// UDP beacons across three network namespaces joined by veth pairs and a bridge (netns_lab).
// Members 0 and 1 are cluster "blue"; member 2 is cluster "green" (or an attacker sending junk).
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "mesh/discovery/beacon_source.hpp"
#include "tests/mesh/discovery/hint_log.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/netns_lab.hpp"

namespace tessera::mesh {
namespace {

using tessera::test::netns_lab;
using tessera::test::wait_until;

const std::string id_a = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1";
const std::string id_b = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2";
const std::string id_c = "ccccccccccccccccccccccccccccccc3";

class beacon_netns_test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = netns_lab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    auto lab = netns_lab::create(3);
    ASSERT_TRUE(lab) << lab.error().describe();
    lab_.emplace(std::move(lab).value());
  }

  beacon_options options(const std::string& id, const std::string& cluster, std::string address) {
    beacon_options o;
    o.node_id = id;
    o.cluster_id = cluster;
    o.control_port = 7400;
    o.interface_name = netns_lab::interface_name();
    o.address = std::move(address);
    o.port = 7479;
    o.interval_ms = 50;
    return o;
  }

  // Creates and starts a beacon source inside member `i`'s namespace.
  std::unique_ptr<beacon_source> start_in(std::size_t i, beacon_options o, test::hint_log& log) {
    std::unique_ptr<beacon_source> src;
    auto entered = lab_->run_in(i, [&] {
      auto created = beacon_source::create(std::move(o));
      ASSERT_TRUE(created) << created.error().describe();
      auto started = (*created)->start(log.sink());
      ASSERT_TRUE(started) << started.error().describe();
      src = std::move(created).value();
    });
    EXPECT_TRUE(entered) << entered.error().describe();
    return src;
  }

  std::optional<netns_lab> lab_;
};

TEST_F(beacon_netns_test, malformed_datagrams_are_counted_and_ignored) {
  test::hint_log log_a;
  auto a = start_in(0, options(id_a, "blue", "239.255.74.74"), log_a);
  ASSERT_TRUE(a);
  // Junk sent from member 2 to the group: empty, random, wrong magic, truncated, oversized.
  std::vector<std::vector<std::uint8_t>> junk = {{},
                                                 {1, 2, 3},
                                                 std::vector<std::uint8_t>(40, 'x'),
                                                 {'T', 'S', 'R', 'B', 1, 0, 0x1c, 0xe8},
                                                 std::vector<std::uint8_t>(1400, 0)};
  junk.push_back(*encode_beacon({id_c, "blue", "", 7400, 1}, {}));
  junk.back()[4] = 9;  // a future version: also ignored
  auto sent = lab_->run_in(2, [&] {
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(fd, 0);
    ip_mreqn via{};  // the namespace has no default route: name the interface
    via.imr_ifindex = static_cast<int>(::if_nametoindex(netns_lab::interface_name()));
    ASSERT_EQ(::setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &via, sizeof(via)), 0);
    sockaddr_in dest{};
    dest.sin_family = AF_INET;
    dest.sin_port = htons(7479);
    ::inet_pton(AF_INET, "239.255.74.74", &dest.sin_addr);
    for (const auto& d : junk) {
      ASSERT_EQ(
          ::sendto(fd, d.data(), d.size(), 0, reinterpret_cast<sockaddr*>(&dest), sizeof(dest)),
          static_cast<ssize_t>(d.size()));
    }
    ::close(fd);
  });
  ASSERT_TRUE(sent) << sent.error().describe();
  ASSERT_TRUE(wait_until([&] { return a->stats().malformed >= junk.size(); }))
      << "malformed=" << a->stats().malformed;
  EXPECT_EQ(log_a.size(), 0u);
  EXPECT_FALSE(log_a.saw(id_c));
}

TEST_F(beacon_netns_test, peers_of_one_cluster_find_each_other_and_ignore_another_cluster) {
  test::hint_log log_a, log_b, log_c;
  auto a = start_in(0, options(id_a, "blue", "239.255.74.74"), log_a);
  auto b = start_in(1, options(id_b, "blue", "239.255.74.74"), log_b);
  auto c = start_in(2, options(id_c, "green", "239.255.74.74"), log_c);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }));
  ASSERT_TRUE(wait_until([&] {
    return a->stats().foreign_cluster > 0 && b->stats().foreign_cluster > 0 &&
           c->stats().foreign_cluster > 0;
  }));
  EXPECT_FALSE(log_a.saw(id_c));
  EXPECT_FALSE(log_b.saw(id_c));
  EXPECT_EQ(log_c.size(), 0u);
  for (const auto& h : log_a.snapshot()) {
    EXPECT_EQ(h.source, hint_source::beacon);
    EXPECT_EQ(h.cluster_id, "blue");
    EXPECT_EQ(h.control.at(0), (endpoint{netns_lab::address(1), 7400}));
    EXPECT_EQ(h.protocol_version, 1u);
  }
  // Multicast loops back to the sender: its own beacons are recognised, not hinted.
  EXPECT_TRUE(wait_until([&] { return a->stats().self > 0; }));
  EXPECT_GT(a->stats().sent, 0u);
}

TEST_F(beacon_netns_test, broadcast_beacons_carry_an_advertised_host) {
  test::hint_log log_a, log_b;
  auto oa = options(id_a, "blue", netns_lab::broadcast());
  auto ob = options(id_b, "blue", netns_lab::broadcast());
  ob.advertise_host = "node-b.lan";
  auto a = start_in(0, oa, log_a);
  auto b = start_in(1, ob, log_b);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }));
  EXPECT_EQ(log_a.snapshot().front().control.at(0), (endpoint{"node-b.lan", 7400}));
  EXPECT_EQ(log_b.snapshot().front().control.at(0), (endpoint{netns_lab::address(0), 7400}));
}

TEST_F(beacon_netns_test, with_a_cluster_key_forged_and_unsigned_beacons_are_refused) {
  std::string secret = "blue secret", wrong = "guess";
  auto key =
      derive_beacon_key({reinterpret_cast<const std::uint8_t*>(secret.data()), secret.size()});
  auto bad = derive_beacon_key({reinterpret_cast<const std::uint8_t*>(wrong.data()), wrong.size()});
  test::hint_log log_a, log_b, log_c, log_d;
  auto oa = options(id_a, "blue", "239.255.74.74");
  oa.key = key;
  auto ob = oa;
  ob.node_id = id_b;
  auto oc = oa;  // right cluster id, wrong key: an outsider pretending to be blue
  oc.node_id = id_c;
  oc.key = bad;
  auto a = start_in(0, oa, log_a);
  auto b = start_in(1, ob, log_b);
  auto c = start_in(2, oc, log_c);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }));
  ASSERT_TRUE(wait_until([&] { return a->stats().unauthenticated > 0; }));
  c->stop();
  // An unsigned beacon claiming the cluster is refused as well.
  auto od = options(id_c, "blue", "239.255.74.74");
  auto before = b->stats().unauthenticated;
  auto d = start_in(2, od, log_d);
  ASSERT_TRUE(d);
  ASSERT_TRUE(wait_until([&] { return b->stats().unauthenticated > before + 1; }));
  EXPECT_FALSE(log_a.saw(id_c));
  EXPECT_FALSE(log_b.saw(id_c));
}

TEST_F(beacon_netns_test, a_missing_interface_is_a_clear_start_error) {
  auto o = options(id_a, "blue", "239.255.74.74");
  o.interface_name = "nosuch0";
  auto entered = lab_->run_in(0, [&] {
    auto src = beacon_source::create(o);
    ASSERT_TRUE(src);
    test::hint_log log;
    auto r = (*src)->start(log.sink());
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("nosuch0"), std::string::npos) << r.error().message;
  });
  ASSERT_TRUE(entered);
}

TEST(beacon_source, bad_options_are_refused_before_any_socket) {
  beacon_options o;
  o.node_id = id_a;
  o.cluster_id = "blue";
  o.control_port = 7400;
  o.address = "not-an-ip";
  EXPECT_EQ(beacon_source::create(o).error().code, errc::invalid_argument);
  o.address = "239.1.1.1";
  o.port = 0;
  EXPECT_FALSE(beacon_source::create(o));
  o.port = 7479;
  o.interval_ms = 0;
  EXPECT_FALSE(beacon_source::create(o));
  o.interval_ms = 100;
  o.node_id = "short";
  EXPECT_FALSE(beacon_source::create(o));
}

}  // namespace
}  // namespace tessera::mesh
