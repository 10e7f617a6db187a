// shm backend: two processes on one host.
//
// Each side owns an *inbox*: a memfd holding a header, a registration table and a single-producer
// single-consumer ring of fixed slots. The peer maps it through /proc/<pid>/fd/<n> and is its only
// producer. A write_with_imm() copies straight from the source into the peer's registered
// shared_buffer (also mapped through /proc/<pid>/fd/<n>: one memcpy, as RDMA does one DMA) and
// then publishes a slot {imm, bytes}; a send() copies its bytes into the slot. A slot is published
// by storing its sequence number (index + 1) last, and the consumer polls the next slot's: there
// is no shared head index, so one cache line moves to the consumer's core per message, not two
// (4 KiB writes went 20-27% faster than with a head index). wait() spins, then sleeps on a futex in
// the inbox that the producer rings only when the consumer said it is asleep, so the fast path has
// no system call. Where both processes can use membarrier() (each inbox header says so), the fast
// path has no fence either: the post and poll locks are biased towards their first thread, and
// the sleep handshake is asymmetric (publish_then_wake(), wait()).
//
//   inbox: | header | reg_entry[max_buffers] | slot[depth] |
//   slot:  | seq (u64) | slot_head (16 bytes) | slot_payload bytes |   (64-byte aligned)
//
// A post_writes() list publishes its writes in groups, one slot per group (slot_write_list: the
// payload holds each write's {imm, bytes}), so a list moves a few lines to the reader, not one per
// write. The receive bound (max_received) is therefore a bound on slots: up to max_received
// single writes or sends, more writes when they come in lists; memory stays the ring's.
//
// Liveness: a pidfd of the peer (readable once it exits) is checked by a poll that finds nothing
// (at most once per millisecond; every 10 ms slice in wait()) and every 16th post (at most once
// per millisecond); a peer that closes sets `closed` in our header. Either takes the link down
// after the slots already published.
//
// This file is the link; shm_inbox.hpp the inbox layout; shm_setup.cpp the set-up (mapping and
// checking the peer's inbox).
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "transport/bulk/backends.hpp"
#include "transport/bulk/biased_lock.hpp"
#include "transport/bulk/completion_queue.hpp"
#include "transport/bulk/shm_inbox.hpp"

namespace tessera::transport::bulk::detail::shm {
namespace {

class shm_link final : public link {
 public:
  shm_link(inbox_view own, int own_fd, inbox_view peer, int peer_pidfd, std::int32_t peer_pid,
           const link_options& options, bool fence_free)
      : own_(own),
        own_fd_(own_fd),
        peer_(peer),
        peer_pidfd_(peer_pidfd),
        peer_pid_(peer_pid),
        options_(options),
        fence_free_(fence_free),
        local_(options.limits.max_received, options.limits.max_outstanding, options.spin_us),
        mutex_(options.shm_fence_free),
        done_(options.limits.max_outstanding),
        list_copies_(options.limits.max_outstanding),
        regs_(options.limits.max_buffers),
        peer_maps_(peer.max_buffers),
        consumer_mutex_(options.shm_fence_free) {}

  ~shm_link() override {
    close();
    for (auto& m : peer_maps_) {
      if (m.addr != nullptr) ::munmap(m.addr, m.size);
    }
    ::munmap(peer_.base, peer_.size);
    ::munmap(own_.base, own_.size);
    ::close(own_fd_);
    ::close(peer_pidfd_);
  }

  backend_kind kind() const noexcept override { return backend_kind::shm; }
  const link_limits& limits() const noexcept override { return options_.limits; }

  result<buffer_handle> register_buffer(void* addr, std::size_t size) override {
    return add_registration(static_cast<std::byte*>(addr), size, -1);
  }

  result<buffer_handle> register_buffer(const shared_buffer& buffer) override {
    return add_registration(buffer.data(), buffer.size(), buffer.fd());
  }

  result<void> deregister_buffer(buffer_handle handle) override {
    std::lock_guard lock(mutex_);
    TESSERA_TRY(lookup_locked(handle));
    own_.table()[handle.id - 1].rkey.store(0, std::memory_order_release);
    regs_[handle.id - 1] = local_registration{};
    return ok();
  }

  result<remote_buffer> describe(buffer_handle handle) const override {
    std::lock_guard lock(mutex_);
    auto reg = lookup_locked(handle);
    if (!reg) return std::move(reg).error();
    if (!reg->shared) {
      return make_error(errc::unsupported,
                        "bulk shm: buffer {} is private memory; a write target must come from "
                        "bulk::allocate_buffer()",
                        handle.id);
    }
    const reg_entry& e = own_.table()[handle.id - 1];
    return remote_buffer{handle.id, static_cast<std::uint64_t>(e.fd),
                         e.rkey.load(std::memory_order_relaxed), e.size};
  }

