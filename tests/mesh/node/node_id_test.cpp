#include "mesh/node/node_id.hpp"

#include <set>

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

TEST(node_id, parse_rejects_wrong_length_and_non_hex) {
  EXPECT_EQ(node_id::parse("").error().code, errc::invalid_argument);
  EXPECT_EQ(node_id::parse("0123456789abcdef0123456789abcde").error().code, errc::invalid_argument);
  EXPECT_EQ(node_id::parse("0123456789abcdef0123456789abcdef0").error().code,
            errc::invalid_argument);
  auto r = node_id::parse("0123456789abcdef0123456789abcdeg");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("'g' is not a hex digit"), std::string::npos);
}

TEST(node_id, text_round_trips_and_upper_case_is_accepted) {
  auto id = node_id::parse("0123456789ABCDEF0123456789abcdef");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->hi, 0x0123456789abcdefULL);
  EXPECT_EQ(id->to_string(), "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(*node_id::parse(id->to_string()), *id);
}

TEST(node_id, random_ids_are_distinct_and_never_zero) {
  std::set<node_id> seen;
  for (int i = 0; i < 1000; ++i) {
    auto id = node_id::random();
    ASSERT_TRUE(id);
    EXPECT_FALSE(id->is_zero());
    EXPECT_TRUE(seen.insert(*id).second);
  }
}

}  // namespace
}  // namespace tessera::mesh
