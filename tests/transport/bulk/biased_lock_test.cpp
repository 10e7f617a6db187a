// The shm link's locks (transport/bulk/biased_lock.hpp): mutual exclusion while the first thread
// holds the bias, across the moment another thread revokes it, and after.
#include "transport/bulk/biased_lock.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using tessera::transport::bulk::detail::biased_lock;
using tessera::transport::bulk::detail::membarrier_support;

// A critical section whose read and write are `spin` steps apart: two threads inside at once
// lose increments. The owner's are long (a few microseconds, longer than the revoker's
// membarrier), so a revoker that did not wait for it would be inside with it (checked: with that
// wait removed, counts came out short).
volatile int delay_sink = 0;
void bump(std::uint64_t& counter, int spin = 20) {
  const std::uint64_t seen = counter;
  for (int i = 0; i < spin; ++i) delay_sink = i;
  counter = seen + 1;
}

TEST(biased_lock, the_first_thread_keeps_the_bias_while_it_is_alone) {
  biased_lock lock;
  std::uint64_t counter = 0;
  for (int i = 0; i < 10000; ++i) {
    std::lock_guard g(lock);
    bump(counter);
  }
  EXPECT_EQ(counter, 10000u);
  // Without membarrier(PRIVATE_EXPEDITED) the lock is a spin_lock from the start.
  EXPECT_EQ(lock.is_biased(), membarrier_support().private_expedited);
}

TEST(biased_lock, threads_that_join_the_owner_revoke_the_bias_and_lose_no_update) {
  // Each round: the owner takes the lock in a loop, and three more threads start while it is
  // inside, so the revocation meets an owner at every point of its fast path.
  constexpr int rounds = 20;
  constexpr int per_thread = 500;
  for (int round = 0; round < rounds; ++round) {
    biased_lock lock;
    std::uint64_t counter = 0;
    std::atomic<bool> owner_started{false};
    std::thread owner([&] {
      for (int i = 0; i < per_thread; ++i) {
        std::lock_guard g(lock);
        owner_started.store(true, std::memory_order_release);
        bump(counter, 5000);
      }
    });
    while (!owner_started.load(std::memory_order_acquire)) std::this_thread::yield();
    std::vector<std::thread> others;
    for (int t = 0; t < 3; ++t) {
      others.emplace_back([&] {
        for (int i = 0; i < per_thread; ++i) {
          std::lock_guard g(lock);
          bump(counter);
        }
      });
    }
    owner.join();
    for (auto& t : others) t.join();
    ASSERT_EQ(counter, 4u * per_thread) << "round " << round;
    EXPECT_FALSE(lock.is_biased());
  }
}

TEST(biased_lock, without_bias_it_is_a_plain_lock_from_the_start) {
  biased_lock lock(false);
  EXPECT_FALSE(lock.is_biased());
  std::uint64_t counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        std::lock_guard g(lock);
        bump(counter);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, 8000u);
}

}  // namespace
