// node_pool: recycles the memory of message nodes (every send allocates one, its receiver frees
// it, often on another thread).
//
// Blocks come in size classes of 64 bytes up to `max_block_bytes`; larger nodes use the global
// allocator. Each thread keeps a cache per class; a thread frees into its own cache, so blocks
// flow from receivers' caches back to senders in batches through a shared pool:
//  - thread cache full (`thread_cache_limit` blocks of a class) -> `batch_blocks` of them move
//    to the shared pool as one batch (one lock per batch, not per message);
//  - thread cache empty -> one batch comes back from the shared pool, else a fresh block;
//  - shared pool full (`shared_bytes_limit` of a class) -> the batch goes back to the global
//    allocator. So the memory the pool holds is bounded, whatever the traffic: at most
//    class_count * shared_bytes_limit shared plus thread_cache_limit blocks per class per thread.
//    The shared bound is sized for bursts (a fan-in leaves tens of thousands of nodes in flight
//    and then frees them all at once): smaller, and a burst's nodes all come from malloc again.
// A thread's cache goes back to the global allocator when the thread exits.
//
// Under AddressSanitizer the pool is off (`enabled` is false): every node is a plain new/delete,
// so ASan keeps catching a use of a node after it was freed.
#pragma once

#include <cstddef>

namespace tessera::actors::node_pool {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool enabled = false;
#else
inline constexpr bool enabled = true;
#endif

inline constexpr std::size_t granule_bytes = 64;
inline constexpr std::size_t max_block_bytes = 256;
inline constexpr std::size_t class_count = max_block_bytes / granule_bytes;
/// Blocks of one class a thread keeps before it hands a batch to the shared pool.
inline constexpr std::size_t thread_cache_limit = 256;
/// Blocks moved between a thread cache and the shared pool at once.
inline constexpr std::size_t batch_blocks = 64;
/// Bytes of one class the shared pool keeps; more go back to the global allocator.
inline constexpr std::size_t shared_bytes_limit = std::size_t{16} << 20;
/// The same bound in batches for the class of `bytes` (block size rounded up to the class).
constexpr std::size_t shared_batch_limit(std::size_t bytes) noexcept {
  return shared_bytes_limit / (batch_blocks * ((bytes - 1) / granule_bytes + 1) * granule_bytes);
}

/// A block of at least `bytes` (a pooled one when bytes <= max_block_bytes). Throws bad_alloc.
void* allocate(std::size_t bytes);
/// Returns a block from allocate(bytes) (same `bytes`) from any thread.
void deallocate(void* block, std::size_t bytes) noexcept;

/// What the pool holds for the size class of `bytes` (tests and diagnostics).
struct usage {
  std::size_t this_thread_blocks = 0;  ///< in the calling thread's cache
  std::size_t shared_batches = 0;      ///< in the shared pool
};
[[nodiscard]] usage current_usage(std::size_t bytes) noexcept;

}  // namespace tessera::actors::node_pool
