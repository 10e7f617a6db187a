#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "actors/base/result.hpp"

namespace tessera {
namespace {

result<int> parse_positive(int v) {
  if (v <= 0) return make_error(errc::invalid_argument, "value {} is not positive", v);
  return v;
}

result<int> twice_positive(int v) {
  auto r = parse_positive(v);
  TESSERA_TRY(r);
  return *r * 2;
}

TEST(Result, ErrorCarriesCodeAndMessage) {
  auto r = parse_positive(-3);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  EXPECT_EQ(r.error().message, "value -3 is not positive");
  EXPECT_EQ(r.error().describe(), "invalid_argument: value -3 is not positive");
}

TEST(Result, TryPropagatesErrorsAndValues) {
  EXPECT_EQ(*twice_positive(4), 8);
  auto r = twice_positive(0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
}

TEST(Result, HoldsMoveOnlyTypes) {
  result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r);
  auto p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(Result, VoidResult) {
  result<void> good = ok();
  EXPECT_TRUE(good);
  result<void> bad = make_error(errc::closed, "runtime stopped");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::closed);
}

TEST(Result, ValueOr) {
  EXPECT_EQ(parse_positive(-1).value_or(42), 42);
  EXPECT_EQ(parse_positive(5).value_or(42), 5);
}

TEST(AssertDeathTest, AbortsWithFileLineAndValues) {
  auto fails = [] {
    int have = 3;
    TESSERA_ASSERT(have == 4, "have {} want {}", have, 4);
  };
  EXPECT_DEATH(fails(), "TESSERA_ASSERT failed: have == 4 at .*result_test.cpp:[0-9]+: have 3 want 4");
}

TEST(ResultDeathTest, ValueOnErrorAborts) {
  auto r = parse_positive(0);
  EXPECT_DEATH((void)r.value(), "result::value\\(\\) on an error: invalid_argument");
}

}  // namespace
}  // namespace tessera
