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
  box.settle();  // the owner does this at the end of every turn
  EXPECT_EQ(box.size(), 0u);
}

TEST(Mailbox, TheBoundIsExactNearTheLimitAndTheCountCatchesUpOnSettle) {
  // A slot freed by a pop is there for the next push even before the owner settles.
  mailbox small(100, 4);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(small.push(make(i)));
  message_node* refused = make(100);
  ASSERT_FALSE(small.push(refused));
  std::unique_ptr<message_node> first(small.pop());
  ASSERT_NE(first, nullptr);
  auto again = small.push(refused);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(small.size(), 100u);
  while (std::unique_ptr<message_node> n{small.pop()}) {
  }
  small.settle();
  EXPECT_EQ(small.size(), 0u);

  // Pops are subtracted off the counter a batch at a time; size() takes the rest off too.
  mailbox big(10'000, 4);
  for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_TRUE(big.push(make(i)));
  for (std::uint64_t i = 0; i < 10; ++i) {
    std::unique_ptr<message_node> n(big.pop());
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(static_cast<test::ping*>(n->payload())->seq, i);
    EXPECT_EQ(big.size(), 1000u - i - 1);
  }
  big.settle();
  EXPECT_EQ(big.size(), 990u);
  for (std::uint64_t i = 10; i < 1000; ++i) {
    std::unique_ptr<message_node> n(big.pop());
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(static_cast<test::ping*>(n->payload())->seq, i);
  }
  EXPECT_EQ(big.pop(), nullptr);
  big.settle();
  EXPECT_EQ(big.size(), 0u);
}

TEST(Mailbox, PopsNotYetSettledFreeTheirSlotsForSendersAtTheBound) {
  // The owner popped 50 messages (fewer than a settle batch) far from the bound and has not
  // settled — preempted mid-turn, say — while senders fill the lane: every slot up to the bound
  // is accepted, then the bound holds exactly. (Once, the counter alone refused the last 49: a
  // sender that ignored the refusal lost its message, and a fan-in sized to its batch hung.)
  constexpr std::size_t capacity = 1000;
  constexpr std::uint64_t first = 100, popped = 50;
  static_assert(popped < mailbox::settle_batch);
  mailbox box(capacity, 4);
  for (std::uint64_t i = 0; i < first; ++i)
    ASSERT_TRUE(box.push(make(i)));
  for (std::uint64_t i = 0; i < popped; ++i) {
    std::unique_ptr<message_node> n(box.pop());
    ASSERT_NE(n, nullptr);
  }
  EXPECT_EQ(box.size(), first - popped);
  const std::uint64_t room = capacity - (first - popped);
  for (std::uint64_t i = 0; i < room; ++i) {
    auto r = box.push(make(first + i));
    ASSERT_TRUE(r) << "push " << i << " of " << room << ": " << r.error().message;
  }
  message_node* over = make(9999);
  auto refused = box.push(over);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::overloaded);
  delete over;
  EXPECT_EQ(box.size(), capacity);
  box.settle();
  EXPECT_EQ(box.size(), capacity);
  for (std::uint64_t i = popped; i < first + room; ++i) {
    std::unique_ptr<message_node> n(box.pop());
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(static_cast<test::ping*>(n->payload())->seq, i);
  }
  EXPECT_EQ(box.pop(), nullptr);
}

}  // namespace
}  // namespace tessera::actors
