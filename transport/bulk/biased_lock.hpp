// Locks for the shm link's hot paths, and the membarrier() calls that let them (and the link's
// sleep handshake) go without a fence.
//
// Why: on x86 every atomic read-modify-write is a full fence. Right after a post has copied its
// message and published its slot, the store buffer holds stores to a cache line the consuming
// core is polling; a fence waits for that line to come back, about one cross-core transfer per
// message (40-100 ns on the 2-vCPU guests here, as long as a 4 KiB memcpy). Without a fence the
// stores drain while the next message is copied. membarrier() moves the fence's cost to the rare
// side: a thread that needs the ordering (a second thread wanting a biased lock, a consumer about
// to sleep) asks the kernel to run a full barrier on every CPU that runs a thread of the process
// (or of every registered process), which turns the other side's compiler barrier into a fence.
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera::transport::bulk::detail {

/// What membarrier() offers this process, probed and registered once (the first call).
struct membarrier_caps {
  /// MEMBARRIER_CMD_PRIVATE_EXPEDITED registered: biased_lock can revoke a bias.
  bool private_expedited = false;
  /// MEMBARRIER_CMD_GLOBAL_EXPEDITED registered and callable: our fence-free stores are ordered by
  /// a barrier that any process (a peer about to sleep) requests.
  bool global_expedited = false;
};
[[nodiscard]] const membarrier_caps& membarrier_support() noexcept;

/// A full barrier on every CPU running a thread of this process. False when the call failed.
bool membarrier_private() noexcept;
/// A full barrier on every CPU running a thread of a process registered for global expedited
/// membarrier (this one included, when it registered). False when the call failed.
bool membarrier_global() noexcept;

/// One step of a spin loop: a pause, and on every 16th step a yield instead, so a thread sharing
/// our vCPU gets to run (spinning alone cannot make it hurry). True on those steps: the caller's
/// moment to read the clock.
bool spin_step(std::uint32_t i) noexcept;

/// A test-and-test-and-set lock released by a plain store (std::mutex's unlock is an atomic
/// exchange). Held for a bounded time by its users (a poll, or a post whose copy is bounded). A
/// waiter spins briefly, then yields (a holder that shares its vCPU gets to run), then sleeps in
/// 50 us steps.
class spin_lock {
 public:
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) &&
           !held_.exchange(true, std::memory_order_acquire);
  }
  void lock() noexcept {
    if (!try_lock()) lock_slow();
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  void lock_slow() noexcept;
  std::atomic<bool> held_{false};
};

/// A lock biased towards the first thread that takes it. That thread (the owner) takes and
/// releases it with plain stores and a load: no read-modify-write, no fence. The first time
/// another thread wants it, that thread revokes the bias for good: it marks the lock revoking,
/// runs membarrier(PRIVATE_EXPEDITED) so that an owner inside its critical section is seen,
/// waits for the owner to leave, and from then on every thread, the owner too, takes a
/// spin_lock. Without membarrier(PRIVATE_EXPEDITED) the lock is a spin_lock from the start.
///
///   owner:  in = 1; compiler barrier; state == biased? -> critical section; in = 0
///                                      else: in = 0, spin_lock
///   other:  state: biased -> revoking; membarrier; wait until in == 0; state = revoked;
///           spin_lock
///
/// The membarrier makes the pair a Dekker handshake: either the owner sees `revoking` and backs
/// off, or the revoker sees in == 1 and waits for the owner's release (a release store, so the
/// owner's critical section happens-before the revoker's).
///
/// The owner is the thread that first calls lock(): a link set up on one thread and used on
/// another revokes once, at its first use there, and then runs on the spin_lock.
class biased_lock {
 public:
  /// `allow_bias` false: a spin_lock from the start (comparison runs, link_options).
  explicit biased_lock(bool allow_bias = true) noexcept;

  void lock() noexcept {
    const void* me = &thread_token;
    if (owner_.load(std::memory_order_relaxed) == me) {
      owner_in_.store(true, std::memory_order_relaxed);
      // Only the compiler must not reorder the store and the load; a revoker's membarrier orders
      // them on the CPU.
      std::atomic_signal_fence(std::memory_order_seq_cst);
      if (state_.load(std::memory_order_relaxed) == biased) return;
      owner_in_.store(false, std::memory_order_release);
    }
    lock_slow(me);
  }

  void unlock() noexcept {
    if (owner_.load(std::memory_order_relaxed) == &thread_token &&
        owner_in_.load(std::memory_order_relaxed)) {
      owner_in_.store(false, std::memory_order_release);
      return;
    }
    fallback_.unlock();
  }

  /// True while the bias holds (tests).
  [[nodiscard]] bool is_biased() const noexcept {
    return state_.load(std::memory_order_acquire) == biased;
  }

 private:
  static constexpr std::uint32_t biased = 0;
  static constexpr std::uint32_t revoking = 1;
  static constexpr std::uint32_t revoked = 2;
  // One per thread; its address identifies the thread (a thread started after the owner ended
  // may get the same address and become the owner: the old one is gone, so that is safe).
  static inline thread_local char thread_token = 0;

  void lock_slow(const void* me) noexcept;

  std::atomic<const void*> owner_{nullptr};
  std::atomic<std::uint32_t> state_{biased};
  std::atomic<bool> owner_in_{false};  // written only by the owner
  spin_lock fallback_;
};

}  // namespace tessera::transport::bulk::detail
