// node_pool: the bounds on what it keeps, and that blocks come back.
#include "actors/node_pool.hpp"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace tessera::actors {
namespace {

constexpr std::size_t block = 64;

TEST(NodePool, ThreadCacheAndSharedPoolStayWithinTheirBounds) {
  // More blocks than the thread cache and the shared pool together can keep.
  std::size_t n = node_pool::shared_batch_limit(block) * node_pool::batch_blocks +
                  node_pool::thread_cache_limit + 1000;
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < n; ++i) blocks.push_back(node_pool::allocate(block));
  for (void* b : blocks) node_pool::deallocate(b, block);
  auto u = node_pool::current_usage(block);
  if (!node_pool::enabled) {  // AddressSanitizer build: plain new/delete, nothing kept
    EXPECT_EQ(u.this_thread_blocks, 0u);
    EXPECT_EQ(u.shared_batches, 0u);
    return;
  }
  EXPECT_LE(u.this_thread_blocks, node_pool::thread_cache_limit);
  EXPECT_EQ(u.shared_batches, node_pool::shared_batch_limit(block));  // full; surplus freed
}

TEST(NodePool, FreedBlocksAreReusedAcrossThreads) {
  if (!node_pool::enabled) GTEST_SKIP() << "pool off under AddressSanitizer";
  // Another thread frees a full cache's worth and more: the surplus reaches the shared pool as
  // batches, and this thread's allocations are then served from it.
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < 4 * node_pool::thread_cache_limit; ++i) {
    blocks.push_back(node_pool::allocate(block));
  }
  std::thread freer([&] {
    for (void* b : blocks) node_pool::deallocate(b, block);
  });
  freer.join();
  // Drain this thread's cache, then allocations must come out of the shared batches.
  std::vector<void*> mine;
  while (node_pool::current_usage(block).this_thread_blocks > 0) {
    mine.push_back(node_pool::allocate(block));
  }
  std::size_t shared_before = node_pool::current_usage(block).shared_batches;
  ASSERT_GT(shared_before, 0u);
  mine.push_back(node_pool::allocate(block));
  EXPECT_EQ(node_pool::current_usage(block).shared_batches, shared_before - 1);
  EXPECT_EQ(node_pool::current_usage(block).this_thread_blocks, node_pool::batch_blocks - 1);
  for (void* b : mine) node_pool::deallocate(b, block);
}

TEST(NodePool, SizesAboveTheLargestClassBypassThePool) {
  auto before = node_pool::current_usage(node_pool::max_block_bytes + 1);
  void* big = node_pool::allocate(node_pool::max_block_bytes + 1);
  ASSERT_NE(big, nullptr);
  node_pool::deallocate(big, node_pool::max_block_bytes + 1);
  auto after = node_pool::current_usage(node_pool::max_block_bytes + 1);
  EXPECT_EQ(after.this_thread_blocks, before.this_thread_blocks);
  EXPECT_EQ(after.this_thread_blocks, 0u);
}

}  // namespace
}  // namespace tessera::actors
