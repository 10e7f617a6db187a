// protocol_clock: the time the node's protocols read under `tessera fault clock`.
#include "mesh/runtime/protocol_clock.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh::runtime {
namespace {

TEST(ProtocolClock, RealTimeUntilSkewedThenFasterSlowerAndBumpedNeverBack) {
  protocol_clock c;
  EXPECT_EQ(c.at(1000), 1000u);
  EXPECT_EQ(c.real_wait(100), 100u);
  c.apply(2.0, 0, 1000);  // from real 1000 on, twice as fast
  EXPECT_EQ(c.at(1500), 2000u);
  EXPECT_EQ(c.real_wait(100), 50u);  // a 100 ms timer fires after 50 real ms
  c.apply(2.0, 5000, 1500);          // jumps 5 s forward
  EXPECT_EQ(c.at(1500), 7000u);
  c.apply(0.5, 5000, 2000);  // the same bump total: no second jump; now half as fast
  EXPECT_EQ(c.at(2000), 8000u);
  EXPECT_EQ(c.at(3000), 8500u);
  EXPECT_EQ(c.real_wait(100), 200u);
  c.apply(1.0, 0, 3000);  // cleared: the real rate again, and time does not go back
  EXPECT_EQ(c.at(3000), 8500u);
  EXPECT_EQ(c.at(4000), 9500u);
  EXPECT_EQ(c.offset_ms(4000), 5500);
  c.apply(1.0, 1000, 4000);  // a new bump after the clear counts from zero again
  EXPECT_EQ(c.at(4000), 10'500u);
  std::uint64_t last = 0;
  for (std::uint64_t t = 4000; t < 5000; t += 7) {
    EXPECT_GE(c.at(t), last);
    last = c.at(t);
  }
}

}  // namespace
}  // namespace tessera::mesh::runtime
