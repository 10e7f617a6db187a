#include "mesh/discovery/seed_source.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

TEST(seed_source, a_malformed_seed_is_refused_naming_it) {
  auto s = seed_source::create({"a:1", "b"});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("seed 'b'"), std::string::npos) << s.error().message;
}

TEST(seed_source, more_than_the_bound_is_refused) {
  std::vector<std::string> seeds(seed_source::max_seeds + 1, "a:1");
  EXPECT_FALSE(seed_source::create(seeds));
  seeds.pop_back();
  EXPECT_TRUE(seed_source::create(seeds));
}

TEST(seed_source, emits_one_hint_per_distinct_seed) {
  auto s = seed_source::create({"10.0.0.1:7400", "node-b:7400", "10.0.0.1:7400", "[::1]:9"});
  ASSERT_TRUE(s);
  std::vector<peer_hint> hints;
  ASSERT_TRUE((*s)->start([&](const peer_hint& h) { hints.push_back(h); }));
  ASSERT_EQ(hints.size(), 3u);
  EXPECT_EQ(hints[0].control.at(0), (endpoint{"10.0.0.1", 7400}));
  EXPECT_EQ(hints[1].control.at(0), (endpoint{"node-b", 7400}));
  EXPECT_EQ(hints[2].control.at(0), (endpoint{"::1", 9}));
  for (const auto& h : hints) {
    EXPECT_EQ(h.source, hint_source::seed);
    EXPECT_TRUE(h.node_id.empty());
    EXPECT_TRUE(h.cluster_id.empty());
  }
  EXPECT_EQ((*s)->stats().hints, 3u);
}

}  // namespace
}  // namespace tessera::mesh