  result<void> write_with_imm(buffer_handle local, std::uint64_t local_offset,
                              const remote_buffer& remote, std::uint64_t remote_offset,
                              std::uint64_t bytes, std::uint32_t imm,
                              std::uint64_t wr_id) override {
    // One lock for the whole post (registrations, the ring, the completion): with four locks to
    // post a write and two more to reap it (std::mutex, each lock and unlock an atomic
    // read-modify-write of 8-10 ns here), 4 KiB writes went at 22-23 GB/s, with this one and
    // poll's at 28-30.
    std::lock_guard lock(mutex_);
    // The common case checks with plain comparisons and builds no result<> on the way (a
    // result<T> per step, each holding an error with a std::string, made a post and its polls
    // cost ~105 ns on one core, more than a 4 KiB memcpy); anything unusual takes the slow calls,
    // which say what is wrong.
    const local_registration* src = find_locked(local);
    if (!write_fits(src, local_offset, remote, remote_offset, bytes)) {
      return refuse_write(local, local_offset, remote, remote_offset, bytes);
    }
    if (!done_has_room()) TESSERA_TRY(reserve_done());
    error why;
    std::byte* target = target_or_fail(remote, why);
    if (target == nullptr) return why;
    auto slot = claim_slot();
    if (!slot) return std::move(slot).error();
    if (bytes > 0) std::memcpy(target + remote_offset, src->addr + local_offset, bytes);
    publish(*slot, slot_write, imm, bytes);
    finish_local(completion_kind::write_done, wr_id, bytes);
    return ok();
  }

  result<void> post_writes(std::span<const write_request> writes) override {
    if (writes.empty()) return ok();
    if (writes.size() > done_.size()) {
      return make_error(errc::invalid_argument,
                        "post_writes: {} writes in one list exceed max_outstanding ({})",
                        writes.size(), done_.size());
    }
    std::lock_guard lock(mutex_);
    if (local_.is_down()) return down_error(local_.down_reason());
    // Every write is checked, and its target mapped, before any byte moves. Mapping is a cache
    // of the peer's registrations: one mapped for a list that is then refused costs nothing
    // later. A remote access error takes the link down, as it does for one write. A write that
    // names the same source and target as the one before it (a caller streaming chunks of one
    // tensor) reuses their lookups, which took a fifth of post_writes()' own time (perf).
    list_copy* const copies = list_copies_.data();
    const local_registration* src = nullptr;
    const remote_buffer* mapped_for = nullptr;  // the descriptor `target` was mapped for
    std::byte* target = nullptr;
    for (std::size_t i = 0; i < writes.size(); ++i) {
      const write_request& w = writes[i];
      if (src == nullptr || w.local.id != writes[i - 1].local.id) src = find_locked(w.local);
      if (!write_fits(src, w.local_offset, w.remote, w.remote_offset, w.bytes)) {
        return in_list(i, refuse_write(w.local, w.local_offset, w.remote, w.remote_offset,
                                       w.bytes).error());
      }
      if (mapped_for == nullptr || !(w.remote == *mapped_for)) {
        error why;
        target = target_or_fail(w.remote, why);
        if (target == nullptr) return in_list(i, why);
        mapped_for = &w.remote;
      }
      copies[i] = {target + w.remote_offset, src->addr + w.local_offset};
    }
    if (!done_has_room(writes.size())) TESSERA_TRY(reserve_done(writes.size()));
    if (auto alive = check_peer_alive(); !alive) return alive;
    // The writes share slots: one slot carries the immediates and sizes of up to
    // records_per_slot() writes (slot_write_list), so a list of 16 moves five cache lines (the
    // slot's head and 16 records) to the reader's core instead of 16 slot lines, each of which
    // had to come back from the reader before we could store into it again. Each group's bytes
    // are copied, then its slot filled and published; a ring that is full waits for the reader
    // only after what is already copied has been published.
    const std::uint64_t done_head = done_head_.load(std::memory_order_relaxed);
    const std::size_t per_slot = records_per_slot(peer_.slot_payload);
    // Locals, not members: a memcpy call may write any member, so members are loaded again
    // after every copy.
    local_done* const done = done_.data();
    const std::size_t done_size = done_.size();
    std::size_t done_pos = done_head % done_size;  // wrapped by comparison below: no division
    for (std::size_t first = 0; first < writes.size();) {
      const std::size_t last = std::min(writes.size(), first + per_slot);
      std::byte* slot = nullptr;
      if (published_ - peer_tail_seen_ < peer_.depth) {
        slot = peer_.slot(head_pos_);
      } else {
        auto claimed = wait_for_slot();
        if (!claimed) {
          finish_list(done_head, first);
          return make_error(claimed.error().code, "post_writes: {} of {} writes posted: {}",
                            first, writes.size(), claimed.error().message);
        }
        slot = *claimed;
      }
      // Ask for the slot's lines now, for writing, so that they travel while the bytes are
      // copied.
      const std::size_t slot_bytes = slot_fields + (last - first) * sizeof(list_record);
      for (std::size_t off = 0; off < slot_bytes; off += 64) __builtin_prefetch(slot + off, 1);
      for (std::size_t i = first; i < last; ++i) {
        const write_request& w = writes[i];
        if (w.bytes > 0) std::memcpy(copies[i].to, copies[i].from, w.bytes);
        done[done_pos] = {completion_kind::write_done, w.wr_id, w.bytes};
        if (++done_pos == done_size) done_pos = 0;
      }
      if (last - first == 1) {
        publish(slot, slot_write, writes[first].imm, writes[first].bytes);
      } else {
        std::byte* record = slot + slot_fields;
        for (std::size_t i = first; i < last; ++i, record += sizeof(list_record)) {
          const list_record r{writes[i].imm, 0, writes[i].bytes};
          std::memcpy(record, &r, sizeof r);
        }
        publish(slot, slot_write_list, static_cast<std::uint32_t>(last - first), 0);
      }
      first = last;
    }
    posts_ += static_cast<std::uint32_t>(writes.size());
    finish_list(done_head, writes.size());
    return ok();
  }

