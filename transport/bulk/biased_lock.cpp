#include "transport/bulk/biased_lock.hpp"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "actors/base/assert.hpp"

namespace tessera::transport::bulk::detail {
namespace {

long membarrier(int cmd) { return ::syscall(SYS_membarrier, cmd, 0u, 0); }

membarrier_caps probe_membarrier() {
  membarrier_caps caps;
  const long mask = membarrier(MEMBARRIER_CMD_QUERY);
  if (mask < 0) return caps;  // no membarrier (old kernel, or a seccomp filter): fences stay
  if ((mask & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
      (mask & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) {
    caps.private_expedited = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  }
  if ((mask & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0 &&
      (mask & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0) {
    // Registered, and the call itself allowed (it is what a peer of ours runs before it sleeps).
    caps.global_expedited = membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0 &&
                            membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
  }
  return caps;
}

}  // namespace

const membarrier_caps& membarrier_support() noexcept {
  static const membarrier_caps caps = probe_membarrier();
  return caps;
}

bool membarrier_private() noexcept {
  return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

bool membarrier_global() noexcept { return membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0; }

bool spin_step(std::uint32_t i) noexcept {
  if ((i & 15) != 15) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    return false;
  }
  ::sched_yield();
  return true;
}

void spin_lock::lock_slow() noexcept {
  for (std::uint32_t i = 0; !try_lock(); ++i) {
    if (i < 64) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else if (i < 1024) {
      ::sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

biased_lock::biased_lock(bool allow_bias) noexcept
    : state_(allow_bias && membarrier_support().private_expedited ? biased : revoked) {}

void biased_lock::lock_slow(const void* me) noexcept {
  // The owner gets here only once the bias is gone (it backed off, so it is in no critical
  // section of its own) and may take the spin_lock at once. Anyone else must first see `revoked`:
  // until then the owner may still be inside.
  if (owner_.load(std::memory_order_relaxed) != me) {
    if (state_.load(std::memory_order_acquire) == biased) {
      const void* none = nullptr;
      if (owner_.compare_exchange_strong(none, me, std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
        lock();  // the first thread here: now the owner, it takes the fast path
        return;
      }
      std::uint32_t expected = biased;
      if (state_.compare_exchange_strong(expected, revoking, std::memory_order_acq_rel)) {
        // Registered at construction (or the lock would be revoked already), so this cannot
        // fail: the kernel refuses only unregistered or unknown commands.
        const bool ordered = membarrier_private();
        TESSERA_ASSERT(ordered, "membarrier(PRIVATE_EXPEDITED) failed after registering");
        for (std::uint32_t i = 0; owner_in_.load(std::memory_order_acquire); ++i) spin_step(i);
        state_.store(revoked, std::memory_order_release);
      }
    }
    for (std::uint32_t i = 0; state_.load(std::memory_order_acquire) != revoked; ++i) {
      spin_step(i);
    }
  }
  fallback_.lock();
}

}  // namespace tessera::transport::bulk::detail
