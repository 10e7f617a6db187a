// Collectives for distributed inference over the bulk plane: all-reduce (sum), all-gather and
// pipeline send/recv of float32 vectors between the ranks of a serving group.
//
// A group is an ordered list of ranks 0..n-1 (n in 1..8) with one connected bulk::link between
// every pair. Every rank builds its own `group` from its n-1 links (links[rank] is null) and calls
// the same collectives in the same order with the same sizes; the group exchanges buffer
// descriptors over the links themselves, so nothing else is needed to set it up.
//
// Determinism: every rank holds bit-identical results. The mesh all-reduce sums in rank order
// 0..n-1 on every rank (equal to a sequential left fold x0 + x1 + ... + x(n-1)); the ring sums each
// chunk c in the fixed order c, c+1, ..., c+n-1 (mod n) on one rank and broadcasts those bits.
//
// Epochs: every message carries the plan epoch (low 8 bits) and the operation's sequence number in
// its immediate (hand-shake, acknowledgement and abort messages: full 32-bit epoch in a header).
// Traffic from an older epoch is dropped and counted (stats().stale_dropped), never applied;
// traffic from a newer epoch waits until this rank moves there with set_epoch().
//
// Failure: a link that goes down, a peer's abort, a timeout or a protocol violation fails the call
// with an error naming the rank, tells the other peers (abort), and leaves the group failed: later
// calls return the same error until set_epoch() re-plans over live links. Never a hang: every wait
// is bounded by group_options::timeout_ms, and a dead peer is noticed as soon as its link reports
// it (shm: pidfd, tcp: EOF/RST), by every rank, not only its neighbours.
//
// Threading: one thread uses a group at a time; while a group exists it is the only consumer of
// its links' completions (at most one group per link).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "actors/base/result.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::inference::collectives {

/// Largest group.
inline constexpr std::uint32_t max_group_size = 8;

/// Vectors of at least this many floats go by ring, smaller ones by direct mesh (measured on this
/// machine: bench/RESULTS.md, "Collectives").
inline constexpr std::size_t default_ring_threshold_floats = 128 * 1024;

struct group_options {
  /// Plan epoch; every rank of a group uses the same one. Must be > 0.
  std::uint32_t epoch = 1;
  /// Bound of one operation in floats; the receive buffers are sized from it (about
  /// 20 * max_floats bytes per peer). Larger all-reduces and sends are chunked; an all-gather
  /// slice larger than this is refused.
  std::size_t max_floats = 256 * 1024;
  /// all_reduce(algorithm::automatic) uses the ring from this many floats on.
  std::size_t ring_threshold_floats = default_ring_threshold_floats;
  /// Bound of every wait of one call (and of the hand-shake).
  std::chrono::milliseconds timeout_ms{10'000};
};

enum class algorithm : std::uint8_t { automatic, mesh, ring };

struct group_stats {
  std::uint64_t operations = 0;     ///< collective steps completed (chunks count separately)
  std::uint64_t stale_dropped = 0;  ///< messages from an older epoch or sequence, dropped
  std::uint64_t aborts_sent = 0;    ///< failures this rank announced to its peers
};

class group {
 public:
  /// Builds this rank's side of a group and hand-shakes with every peer (exchanging receive
  /// buffer descriptors, checking size, rank and bounds agree). links.size() is the group size;
  /// links[rank] must be null and every other entry a connected link that outlives the group.
  /// errc::invalid_argument for bad arguments, errc::protocol when peers disagree, errc::timeout
  /// or errc::closed when a peer does not answer.
  [[nodiscard]] static result<std::unique_ptr<group>> create(std::uint32_t rank,
                                                             std::vector<transport::bulk::link*> links,
                                                             const group_options& options);
  ~group();
  group(const group&) = delete;
  group& operator=(const group&) = delete;

  [[nodiscard]] std::uint32_t rank() const noexcept;
  [[nodiscard]] std::uint32_t size() const noexcept;
  [[nodiscard]] std::uint32_t epoch() const noexcept;
  [[nodiscard]] group_stats stats() const noexcept;
  /// Changes group_options::timeout_ms for later calls.
  void set_timeout(std::chrono::milliseconds timeout) noexcept;

  /// In-place sum over all ranks; every rank passes a vector of the same length and ends with the
  /// same bits. Vectors longer than max_floats go in pieces of max_floats.
  [[nodiscard]] result<void> all_reduce(std::span<float> data, algorithm algo = algorithm::automatic);

  /// In-place sum over `members` only (sorted rank ids, this rank among them): the tensor-parallel
  /// ranks of one pipeline stage. Direct mesh, summed in members order, so the members end with
  /// the same bits. A rank reduces with one fixed team: once it called this, another team or a
  /// full-group all_reduce / all_gather is refused with errc::invalid_argument (teams count their
  /// operations apart); send / recv keep working with every rank, and an abort from any rank of
  /// the epoch fails the team's next wait.
  [[nodiscard]] result<void> all_reduce_among(std::span<float> data,
                                              std::span<const std::uint32_t> members);

  /// Concatenates every rank's slice in rank order into `out`. counts[r] is rank r's slice length
  /// (uneven allowed; same list on every rank), mine.size() == counts[rank()],
  /// out.size() == sum(counts); a slice above max_floats is refused.
  [[nodiscard]] result<void> all_gather(std::span<const float> mine,
                                        std::span<const std::size_t> counts, std::span<float> out);

  /// Pipeline parallelism: sends a tensor to rank `to` with a caller tag. Returns once the bytes
  /// left this rank; the next send to the same rank waits until the receiver took this one.
  [[nodiscard]] result<void> send(std::uint32_t to, std::uint64_t tag, std::span<const float> data);
  /// Receives the next tensor from rank `from`; errc::protocol when its tag or length differs from
  /// what the caller expects (the tensor is consumed).
  [[nodiscard]] result<void> recv(std::uint32_t from, std::uint64_t tag, std::span<float> out);

  /// Any thread: fails the wait in progress (within one wait slice, 2 ms) and every later call
  /// with errc::cancelled naming `reason`, telling the peers as any failure does. For a caller
  /// that learns otherwise that a peer is gone (the cluster dropped it from its view) while this
  /// rank waits on it: a paused or cut-off peer's link reports nothing, and the wait would last
  /// the whole timeout. Not cleared by set_epoch().
  void abort(std::string reason);

  /// Moves every rank to a new plan epoch (> the current one): a hand-shake with every peer after
  /// which older traffic is stale. Clears a failure left by an earlier call.
  [[nodiscard]] result<void> set_epoch(std::uint32_t epoch);

  class impl;

 private:
  explicit group(std::unique_ptr<impl> impl);
  std::unique_ptr<impl> impl_;
};

}  // namespace tessera::inference::collectives