  result<void> send(std::span<const std::byte> message, std::uint64_t wr_id) override {
    const std::size_t limit =
        std::min<std::size_t>(options_.limits.max_send_bytes, peer_.slot_payload);
    if (message.size() > limit) {
      return make_error(errc::invalid_argument, "send: {} bytes exceeds the limit of {}",
                        message.size(), limit);
    }
    std::lock_guard lock(mutex_);
    if (!done_has_room()) TESSERA_TRY(reserve_done());
    auto slot = claim_slot();
    if (!slot) return std::move(slot).error();
    if (!message.empty()) {
      std::memcpy(*slot + slot_fields, message.data(), message.size());
    }
    publish(*slot, slot_send, 0, message.size());
    finish_local(completion_kind::send_done, wr_id, message.size());
    return ok();
  }

  std::size_t poll(std::span<completion> out) override {
    std::lock_guard lock(consumer_mutex_);
    return poll_locked(out, false);
  }

  result<std::size_t> wait(std::span<completion> out, std::chrono::microseconds timeout) override {
    if (out.empty()) return make_error(errc::invalid_argument, "wait: empty output span");
    // The consumer lock is held for each poll, not for the whole wait: a poll() or a shorter
    // wait() on another thread must not block behind this one's sleep (poll() never blocks).
    auto take = [&](bool check_liveness) -> result<std::size_t> {
      std::lock_guard lock(consumer_mutex_);
      if (down_delivered_) return down_error(local_.down_reason());
      return poll_locked(out, check_liveness);
    };
    // Completions already there are handed out without reading the clock.
    if (auto n = take(false); !n || *n > 0) return n;
    const auto start = clock::now();
    const auto deadline = start + timeout;
    const auto spin_end = start + std::chrono::microseconds(options_.spin_us);
    inbox_header* h = own_.header();
    for (std::uint32_t i = 0;; ++i) {
      if (auto n = take(false); !n || *n > 0) return n;
      if (!spin_step(i)) continue;
      const auto now = clock::now();
      if (now >= deadline) return take(true);
      if (now < spin_end) continue;
      // Block: announce sleep, re-check (the producer may have published meanwhile), sleep. Only
      // a producer clears `sleeping`, when it rings (wake_if_sleeping): a waiter that cleared it on
      // waking could erase another waiter's announcement, which would then sleep out its slice.
      const std::uint32_t bell = h->doorbell.load(std::memory_order_acquire);
      h->sleeping.store(1, std::memory_order_seq_cst);
      // The producers' half (publish_then_wake) has no fence when fence_free_: this call puts one
      // into every running thread of theirs (and ours), so after it either they see the flag or
      // we see their store. It cannot fail once registered; if it did, a short slice bounds
      // what a missed ring costs.
      const bool ordered = !fence_free_ || membarrier_global();
      if (auto n = take(true); !n || *n > 0) return n;
      const auto slice = std::min<clock::duration>(
          deadline - now, ordered ? clock::duration(std::chrono::milliseconds(10))
                                  : clock::duration(std::chrono::microseconds(50)));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      futex(&h->doorbell, FUTEX_WAIT, bell, &ts);
    }
  }

