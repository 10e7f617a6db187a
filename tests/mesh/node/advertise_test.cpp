// The advertised address: each rule of mesh/node/advertise.hpp on this machine's interfaces
// (advertise_netns_test.cpp: on a host of a bridge).
#include "mesh/node/advertise.hpp"

#include <arpa/inet.h>

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return ::inet_pton(AF_INET, s.c_str(), &a) == 1;
}

TEST(advertise, an_explicit_numeric_address_is_taken_as_is) {
  auto a = choose_advertise_address({.advertise = "192.0.2.7", .seeds = {"127.0.0.1:7400"}});
  ASSERT_TRUE(a) << a.error().describe();
  EXPECT_EQ(a->address, "192.0.2.7");
  EXPECT_EQ(a->source, "--advertise");
  EXPECT_FALSE(a->loopback_only);
}

TEST(advertise, an_explicit_name_is_resolved_once_to_a_number) {
  auto a = choose_advertise_address({.advertise = "localhost"});
  ASSERT_TRUE(a) << a.error().describe();
  EXPECT_EQ(a->address, "127.0.0.1");
  EXPECT_EQ(a->source, "--advertise localhost");
}

TEST(advertise, a_name_that_does_not_resolve_is_an_error_naming_it) {
  auto a = choose_advertise_address({.advertise = "no-such-host.invalid"});
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, errc::invalid_argument);
  EXPECT_NE(a.error().message.find("no-such-host.invalid"), std::string::npos) << a.error().message;
}

TEST(advertise, a_specific_listen_address_is_advertised) {
  auto a = choose_advertise_address({.listen_address = "10.1.2.3", .seeds = {"127.0.0.1:7400"}});
  ASSERT_TRUE(a) << a.error().describe();
  EXPECT_EQ(a->address, "10.1.2.3");
  EXPECT_EQ(a->source, "--listen");
}

TEST(advertise, a_seed_on_loopback_makes_it_a_one_host_cluster) {
  auto a = choose_advertise_address({.listen_address = "0.0.0.0", .seeds = {"127.0.0.1:7400"}});
  ASSERT_TRUE(a) << a.error().describe();
  EXPECT_EQ(a->address, "127.0.0.1");
  EXPECT_EQ(a->source, "route to seed 127.0.0.1:7400 (lo)");
}

TEST(advertise, seeds_that_do_not_route_are_skipped) {
  auto a = choose_advertise_address(
      {.listen_address = "0.0.0.0", .seeds = {"no-such-host.invalid:7400", "127.0.0.1:7400"}});
  ASSERT_TRUE(a) << a.error().describe();
  EXPECT_EQ(a->source, "route to seed 127.0.0.1:7400 (lo)");
}

TEST(advertise, without_hints_it_is_a_numeric_address_and_not_loopback_when_another_is_up) {
  auto a = choose_advertise_address({.listen_address = "0.0.0.0"});
  ASSERT_TRUE(a) << a.error().describe();
  EXPECT_TRUE(is_ipv4(a->address)) << a->address;
  const bool other_interface = interface_address("").has_value();
  EXPECT_EQ(a->loopback_only, !other_interface) << a->address << " (" << a->source << ")";
  if (other_interface) {
    EXPECT_NE(a->address.rfind("127.", 0), 0u) << a->source;
  }
}

TEST(advertise, an_interface_that_does_not_exist_is_not_found) {
  auto r = interface_address("nosuchif0");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::not_found);
}

}  // namespace
}  // namespace tessera::mesh
