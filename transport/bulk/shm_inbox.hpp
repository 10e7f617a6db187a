// The shm backend's inbox: the layout of the memfd that one process owns and its peer maps (the
// ring's slots, the registration table, the header), with the helpers that the link (shm.cpp)
// and its set-up (shm_setup.cpp) share. shm.cpp's opening comment explains the protocol.
// Internal to transport/bulk: included by those two files only.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "transport/bulk/backends.hpp"

namespace tessera::transport::bulk::detail::shm {

using clock = std::chrono::steady_clock;

inline constexpr std::uint32_t inbox_magic = 0x54425348;  // "TBSH"
// The inbox layout and ring protocol, in the header's `version`. 4: a slot may carry a group of
// writes from one post_writes() list (slot_write_list). 3: the header says whether its owner can
// run membarrier(GLOBAL_EXPEDITED) before it sleeps (fence-free publishes). 2: slots carry their
// sequence number, no head index. (1 was the ring with a head index; the field then held
// connect_params' version, also 1.)
inline constexpr std::uint32_t inbox_format = 4;
inline constexpr std::uint32_t slot_write = 1;  // one write: imm and bytes in the slot_head
inline constexpr std::uint32_t slot_send = 2;   // one send: its bytes in the payload
// slot_head.imm writes: a list_record each, in order
inline constexpr std::uint32_t slot_write_list = 3;

struct inbox_header {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint64_t owner_nonce;
  std::uint32_t depth;         // slots in the ring
  std::uint32_t slot_payload;  // bytes per slot (the owner's max_send_bytes)
  std::uint32_t max_buffers;   // entries in the registration table
  // 1: the owner registered for membarrier(GLOBAL_EXPEDITED) and runs it before it sleeps, so a
  // producer that registered too may publish without a fence (asymmetric handshake, see wait()).
  std::uint32_t fence_free;
  std::atomic<std::uint64_t> attached_nonce;  // the producer's nonce once it mapped us
  std::atomic<std::uint32_t> closed;          // set by the producer when it closes its end
  std::atomic<std::uint32_t> sleeping;        // consumer is (about to be) in futex_wait
  std::atomic<std::uint32_t> doorbell;        // futex word
  alignas(64) std::atomic<std::uint64_t> tail;  // written by the consumer
  alignas(64) char end[1];
};

struct reg_entry {
  std::atomic<std::uint32_t> rkey;  // 0 = not a write target
  std::int32_t fd;                  // the shared_buffer's memfd in the owner's process
  std::uint64_t size;
};

struct slot_head {
  std::uint32_t kind;
  std::uint32_t imm;
  std::uint64_t bytes;
};

// One write of a slot_write_list slot, in its payload (at slot_fields, packed, in list order).
struct list_record {
  std::uint32_t imm;
  std::uint32_t reserved;
  std::uint64_t bytes;
};

// A slot's sequence number comes first, then its slot_head, then the payload.
inline constexpr std::size_t slot_head_offset = sizeof(std::uint64_t);
inline constexpr std::size_t slot_fields = slot_head_offset + sizeof(slot_head);

// Writes one slot of `payload` bytes can carry: at least 1 (a plain slot_write, for slots too
// small to hold two records).
inline std::size_t records_per_slot(std::uint32_t payload) {
  return std::max<std::size_t>(1, payload / sizeof(list_record));
}
inline std::atomic<std::uint64_t>* slot_seq(std::byte* slot) {
  return std::launder(reinterpret_cast<std::atomic<std::uint64_t>*>(slot));
}

static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

inline std::size_t table_offset() { return offsetof(inbox_header, end); }
inline std::size_t slot_stride(std::uint32_t payload) {
  return (slot_fields + payload + 63) / 64 * 64;
}
inline std::size_t slots_offset(std::uint32_t buffers) {
  return (table_offset() + buffers * sizeof(reg_entry) + 63) / 64 * 64;
}
inline std::size_t inbox_bytes(std::uint32_t depth, std::uint32_t payload, std::uint32_t buffers) {
  return slots_offset(buffers) + depth * slot_stride(payload);
}
// The largest inbox either side may announce (prepare_shm_link refuses larger limits): keeps
// inbox_bytes() from overflowing on a forged header.
inline constexpr std::uint32_t max_geometry = 1u << 24;
inline constexpr std::uint32_t max_slot_payload = 1u << 30;

struct inbox_view {
  std::byte* base = nullptr;
  std::size_t size = 0;
  // The ring's geometry, read once (our own limits, or the peer's header checked against the
  // mapping's size at connect) and never again from the shared header, which the other process
  // can write: a depth or a table size changed later must not move our accesses out of the mapping.
  std::uint32_t depth = 0;
  std::uint32_t slot_payload = 0;
  std::uint32_t max_buffers = 0;
  std::size_t first_slot = 0;
  std::size_t stride = 0;

  static inbox_view of(std::byte* base, std::size_t size, std::uint32_t depth,
                       std::uint32_t payload, std::uint32_t buffers) {
    return {base, size, depth, payload, buffers, slots_offset(buffers), slot_stride(payload)};
  }
  inbox_header* header() const { return reinterpret_cast<inbox_header*>(base); }
  reg_entry* table() const { return reinterpret_cast<reg_entry*>(base + table_offset()); }
  // The slot at ring position `pos` (< depth). The link keeps positions beside its sequence
  // numbers and wraps them by comparison, so no division sits on the hot path.
  std::byte* slot(std::uint32_t pos) const { return base + first_slot + pos * stride; }
};

// The liveness checks' clock: CLOCK_MONOTONIC_COARSE is read from the vDSO without a TSC read (a
// few loads, where steady_clock costs ~25 ns here, half a 4 KiB memcpy, and the checks sit on
// every post and every empty poll). It moves once per kernel tick (1-4 ms), so "once a
// millisecond" below means once a tick: a dead peer is noticed that much later, still bounded.
inline std::chrono::nanoseconds coarse_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

inline long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value,
                  const timespec* ts) {
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, ts, nullptr, 0);
}

inline error shm_error(errc code, std::string_view what) {
  return make_error(code, "bulk shm: {}: {}", what, std::strerror(errno));
}

// Maps /proc/<pid>/fd/<fd>-style paths.
inline result<inbox_view> map_path(const std::string& path, std::size_t expect_min) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return shm_error(errc::io, fmt::format("open {}", path));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < expect_min) {
    ::close(fd);
    return make_error(errc::protocol, "bulk shm: {} is smaller than expected ({} bytes)", path,
                      expect_min);
  }
  void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return shm_error(errc::io, fmt::format("mmap {}", path));
  return inbox_view{static_cast<std::byte*>(p), static_cast<std::size_t>(st.st_size)};
}

struct local_registration {
  std::byte* addr = nullptr;
  std::uint64_t size = 0;
  bool shared = false;  // a write target the peer can map
  bool used = false;
};

struct peer_mapping {
  std::uint32_t rkey = 0;
  std::byte* addr = nullptr;
  std::size_t size = 0;
};

/// The link over our inbox `own` (its memfd `own_fd`) and the peer's `peer`, mapped and checked
/// by the set-up; `peer_pidfd` tells when the peer process exits. Takes ownership of the
/// mappings and descriptors.
std::unique_ptr<link> make_link(inbox_view own, int own_fd, inbox_view peer, int peer_pidfd,
                                std::int32_t peer_pid, const link_options& options,
                                bool fence_free);

}  // namespace tessera::transport::bulk::detail::shm
