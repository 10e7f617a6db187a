#include "mesh/discovery/peer_hint.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

TEST(endpoint, malformed_text_is_refused_with_the_text_named) {
  for (const char* bad : {"", "host", ":1", "host:", "host:0", "host:65536", "host:12a", "h st:1",
                          "::1:80", "[::1]", "[::1]80", "[]:1"}) {
    auto e = parse_endpoint(bad);
    ASSERT_FALSE(e) << bad;
    EXPECT_EQ(e.error().code, errc::invalid_argument);
    EXPECT_NE(e.error().message.find(fmt::format("'{}'", bad)), std::string::npos) << bad;
  }
  EXPECT_FALSE(parse_endpoint(std::string(254, 'a') + ":1"));
}

TEST(endpoint, hosts_and_ipv6_parse_and_print_back) {
  auto a = parse_endpoint("node-1.example:7400");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "node-1.example");
  EXPECT_EQ(a->port, 7400);
  auto b = parse_endpoint("[fe80::1%eth0]:65535");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->host, "fe80::1%eth0");
  EXPECT_EQ(b->to_string(), "[fe80::1%eth0]:65535");
  EXPECT_EQ(parse_endpoint("10.0.0.1:1")->to_string(), "10.0.0.1:1");
}

TEST(peer_hint, id_validators_enforce_their_bounds) {
  EXPECT_TRUE(is_node_id_text("0123456789abcdef0123456789abcdef"));
  EXPECT_FALSE(is_node_id_text("0123456789ABCDEF0123456789abcdef"));
  EXPECT_FALSE(is_node_id_text("0123"));
  EXPECT_TRUE(is_cluster_id_text("prod-eu"));
  EXPECT_FALSE(is_cluster_id_text(""));
  EXPECT_FALSE(is_cluster_id_text("a b"));
  EXPECT_FALSE(is_cluster_id_text("a=b"));
  EXPECT_FALSE(is_cluster_id_text(std::string(65, 'c')));
  EXPECT_TRUE(is_cluster_id_text(std::string(64, 'c')));
}

}  // namespace
}  // namespace tessera::mesh
