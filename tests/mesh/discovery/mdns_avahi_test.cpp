// mDNS discovery for real: a private dbus-daemon and avahi-daemon (tests/support/private_avahi),
// three mdns_sources in this process talking to it over D-Bus. A and B are cluster "blue", C is
// cluster "green".
#include <cstdlib>

#include <gtest/gtest.h>

#include "mesh/discovery/mdns_source.hpp"
#include "tests/mesh/discovery/hint_log.hpp"
#include "tests/support/private_avahi.hpp"

namespace tessera::mesh {
namespace {

using tessera::test::private_avahi;
using tessera::test::wait_until;

const std::string id_a = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1";
const std::string id_b = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2";
const std::string id_c = "ccccccccccccccccccccccccccccccc3";

class mdns_avahi_test : public ::testing::Test {
 protected:
  // One bus for the whole test process: libdbus reads DBUS_SYSTEM_BUS_ADDRESS once per process
  // and caches it, so a second bus at another address would never be dialled. Each test gets a
  // fresh avahi-daemon on it.
  static void SetUpTestSuite() {
    if (!private_avahi::unavailable_reason().empty()) return;
    auto bus = private_avahi::start_bus();
    if (!bus) {
      bus_error_ = bus.error().describe();
      return;
    }
    avahi_ = std::move(bus).value().release();
    // avahi-client finds the system bus through this variable; set before any client exists.
    ::setenv("DBUS_SYSTEM_BUS_ADDRESS", avahi_->bus_address().c_str(), 1);
  }
  static void TearDownTestSuite() {
    delete avahi_;
    avahi_ = nullptr;
  }
  void SetUp() override {
    if (auto why = private_avahi::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    ASSERT_NE(avahi_, nullptr) << bus_error_;
  }
  void TearDown() override {
    if (avahi_) avahi_->stop_avahi();
  }

  std::unique_ptr<mdns_source> make(const std::string& id, const std::string& cluster,
                                    std::uint16_t port) {
    mdns_options o;
    o.node_id = id;
    o.cluster_id = cluster;
    o.control_port = port;
    o.retry_min_ms = 50;
    o.retry_max_ms = 400;
    auto s = mdns_source::create(o);
    EXPECT_TRUE(s) << s.error().describe();
    return s ? std::move(s).value() : nullptr;
  }

  static inline private_avahi* avahi_ = nullptr;
  static inline std::string bus_error_;
};

TEST_F(mdns_avahi_test, without_a_daemon_the_source_keeps_retrying_and_connects_when_it_appears) {
  test::hint_log log_a, log_b;
  auto a = make(id_a, "blue", 7400);
  auto b = make(id_b, "blue", 7401);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->start(log_a.sink()));  // no daemon yet: not an error
  ASSERT_TRUE(b->start(log_b.sink()));
  EXPECT_EQ(a->state(), mdns_state::connecting);
  ASSERT_TRUE(avahi_->start_avahi()) << avahi_->avahi_log();
  ASSERT_TRUE(wait_until([&] { return a->state() == mdns_state::running; }));
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }))
      << avahi_->avahi_log();
  a->stop();
  b->stop();
}

TEST_F(mdns_avahi_test, peers_of_one_cluster_find_each_other_and_ignore_another_cluster) {
  ASSERT_TRUE(avahi_->start_avahi());
  test::hint_log log_a, log_b, log_c;
  auto a = make(id_a, "blue", 7400);
  auto b = make(id_b, "blue", 7401);
  auto c = make(id_c, "green", 7402);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(a->start(log_a.sink()));
  ASSERT_TRUE(b->start(log_b.sink()));
  ASSERT_TRUE(c->start(log_c.sink()));
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }))
      << avahi_->avahi_log();
  ASSERT_TRUE(wait_until([&] {
    return a->stats().foreign_cluster > 0 && b->stats().foreign_cluster > 0 &&
           c->stats().foreign_cluster >= 2;
  }));
  EXPECT_FALSE(log_a.saw(id_c));
  EXPECT_FALSE(log_b.saw(id_c));
  EXPECT_EQ(log_c.size(), 0u);
  for (const auto& h : log_a.snapshot()) {
    EXPECT_EQ(h.source, hint_source::mdns);
    EXPECT_EQ(h.cluster_id, "blue");
    ASSERT_EQ(h.control.size(), 1u);
    EXPECT_EQ(h.control[0], (endpoint{"127.0.0.1", 7401}));
  }
  EXPECT_GT(a->stats().self, 0u);  // its own service is browsed too, and recognised
  EXPECT_EQ(a->stats().malformed, 0u);
}

TEST_F(mdns_avahi_test, a_daemon_restart_is_survived_and_peers_are_found_again) {
  ASSERT_TRUE(avahi_->start_avahi());
  test::hint_log log_a, log_b;
  auto a = make(id_a, "blue", 7400);
  auto b = make(id_b, "blue", 7401);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->start(log_a.sink()));
  ASSERT_TRUE(b->start(log_b.sink()));
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }));
  avahi_->stop_avahi();
  ASSERT_TRUE(wait_until([&] { return a->stats().reconnects > 0 && b->stats().reconnects > 0; }));
  EXPECT_NE(a->state(), mdns_state::running);
  log_a.clear();
  log_b.clear();
  ASSERT_TRUE(avahi_->start_avahi());
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }))
      << avahi_->avahi_log();
  EXPECT_EQ(a->state(), mdns_state::running);
}

TEST_F(mdns_avahi_test, a_service_name_collision_is_resolved_with_an_alternative_name) {
  ASSERT_TRUE(avahi_->start_avahi());
  mdns_options o;
  o.node_id = id_a;
  o.cluster_id = "blue";
  o.control_port = 7400;
  o.service_name = "same-name";
  auto a = mdns_source::create(o);
  o.node_id = id_b;
  o.control_port = 7401;
  auto b = mdns_source::create(o);
  ASSERT_TRUE(a && b);
  test::hint_log log_a, log_b;
  ASSERT_TRUE((*a)->start(log_a.sink()));
  ASSERT_TRUE(wait_until([&] { return (*a)->state() == mdns_state::running; }));
  ASSERT_TRUE((*b)->start(log_b.sink()));
  ASSERT_TRUE(wait_until([&] { return log_a.saw(id_b) && log_b.saw(id_a); }))
      << avahi_->avahi_log();
  EXPECT_NE((*a)->published_name(), (*b)->published_name());
}

TEST(mdns_source, bad_options_are_refused) {
  mdns_options o;
  o.node_id = "nope";
  o.cluster_id = "blue";
  o.control_port = 1;
  EXPECT_EQ(mdns_source::create(o).error().code, errc::invalid_argument);
  o.node_id = id_a;
  o.cluster_id = "";
  EXPECT_FALSE(mdns_source::create(o));
  o.cluster_id = "blue";
  o.control_port = 0;
  EXPECT_FALSE(mdns_source::create(o));
  o.control_port = 1;
  o.service_name = std::string(64, 'n');
  EXPECT_FALSE(mdns_source::create(o));
}

}  // namespace
}  // namespace tessera::mesh