  bool is_up() const noexcept override { return !local_.is_down(); }

  void close() override {
    if (local_.set_down(make_error(errc::closed, "bulk shm: link closed locally"))) {
      tell_peer_closed();
    }
  }

 private:
  result<buffer_handle> add_registration(std::byte* addr, std::size_t size, int fd) {
    if (addr == nullptr || size == 0) {
      return make_error(errc::invalid_argument, "register_buffer: null or empty range");
    }
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < regs_.size(); ++i) {
      if (regs_[i].used) continue;
      regs_[i] = {addr, size, fd >= 0, true};
      if (fd >= 0) {
        reg_entry& e = own_.table()[i];
        e.fd = fd;
        e.size = size;
        std::uint32_t rkey = 0;
        while (rkey == 0) rkey = static_cast<std::uint32_t>(rng_());
        e.rkey.store(rkey, std::memory_order_release);
      }
      return buffer_handle{static_cast<std::uint32_t>(i + 1)};
    }
    return make_error(errc::no_capacity, "register_buffer: all {} buffer slots of the link in use",
                      regs_.size());
  }

  result<local_registration> lookup_locked(buffer_handle handle) const {
    const local_registration* reg = find_locked(handle);
    if (reg == nullptr) {
      return make_error(errc::invalid_argument, "bulk shm: buffer handle {} is not registered",
                        handle.id);
    }
    return *reg;
  }

  // Registration `handle`, or nullptr when it is not one.
  const local_registration* find_locked(buffer_handle handle) const {
    if (handle.id == 0 || handle.id > regs_.size() || !regs_[handle.id - 1].used) return nullptr;
    return &regs_[handle.id - 1];
  }

  // Why write_with_imm() refused its arguments (the checks in the order it makes them).
  [[gnu::cold, gnu::noinline]] result<void> refuse_write(buffer_handle local,
                                                         std::uint64_t local_offset,
                                                         const remote_buffer& remote,
                                                         std::uint64_t remote_offset,
                                                         std::uint64_t bytes) const {
    auto reg = lookup_locked(local);
    if (!reg) return std::move(reg).error();
    if (bytes > options_.limits.max_write_bytes) {
      return make_error(errc::invalid_argument, "write_with_imm: {} bytes exceeds the limit of {}",
                        bytes, options_.limits.max_write_bytes);
    }
    if (local_offset > reg->size || bytes > reg->size - local_offset) {
      return make_error(errc::invalid_argument,
                        "write_with_imm: source range [{}, +{}) outside local buffer {} of {} bytes",
                        local_offset, bytes, local.id, reg->size);
    }
    TESSERA_ASSERT(remote_offset > remote.size || bytes > remote.size - remote_offset,
                   "refuse_write called for a valid write");
    return make_error(errc::invalid_argument,
                      "write_with_imm: target range [{}, +{}) outside remote buffer {} of {} bytes",
                      remote_offset, bytes, remote.id, remote.size);
  }

  // True when a write from `src` (nullptr: an unknown handle) fits both buffers and the size
  // limit: plain comparisons, no result<> on the post path; refuse_write() says what is wrong.
  bool write_fits(const local_registration* src, std::uint64_t local_offset,
                  const remote_buffer& remote, std::uint64_t remote_offset,
                  std::uint64_t bytes) const {
    return src != nullptr && bytes <= options_.limits.max_write_bytes &&
           local_offset <= src->size && bytes <= src->size - local_offset &&
           remote_offset <= remote.size && bytes <= remote.size - remote_offset;
  }

  // The peer's buffer `remote` names, mapped (cached per registration); nullptr and `why` on a
  // remote access error, which takes the link down, as it does on RDMA.
  std::byte* target_or_fail(const remote_buffer& remote, error& why) {
    if (std::byte* target = mapped_target(remote)) return target;
    auto mapped = map_target(remote);
    if (!mapped) {
      fail(mapped.error());
      why = std::move(mapped).error();
      return nullptr;
    }
    return *mapped;
  }

