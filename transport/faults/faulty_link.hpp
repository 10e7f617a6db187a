// faulty_link: a bulk::link decorator that applies a fault_policy to what this end sends.
//
// Every write_with_imm() and send() asks the policy for the fate of one message from `local` to
// `remote`:
//   * delivered now      -> passed straight to the inner link (no extra cost but the decision);
//   * delayed/reordered  -> held in a due-time queue and posted by a timer thread when due (a
//                           send's bytes are copied at post; a write reads its source when it is
//                           finally posted, so, as on RDMA, the source must stay untouched until
//                           write_done);
//   * duplicated         -> posted twice; the caller still sees one local completion;
//   * dropped/partitioned-> vanishes: the caller gets a successful local completion, the peer
//                           nothing (a lost message; with partition_mode::fail the operation
//                           completes with errc::closed instead, as a cut cable under RDMA would
//                           report it, but the link stays up so heal() restores traffic).
// Decorate both ends to fault both directions. Received traffic passes through unchanged.
// The caller's wr_ids are kept; bounds are the inner link's (max_outstanding also bounds the
// due-time queue). When the inner link goes down, held operations complete with an error before
// link_down is delivered.
//
// Free while no fault is in force (every `tessera node` wraps its split groups' links, faults or
// not): while the injector holds no partition and no rule and nothing is held here, operations go
// straight to the inner link with the caller's wr_id — a post_writes() list as one post — and draw
// nothing from the policy's random streams; the decorator's own operations carry wr_ids with the
// top bit set (kInternalId), so their completions are told from the passed-through ones. The timer
// thread starts with the first held operation: a link that never sees a delay has none.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/bulk/link.hpp"
#include "transport/faults/fault_policy.hpp"

namespace tessera::transport::faults {

enum class partition_mode : std::uint8_t { vanish, fail };

class faulty_link final : public bulk::link {
 public:
  faulty_link(std::unique_ptr<bulk::link> inner, std::shared_ptr<fault_injector> faults,
              std::string local, std::string remote, partition_mode mode = partition_mode::vanish);
  ~faulty_link() override;

  bulk::backend_kind kind() const noexcept override { return inner_->kind(); }
  const bulk::link_limits& limits() const noexcept override { return inner_->limits(); }
  result<bulk::buffer_handle> register_buffer(void* addr, std::size_t size) override;
  result<bulk::buffer_handle> register_buffer(const bulk::shared_buffer& buffer) override;
  result<void> deregister_buffer(bulk::buffer_handle handle) override;
  result<bulk::remote_buffer> describe(bulk::buffer_handle handle) const override {
    return inner_->describe(handle);
  }

  result<void> write_with_imm(bulk::buffer_handle local, std::uint64_t local_offset,
                              const bulk::remote_buffer& remote, std::uint64_t remote_offset,
                              std::uint64_t bytes, std::uint32_t imm, std::uint64_t wr_id) override;
  /// Each write of the list gets its own fate, as single writes do, and is posted to the inner
  /// link on its own (a fault-injected link is for tests, not speed). All or nothing as the
  /// interface says: the list is checked against the registrations made through this decorator
  /// and the outstanding bound before any write is submitted.
  result<void> post_writes(std::span<const bulk::write_request> writes) override;
  result<void> send(std::span<const std::byte> message, std::uint64_t wr_id) override;

  std::size_t poll(std::span<bulk::completion> out) override;
  result<std::size_t> wait(std::span<bulk::completion> out,
                           std::chrono::microseconds timeout) override;

  bool is_up() const noexcept override { return inner_->is_up(); }
  void close() override { inner_->close(); }

  /// Operations held for later delivery right now (for tests and `tessera status`).
  [[nodiscard]] std::size_t held() const;
  /// True while the timer thread runs (it starts with the first held operation).
  [[nodiscard]] bool has_timer_thread() const;

  /// The decorator's own wr_ids (what it posts to the inner link while faults are in force) have
  /// this bit set; callers' wr_ids must not (the project's callers use 32-bit immediates).
  static constexpr std::uint64_t kInternalId = 1ull << 63;

 private:
  struct op {
    bool is_write = false;
    bulk::buffer_handle local{};
    std::uint64_t local_offset = 0;
    bulk::remote_buffer remote{};
    std::uint64_t remote_offset = 0;
    std::uint64_t bytes = 0;
    std::uint32_t imm = 0;
    std::vector<std::byte> message;
  };
  struct held_op {
    std::chrono::steady_clock::time_point due;
    std::uint64_t seq;  // keeps equal due times in post order
    std::uint64_t internal_id;
    std::shared_ptr<const op> what;
  };
  struct pending {
    std::uint64_t user_wr_id;
    bulk::completion_kind kind;
    std::uint32_t copies_left;  // inner completions still to come
    bool reported = false;      // the user's completion has been queued
  };

  static op write_op(const bulk::write_request& w);
  // `reserved`: the caller already counted the operation in outstanding_ (post_writes).
  result<void> submit(op o, std::uint64_t wr_id, bool reserved = false);
  // No link fault in force and nothing held: operations may pass straight through.
  [[nodiscard]] bool quiet() const;
  result<void> post_inner(const op& o, std::uint64_t internal_id);
  void timer_loop();
  // Turns inner completions into user completions (in place), returns how many remain.
  std::size_t translate(std::span<bulk::completion> got);
  void synthesize(std::uint64_t internal_id, std::optional<error> failure);
  std::size_t take_synthesized(std::span<bulk::completion> out);
  void fail_held(const error& reason);

  std::unique_ptr<bulk::link> inner_;
  std::shared_ptr<fault_injector> faults_;
  const std::string local_;
  const std::string remote_;
  const partition_mode mode_;

  mutable std::mutex mutex_;
  std::condition_variable timer_cv_;
  std::vector<held_op> heap_;  // min-heap on (due, seq)
  std::map<std::uint64_t, pending> pending_;  // internal id -> the user's operation
  std::deque<bulk::completion> synthesized_;
  std::optional<bulk::completion> down_;  // inner link_down, delivered after synthesized ones
  bool down_delivered_ = false;
  std::uint64_t next_id_ = 1;
  std::uint64_t next_seq_ = 0;
  std::uint32_t outstanding_ = 0;
  // Sizes of the live registrations (by handle id), so post_writes() can check a whole list
  // before it submits any of it; guarded by mutex_.
  std::map<std::uint32_t, std::uint64_t> registered_;
  bool stopping_ = false;
  std::thread timer_;
};

}  // namespace tessera::transport::faults
