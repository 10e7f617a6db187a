#include "actors/node_pool.hpp"

#include <algorithm>
#include <array>
#include <mutex>
#include <new>
#include <vector>

namespace tessera::actors::node_pool {
namespace {

// Free blocks are kept as arrays of pointers, not as lists linked through the blocks: taking one
// then reads no block memory (a block freed by another core is cold in this one's cache; a list
// would pay that miss on every allocation just to find the next free block).
using batch = std::array<void*, batch_blocks>;
static_assert(batch_blocks <= thread_cache_limit, "a batch must fit in an empty thread cache");

std::size_t class_of(std::size_t bytes) noexcept { return (bytes - 1) / granule_bytes; }
std::size_t class_bytes(std::size_t c) noexcept { return (c + 1) * granule_bytes; }

struct shared_pool {
  std::mutex mutex;
  std::array<std::vector<batch>, class_count> batches;
};

// Never destroyed: threads (and static destructors) may free nodes until the very end.
shared_pool& shared() {
  static shared_pool* pool = new shared_pool;
  return *pool;
}

struct class_cache {
  std::array<void*, thread_cache_limit> blocks;
  std::size_t count = 0;
};

struct thread_cache {
  std::array<class_cache, class_count> classes{};
  ~thread_cache();
};

// Set once this thread's cache is destroyed (trivially destructible, so readable after that):
// later frees on this thread go straight to the global allocator.
thread_local bool tl_cache_gone = false;
thread_local thread_cache tl_cache;

thread_cache::~thread_cache() {
  tl_cache_gone = true;
  for (auto& c : classes) {
    for (std::size_t i = 0; i < c.count; ++i) ::operator delete(c.blocks[i]);
    c.count = 0;
  }
}

void give_batch(std::size_t c, const batch& b) noexcept {
  {
    std::lock_guard lock(shared().mutex);
    auto& v = shared().batches[c];
    if (v.size() < shared_batch_limit(class_bytes(c))) {
      try {
        v.push_back(b);
        return;
      } catch (const std::bad_alloc&) {
        // No room to keep the batch: free its blocks below.
      }
    }
  }
  for (void* block : b) ::operator delete(block);  // the bound: surplus goes back to the system
}

bool take_batch(std::size_t c, class_cache& into) noexcept {
  std::lock_guard lock(shared().mutex);
  auto& v = shared().batches[c];
  if (v.empty()) return false;
  const batch& b = v.back();
  std::copy(b.begin(), b.end(), into.blocks.begin() + static_cast<std::ptrdiff_t>(into.count));
  into.count += batch_blocks;
  v.pop_back();
  return true;
}

}  // namespace

void* allocate(std::size_t bytes) {
  if (!enabled || bytes == 0 || bytes > max_block_bytes || tl_cache_gone) {
    return ::operator new(bytes == 0 ? 1 : bytes);
  }
  std::size_t c = class_of(bytes);
  class_cache& cache = tl_cache.classes[c];
  if (cache.count == 0 && !take_batch(c, cache)) return ::operator new(class_bytes(c));
  return cache.blocks[--cache.count];
}

void deallocate(void* block, std::size_t bytes) noexcept {
  if (block == nullptr) return;
  if (!enabled || bytes == 0 || bytes > max_block_bytes || tl_cache_gone) {
    ::operator delete(block);
    return;
  }
  std::size_t c = class_of(bytes);
  class_cache& cache = tl_cache.classes[c];
  if (cache.count == thread_cache_limit) {
    // The bound: batch_blocks of them go to the shared pool in one locked step.
    batch out;
    cache.count -= batch_blocks;
    std::copy_n(cache.blocks.begin() + static_cast<std::ptrdiff_t>(cache.count), batch_blocks,
                out.begin());
    give_batch(c, out);
  }
  cache.blocks[cache.count++] = block;
}

usage current_usage(std::size_t bytes) noexcept {
  if (bytes == 0 || bytes > max_block_bytes) return {};
  std::size_t c = class_of(bytes);
  usage u;
  if (!tl_cache_gone) u.this_thread_blocks = tl_cache.classes[c].count;
  std::lock_guard lock(shared().mutex);
  u.shared_batches = shared().batches[c].size();
  return u;
}

}  // namespace tessera::actors::node_pool