  // The peer's buffer as mapped by an earlier write, when the peer's table still holds the
  // registration `remote` names and the mapping covers remote.size; nullptr sends the post to
  // map_target(), which maps it or says why it cannot.
  std::byte* mapped_target(const remote_buffer& remote) const {
    if (remote.id == 0 || remote.id > peer_.max_buffers) return nullptr;
    const reg_entry& e = peer_.table()[remote.id - 1];
    const std::uint32_t rkey = e.rkey.load(std::memory_order_acquire);
    const peer_mapping& m = peer_maps_[remote.id - 1];
    if (rkey == 0 || rkey != remote.rkey || m.rkey != rkey || e.size < remote.size ||
        static_cast<std::uint64_t>(e.fd) != remote.addr || remote.size > m.size) {
      return nullptr;
    }
    return m.addr;
  }

  // The peer's registered buffer, mapped into this process (cached per registration).
  result<std::byte*> map_target(const remote_buffer& remote) {
    if (remote.id == 0 || remote.id > peer_.max_buffers) {
      return make_error(errc::protocol, "bulk shm: remote access error: no buffer {}", remote.id);
    }
    const reg_entry& e = peer_.table()[remote.id - 1];
    const std::uint32_t rkey = e.rkey.load(std::memory_order_acquire);
    if (rkey == 0 || rkey != remote.rkey || e.size < remote.size ||
        static_cast<std::uint64_t>(e.fd) != remote.addr) {
      return make_error(errc::protocol,
                        "bulk shm: remote access error: buffer {} rkey {:#x} not registered",
                        remote.id, remote.rkey);
    }
    peer_mapping& m = peer_maps_[remote.id - 1];
    if (m.rkey != rkey) {
      if (m.addr != nullptr) ::munmap(m.addr, m.size);
      m = {};
      auto view = map_path(fmt::format("/proc/{}/fd/{}", peer_pid_, e.fd), remote.size);
      if (!view) return std::move(view).error();
      m = {rkey, view->base, view->size};
    }
    // The table is the peer's to write: a size raised there after we mapped the buffer must not
    // carry our writes past the mapping.
    if (remote.size > m.size) {
      return make_error(errc::protocol,
                        "bulk shm: remote access error: buffer {} is {} bytes, not {}", remote.id,
                        m.size, remote.size);
    }
    return m.addr;
  }

  // The slot the next publish fills: at once while the tail we last read shows room (no shared
  // line read, no clock); every 16th post (the liveness check), a ring that looks full and a link
  // that went down take wait_for_slot().
  result<std::byte*> claim_slot() {
    if ((posts_ & 15) == 15 || published_ - peer_tail_seen_ >= peer_.depth || local_.is_down()) {
      return wait_for_slot();
    }
    ++posts_;
    return peer_.slot(head_pos_);
  }

  // Writing into a dead peer's memory would "succeed"; a post looks at its pidfd once a
  // millisecond. The clock is read on every 16th single post only (read on every post and every
  // poll, it cost 3-11% of 4 KiB throughput, alternated runs), and once per post_writes() list.
  // A poster learns of a dead peer within 16 posts, or at its next empty poll.
  result<void> check_peer_alive() {
    if (const auto now = coarse_now(); now >= next_post_liveness_check_) {
      next_post_liveness_check_ = now + std::chrono::milliseconds(1);
      if (peer_exited()) {
        auto reason = make_error(errc::closed, "bulk shm: peer process {} exited", peer_pid_);
        fail(reason);
        return down_error(reason);
      }
    }
    return ok();
  }

