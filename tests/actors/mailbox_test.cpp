#include "actors/mailbox.hpp"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/actors/test_support.hpp"

namespace tessera::actors {
namespace {

message_node* make(std::uint64_t seq, lane l = lane::data) {
  auto* n = new typed_node<test::ping>(test::ping{seq});
  n->lane_ = l;
  return n;
}

TEST(Mailbox, DataLaneFullTellsTheSenderAndKeepsEverythingQueued) {
  mailbox box(2, 1);
  ASSERT_TRUE(box.push(make(1)));
  ASSERT_TRUE(box.push(make(2)));
  message_node* third = make(3);
  auto r = box.push(third);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::overloaded);
  delete third;  // refused: the sender still owns it
  EXPECT_EQ(box.size(), 2u);
  for (std::uint64_t want : {1u, 2u}) {
    std::unique_ptr<message_node> n(box.pop());
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(static_cast<test::ping*>(n->payload())->seq, want);
  }
  EXPECT_EQ(box.pop(), nullptr);
}

TEST(Mailbox, ControlLaneHasItsOwnBoundAndIsServedFirst) {
  mailbox box(1, 1);
  ASSERT_TRUE(box.push(make(1)));
  ASSERT_TRUE(box.push(make(100, lane::control)));
  message_node* extra = make(101, lane::control);
  auto r = box.push(extra);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::overloaded);
  delete extra;
  std::unique_ptr<message_node> first(box.pop());
  EXPECT_EQ(static_cast<test::ping*>(first->payload())->seq, 100u);
  std::unique_ptr<message_node> second(box.pop());
  EXPECT_EQ(static_cast<test::ping*>(second->payload())->seq, 1u);
}

TEST(Mailbox, ResponsesBypassTheDataBoundButNotClose) {
  mailbox box(1, 1);
  ASSERT_TRUE(box.push(make(1)));
  ASSERT_TRUE(box.push(make(2), /*bypass_bound=*/true));
  box.close();
  message_node* late = make(3);
  auto r = box.push(late, true);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::closed);
  delete late;
  EXPECT_EQ(box.size(), 2u);
}

TEST(Mailbox, ManyProducersOneConsumerLoseNothingAndKeepPerProducerOrder) {
  constexpr int producers = 4, per = 5000;
  mailbox box(producers * per, 16);
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&box, p] {
      for (int i = 0; i < per; ++i) {
        ASSERT_TRUE(box.push(make(static_cast<std::uint64_t>(p) << 32 | static_cast<unsigned>(i))));
      }
    });
  }
  std::vector<std::int64_t> last(producers, -1);
  int got = 0;
  while (got < producers * per) {
    std::unique_ptr<message_node> n(box.pop());
    if (!n) continue;
    auto seq = static_cast<test::ping*>(n->payload())->seq;
    auto p = static_cast<std::size_t>(seq >> 32);
    auto i = static_cast<std::int64_t>(seq & 0xffffffffu);
    EXPECT_GT(i, last[p]);
    last[p] = i;
    ++got;
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(box.size(), 0u);
}

}  // namespace
}  // namespace tessera::actors
