// The advertised address on a host whose only interface besides lo is eth0 on a bridge
// (tests/support/netns_lab), with and without a default route, and with eth0 down.
#include <gtest/gtest.h>

#include "mesh/node/advertise.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/netns_lab.hpp"

namespace tessera::mesh {
namespace {

// A host on a bridge: eth0 only. Without a default route the first interface that is up is
// chosen; with one (as on a LAN) the default route's source; a beacon interface wins over both.
TEST(advertise_netns, a_host_on_a_bridge_advertises_its_eth0_address) {
  if (auto why = test::netns_lab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  auto lab = test::netns_lab::create(1);
  ASSERT_TRUE(lab.has_value()) << lab.error().describe();
  const auto mine = test::netns_lab::address(0);
  std::optional<result<advertised_address>> bare, routed, beacon;
  ASSERT_TRUE(
      lab->run_in(0, [&] { bare = choose_advertise_address({.listen_address = "0.0.0.0"}); }));
  ASSERT_TRUE(test::run_command(
      {"ip", "netns", "exec", lab->member(0), "ip", "route", "add", "default", "dev", "eth0"}));
  ASSERT_TRUE(lab->run_in(0, [&] {
    routed = choose_advertise_address({.listen_address = "0.0.0.0"});
    beacon = choose_advertise_address({.listen_address = "0.0.0.0", .beacon_interface = "eth0"});
  }));
  ASSERT_TRUE(*bare) << bare->error().describe();
  EXPECT_EQ((*bare)->address, mine);
  EXPECT_EQ((*bare)->source, "first interface up: eth0");
  ASSERT_TRUE(*routed) << routed->error().describe();
  EXPECT_EQ((*routed)->address, mine);
  EXPECT_EQ((*routed)->source, "default route (eth0)");
  ASSERT_TRUE(*beacon) << beacon->error().describe();
  EXPECT_EQ((*beacon)->source, "--beacon-interface eth0");
}

// A host with nothing but lo up: loopback, flagged, so the node warns.
TEST(advertise_netns, a_host_with_only_loopback_says_so) {
  if (auto why = test::netns_lab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  auto lab = test::netns_lab::create(1);
  ASSERT_TRUE(lab.has_value()) << lab.error().describe();
  ASSERT_TRUE(test::run_command(
      {"ip", "netns", "exec", lab->member(0), "ip", "link", "set", "eth0", "down"}));
  std::optional<result<advertised_address>> a;
  ASSERT_TRUE(lab->run_in(0, [&] { a = choose_advertise_address({.listen_address = "0.0.0.0"}); }));
  ASSERT_TRUE(*a) << a->error().describe();
  EXPECT_EQ((*a)->address, "127.0.0.1");
  EXPECT_TRUE((*a)->loopback_only);
}

}  // namespace
}  // namespace tessera::mesh