  // Waits (bounded by peer_timeout_ms) for a free slot in the peer's ring.
  result<std::byte*> wait_for_slot() {
    inbox_header* ph = peer_.header();
    if ((++posts_ & 15) == 0) TESSERA_TRY(check_peer_alive());
    const std::uint64_t head = published_;
    // Read only once the ring stays full.
    std::optional<clock::time_point> spin_end;
    std::optional<clock::time_point> deadline;
    for (std::uint32_t i = 0;; ++i) {
      if (local_.is_down()) {
        return down_error(local_.down_reason());
      }
      // The consumer's tail as last read first: while it shows room, the shared line the
      // consumer writes on every poll is not touched (one cache-line transfer per message saved).
      if (head - peer_tail_seen_ < peer_.depth) break;
      peer_tail_seen_ = ph->tail.load(std::memory_order_acquire);
      if (head - peer_tail_seen_ < peer_.depth) break;
      if (!spin_step(i)) continue;
      // Spin as long as wait() does before sleeping blind. A consumer that was asleep takes ~20 us
      // to wake and then drains the ring in a few; a producer that slept 50 us meanwhile let the
      // consumer fall asleep again, and the two could settle into a cycle of one ring and a blind
      // sleep per ~64 messages: once publish() rang only once per sleep, 4 KiB runs had 300-4000
      // such sleeps per nine runs where there had been 16-37, and fell from 24-27 to 10-23 GB/s
      // (with this spin: 8-23 sleeps).
      const auto now = clock::now();
      if (!spin_end) {
        spin_end = now + std::chrono::microseconds(options_.spin_us);
        deadline = now + options_.peer_timeout_ms;
      }
      if (now < *spin_end) continue;
      if (peer_exited() || now >= *deadline) {
        auto reason = peer_exited()
                          ? make_error(errc::closed, "bulk shm: peer process {} exited", peer_pid_)
                          : make_error(errc::timeout, "bulk shm: peer took no message for {} ms",
                                       options_.peer_timeout_ms.count());
        fail(reason);
        return down_error(reason);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return peer_.slot(head_pos_);
  }

  void publish(std::byte* slot, std::uint32_t kind, std::uint32_t imm, std::uint64_t bytes) {
    inbox_header* ph = peer_.header();
    auto* sh = reinterpret_cast<slot_head*>(slot + slot_head_offset);
    sh->kind = kind;
    sh->imm = imm;
    sh->bytes = bytes;
    if (++head_pos_ == peer_.depth) head_pos_ = 0;
    publish_then_wake(*slot_seq(slot), ++published_, ph);
  }

  // Makes the write_done completions of the first `posted` writes of a list visible (their
  // entries in done_ from `head` on are filled), with publish_then_wake()'s handshake.
  void finish_list(std::uint64_t head, std::size_t posted) {
    if (posted > 0) publish_then_wake(done_head_, head + posted, own_.header());
  }

  // An error about write `index` of a post_writes() list.
  static error in_list(std::size_t index, const error& e) {
    return make_error(e.code, "post_writes: write {}: {}", index, e.message);
  }

  // Stores `value` (a slot's sequence number, or done_head_) and then looks at the consumer's
  // sleeping flag: our half of a Dekker handshake with wait(), which stores the flag and then
  // re-reads what we publish; one of the two must see the other. With fences: both sides
  // seq_cst, a full fence in every post. Fence-free (both processes registered for
  // membarrier(GLOBAL_EXPEDITED), fence_free_): a release store and a compiler barrier here, and
  // the sleeper runs membarrier(), which puts a full fence into this thread at that moment
  // wherever it is. The fence waited for the copy's and the slot's stores to land, one cross-core
  // transfer per message; without it they drain while the next message is copied.
  void publish_then_wake(std::atomic<std::uint64_t>& word, std::uint64_t value, inbox_header* h) {
    if (fence_free_) {
      word.store(value, std::memory_order_release);
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      word.store(value, std::memory_order_seq_cst);
    }
    wake_if_sleeping(h);
  }

  // One ring per sleep: whoever sees the flag first clears it and rings. A sleeper here takes
  // ~20 us to get running again, and while the flag stayed set every publish rang once more (35
  // FUTEX_WAKE calls of ~0.6 us each, in a row, seen in one benchmark run). A flag left set by a
  // waiter that found its completions without sleeping costs one needless ring later.
  static void wake_if_sleeping(inbox_header* h) {
    if (h->sleeping.load(std::memory_order_seq_cst) != 0 &&
        h->sleeping.exchange(0, std::memory_order_seq_cst) != 0) {
      ring(h);
    }
  }

  // Wakes every waiter: one flag covers them all, and those that find nothing sleep again.
  static void ring(inbox_header* h) {
    h->doorbell.fetch_add(1, std::memory_order_release);
    futex(&h->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
  }

  // What a call on a link that went down returns.
  static error down_error(const error& reason) {
    return make_error(errc::closed, "bulk link is down: {}", reason.describe());
  }

  // True when the outstanding bound has room by what we last read of done_tail_, and the link is
  // up; else reserve_done() looks again and says why not.
  bool done_has_room(std::size_t count = 1) const {
    return done_head_.load(std::memory_order_relaxed) - done_tail_seen_ + count <= done_.size() &&
           !local_.is_down();
  }

  // Room for one more local completion (the outstanding bound), checked before posting; a post
  // completes before the lock is released, so nothing is ever reserved and then given back.
  result<void> reserve_done(std::size_t count = 1) {
    if (local_.is_down()) {
      return down_error(local_.down_reason());
    }
    const std::uint64_t head = done_head_.load(std::memory_order_relaxed);
    if (head - done_tail_seen_ + count > done_.size()) {
      done_tail_seen_ = done_tail_.load(std::memory_order_acquire);
      if (head - done_tail_seen_ + count > done_.size()) {
        return make_error(errc::overloaded,
                          "bulk link: {} operations outstanding, {} more do not fit (limit {}); "
                          "poll completions first",
                          head - done_tail_seen_, count, done_.size());
      }
    }
    return ok();
  }

  void finish_local(completion_kind kind, std::uint64_t wr_id, std::uint64_t bytes) {
    const std::uint64_t head = done_head_.load(std::memory_order_relaxed);
    done_[head % done_.size()] = {kind, wr_id, bytes};
    // A thread of ours may be asleep in wait() on our own doorbell: the same handshake as
    // publish(). A release store alone may still sit in the store buffer when the flag is read,
    // and a waiter that announced sleep just then, and re-checked done_head_, slept out its 10 ms
    // slice with the completion there.
    publish_then_wake(done_head_, head + 1, own_.header());
  }

  bool peer_exited() const {
    pollfd p{peer_pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  void fail(const error& reason) {
    if (local_.set_down(reason)) tell_peer_closed();
  }

  void tell_peer_closed() {
    inbox_header* ph = peer_.header();
    ph->closed.store(1, std::memory_order_seq_cst);
    ring(ph);
    ring(own_.header());  // wake our own waiters to see the link down
  }

  // Moves received slots, then local completions (and finally link_down) into out.
  std::size_t poll_locked(std::span<completion> out, bool check_liveness) {
    inbox_header* h = own_.header();
    std::size_t n = 0;
    // closed before the slots: the producer's last publishes happen-before its closed store.
    const bool peer_closed = h->closed.load(std::memory_order_acquire) != 0;
    while (n < out.size()) {
      std::byte* slot = own_.slot(tail_pos_);
      // seq_cst, not acquire: wait()'s re-check after announcing sleep is this load, the other
      // half of the Dekker handshake with publish_then_wake() (on x86 both are a plain load).
      if (slot_seq(slot)->load(std::memory_order_seq_cst) != tail_ + 1) break;
      slot_head sh;
      std::memcpy(&sh, slot + slot_head_offset, sizeof sh);
      if (sh.kind == slot_write_list) {
        // Our own geometry says how many records fit; a count beyond it is a broken peer.
        if (sh.imm == 0 || sh.imm > records_per_slot(own_.slot_payload)) {
          fail(make_error(errc::protocol,
                          "bulk shm: the peer published a group of {} writes in a slot that "
                          "holds at most {}",
                          sh.imm, records_per_slot(own_.slot_payload)));
          break;
        }
        const std::byte* records = slot + slot_fields;
        for (; taken_in_slot_ < sh.imm && n < out.size(); ++taken_in_slot_) {
          list_record r;
          std::memcpy(&r, records + taken_in_slot_ * sizeof r, sizeof r);
          received_write(out[n++], r.imm, r.bytes);
        }
        if (taken_in_slot_ < sh.imm) break;  // `out` is full: the rest of the group next time
        taken_in_slot_ = 0;
      } else if (sh.kind == slot_send && sh.bytes <= own_.slot_payload) {
        completion& c = out[n++];
        received_write(c, 0, sh.bytes);
        c.kind = completion_kind::send_received;
        c.data.assign(slot + slot_fields, slot + slot_fields + sh.bytes);
      } else {
        received_write(out[n++], sh.imm, sh.bytes);
      }
      ++tail_;
      if (++tail_pos_ == own_.depth) tail_pos_ = 0;
    }
    if (n > 0) {
      h->tail.store(tail_, std::memory_order_release);
      return n + take_local(out.subspan(n));
    }
    if (peer_closed && !local_.is_down()) {
      local_.set_down(make_error(errc::closed, "bulk shm: peer closed the link"));
    }
    // A poll that hands out our own completions reads no clock: its caller is busy posting, and
    // its posts look at the peer (claim_slot). Only a poll that finds nothing at all does.
    if (const std::size_t mine = take_local(out); mine > 0 || local_.is_down()) return mine;
    if (const auto now = coarse_now(); check_liveness || now >= next_liveness_check_) {
      next_liveness_check_ = now + std::chrono::milliseconds(1);
      if (peer_exited()) {
        local_.set_down(make_error(errc::closed, "bulk shm: peer process {} exited", peer_pid_));
        return take_local(out);
      }
    }
    return 0;
  }

  // A write_received completion, filled field by field, not `c = completion{}`: that zeroed 104
  // bytes and gave back the vector's memory on every message.
  static void received_write(completion& c, std::uint32_t imm, std::uint64_t bytes) {
    c.kind = completion_kind::write_received;
    c.wr_id = 0;
    c.bytes = bytes;
    c.imm = imm;
    c.failure.reset();
    c.data.clear();
  }

  // Local completions, then (once they are all out) link_down from local_.
  std::size_t take_local(std::span<completion> out) {
    std::size_t n = 0;
    std::uint64_t tail = done_tail_.load(std::memory_order_relaxed);
    // seq_cst: wait()'s re-check after announcing sleep is this load (publish_then_wake()).
    const std::uint64_t head = done_head_.load(std::memory_order_seq_cst);
    for (; n < out.size() && tail != head; ++n, ++tail) {
      const local_done& d = done_[tail % done_.size()];
      completion& c = out[n];
      c.kind = d.kind;
      c.wr_id = d.wr_id;
      c.imm = 0;
      c.bytes = d.bytes;
      c.data.clear();
      c.failure.reset();
    }
    if (n > 0) done_tail_.store(tail, std::memory_order_release);
    if (n == out.size()) return n;  // else all of done_ is out: link_down may follow
    const std::size_t got = local_.poll(out.subspan(n));
    for (std::size_t i = n; i < n + got; ++i) {
      if (out[i].kind == completion_kind::link_down) down_delivered_ = true;
    }
    return n + got;
  }

  inbox_view own_;
  int own_fd_;
  inbox_view peer_;
  int peer_pidfd_;
  std::int32_t peer_pid_;
  const link_options options_;
  // Posts publish without a fence and a sleeper runs membarrier() (publish_then_wake()): both
  // inboxes announced it at set-up (each process registered for global expedited membarrier).
  const bool fence_free_;
  completion_queue local_;  // the link-down rule (local completions are in done_)
  // Registrations and the post path: one producer into the peer's ring and into done_.
  // Both locks are biased towards the thread that first takes them (biased_lock.hpp): a link
  // posted on by one thread and polled by one takes no atomic read-modify-write per message.
  mutable biased_lock mutex_;
  // Completed local operations, a single-producer (posts, under mutex_) single-consumer (polls,
  // under consumer_mutex_) ring whose occupancy is the outstanding count: no lock of its own.
  struct local_done {
    completion_kind kind;
    std::uint64_t wr_id;
    std::uint64_t bytes;
  };
  std::vector<local_done> done_;
  // post_writes(): each write's target and source address, found while the list is checked
  // (max_outstanding entries, allocated once); guarded by mutex_.
  struct list_copy {
    std::byte* to;
    const std::byte* from;
  };
  std::vector<list_copy> list_copies_;
  alignas(64) std::atomic<std::uint64_t> done_head_{0};
  alignas(64) std::atomic<std::uint64_t> done_tail_{0};
  std::uint64_t done_tail_seen_ = 0;  // guarded by mutex_
  std::vector<local_registration> regs_;
  std::mt19937_64 rng_{random_u64()};
  std::chrono::nanoseconds next_post_liveness_check_{};  // coarse_now(); guarded by mutex_
  std::uint32_t posts_ = 0;                              // guarded by mutex_
  std::uint64_t peer_tail_seen_ = 0;                     // guarded by mutex_
  std::uint64_t published_ = 0;  // slots published into the peer's ring; guarded by mutex_
  std::uint32_t head_pos_ = 0;   // published_ % depth; guarded by mutex_
  std::vector<peer_mapping> peer_maps_;
  biased_lock consumer_mutex_;  // held for one poll_locked(), never across a sleep
  std::uint64_t tail_ = 0;    // slots taken from our ring; guarded by consumer_mutex_
  std::uint32_t tail_pos_ = 0;                      // tail_ % depth; guarded by consumer_mutex_
  // Writes of the slot at tail_ (a slot_write_list group) already handed out, when a poll's
  // `out` filled in the middle of the group; guarded by consumer_mutex_.
  std::uint32_t taken_in_slot_ = 0;
  std::chrono::nanoseconds next_liveness_check_{};  // coarse_now()
  bool down_delivered_ = false;
};

}  // namespace

std::unique_ptr<link> make_link(inbox_view own, int own_fd, inbox_view peer, int peer_pidfd,
                                std::int32_t peer_pid, const link_options& options,
                                bool fence_free) {
  return std::make_unique<shm_link>(own, own_fd, peer, peer_pidfd, peer_pid, options, fence_free);
}

}  // namespace tessera::transport::bulk::detail::shm
