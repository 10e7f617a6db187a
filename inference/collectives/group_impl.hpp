// The collectives' inside: the wire format (immediates, the send() header) and `group::impl`,
// the state of one rank's group with its progress engine (completions filed per peer, waits,
// aborts) and hand-shake. The operations (all-reduce, all-gather, pipeline send/recv) are in
// group_ops.cpp, the public API in group.cpp. Internal to inference/collectives.
#pragma once

#include "inference/collectives/group.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

namespace tessera::inference::collectives {

namespace bulk = transport::bulk;
using steady = std::chrono::steady_clock;

namespace group_detail {

enum class kind : std::uint8_t { mesh = 1, ring_reduce = 2, ring_gather = 3, gather = 4, p2p = 5 };

inline constexpr std::uint32_t magic = 0x4c4f4354;  // "TCOL"
enum class msg_type : std::uint32_t { hello = 1, ack = 2, abort = 3 };

// The header of every send(): plain data, memcpy'd (both ends are this code on one architecture
// family; the magic catches anything else).
struct wire_msg {
  std::uint32_t magic_ = magic;
  std::uint32_t type = 0;
  std::uint32_t epoch = 0;
  std::uint32_t seq = 0;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::uint64_t max_floats = 0;
  std::uint32_t buf_id = 0;
  std::uint32_t buf_rkey = 0;
  std::uint64_t buf_addr = 0;
  std::uint64_t buf_size = 0;
  std::uint32_t reserved = 0;
  char reason[100] = {};  // abort: the failure, truncated, NUL-terminated
};

struct p2p_header {
  std::uint64_t tag = 0;
  std::uint64_t total = 0;   // floats in the whole tensor
  std::uint64_t offset = 0;  // first float of this chunk
  std::uint64_t count = 0;   // floats in this chunk
};

inline std::uint32_t make_imm(std::uint32_t epoch, kind k, std::uint32_t step, std::uint32_t seq) {
  return ((epoch & 0xffu) << 24) | ((static_cast<std::uint32_t>(k) & 0xfu) << 20) |
         ((step & 0xfu) << 16) | (seq & 0xffffu);
}
inline std::uint32_t imm_epoch(std::uint32_t imm) { return imm >> 24; }
inline kind imm_kind(std::uint32_t imm) { return static_cast<kind>((imm >> 20) & 0xfu); }
inline std::uint32_t imm_seq(std::uint32_t imm) { return imm & 0xffffu; }

// Serial-number comparison: negative when a is older than b.
inline int epoch8_cmp(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::int8_t>(static_cast<std::uint8_t>(a - b));
}
inline int seq16_cmp(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::int16_t>(static_cast<std::uint16_t>(a - b));
}

inline std::optional<wire_msg> parse_msg(const std::vector<std::byte>& data) {
  if (data.size() != sizeof(wire_msg)) return std::nullopt;
  wire_msg m;
  std::memcpy(&m, data.data(), sizeof m);
  if (m.magic_ != magic) return std::nullopt;
  return m;
}

inline std::vector<std::byte> to_bytes(const wire_msg& m) {
  std::vector<std::byte> out(sizeof m);
  std::memcpy(out.data(), &m, sizeof m);
  return out;
}

// Bound of received-but-unconsumed messages kept per peer (early arrivals, newer epochs).
inline constexpr std::size_t max_pending = 256;
// How long one blocking wait on a link lasts before the other links are looked at again (so an
// abort or a link_down elsewhere is seen promptly).
inline constexpr std::chrono::microseconds wait_slice{2000};

}  // namespace group_detail
using namespace group_detail;

class group::impl {
 public:
  struct peer {
    bulk::link* link = nullptr;
    bulk::shared_buffer recv;
    bulk::buffer_handle recv_h;
    bulk::buffer_handle work_h;
    bulk::remote_buffer remote;  // our receive buffer at the peer
    std::deque<bulk::completion> pending;
    std::uint32_t outstanding = 0;
    bool down = false;
    std::optional<error> down_cause;
    std::uint32_t p2p_send_seq = 0;
    std::uint32_t p2p_recv_seq = 0;
    bool p2p_unacked = false;
  };

  std::uint32_t rank_ = 0;
  std::uint32_t n_ = 1;
  group_options options_;
  std::uint32_t epoch_ = 0;
  std::uint32_t seq_ = 0;  // collective operation sequence within the epoch
  std::vector<peer> peers_;
  bulk::shared_buffer work_;
  std::size_t region_bytes_ = 0;
  std::optional<error> failed_;
  // Set by group::abort() from any thread; pump() looks at it before every wait slice.
  std::atomic<bool> external_abort_{false};
  mutable std::mutex external_mu_;
  std::string external_reason_;  // under external_mu_
  group_stats stats_;
  std::vector<std::uint32_t> all_ranks_;  // 0..n-1
  std::vector<std::uint32_t> team_;       // set by the first all_reduce_among: its members

  ~impl() {
    for (auto& p : peers_) {
      if (p.link == nullptr) continue;
      if (p.recv_h.id != 0) (void)p.link->deregister_buffer(p.recv_h);
      if (p.work_h.id != 0) (void)p.link->deregister_buffer(p.work_h);
    }
  }

  float* work_floats() const { return reinterpret_cast<float*>(work_.data()); }
  const float* region(std::uint32_t from, std::uint32_t seq) const {
    return reinterpret_cast<const float*>(peers_[from].recv.data() + (seq % 2) * region_bytes_);
  }
  std::uint64_t region_offset(std::uint32_t seq) const { return (seq % 2) * region_bytes_; }
  std::uint64_t p2p_offset() const { return 2 * region_bytes_; }

  // --- progress ---------------------------------------------------------------------------------

  // Files one completion from peer q. Stale traffic is dropped here. A link that goes down is
  // only marked: it is an error for the operations that still need that peer (await, drain); the
  // others learn through the abort of the rank that needed it.
  result<void> file(std::uint32_t q, bulk::completion&& c) {
    peer& p = peers_[q];
    switch (c.kind) {
      case bulk::completion_kind::write_done:
      case bulk::completion_kind::send_done:
        if (p.outstanding > 0) --p.outstanding;
        if (!c.ok()) mark_down(q, *c.failure);
        return ok();
      case bulk::completion_kind::link_down:
        mark_down(q, c.failure ? *c.failure : make_error(errc::closed, "closed"));
        return ok();
      case bulk::completion_kind::write_received:
        if (epoch8_cmp(imm_epoch(c.imm), epoch_) < 0 ||
            (epoch8_cmp(imm_epoch(c.imm), epoch_) == 0 && imm_kind(c.imm) != kind::p2p &&
             seq16_cmp(imm_seq(c.imm), seq_) < 0)) {
          ++stats_.stale_dropped;
          return ok();
        }
        break;
      case bulk::completion_kind::send_received: {
        auto m = parse_msg(c.data);
        if (!m) {
          return make_error(errc::protocol, "collectives: rank {} sent a malformed message ({} bytes)",
                            q, c.data.size());
        }
        if (m->epoch < epoch_) {
          ++stats_.stale_dropped;
          return ok();
        }
        if (auto e = abort_error(q, *m)) return *e;
        break;
      }
    }
    if (p.pending.size() >= max_pending) {
      return make_error(errc::protocol, "collectives: more than {} unconsumed messages from rank {}",
                        max_pending, q);
    }
    p.pending.push_back(std::move(c));
    return ok();
  }

  // An abort from rank q applies to its operation and every later one (a peer may abort an
  // operation this rank has not reached yet; the current one still completes).
  std::optional<error> abort_error(std::uint32_t q, const wire_msg& m) const {
    // In team mode the sender's operation count is its own team's: any abort of the epoch counts.
    if (static_cast<msg_type>(m.type) != msg_type::abort || m.epoch != epoch_ ||
        (team_.empty() && seq16_cmp(m.seq, seq_) > 0)) {
      return std::nullopt;
    }
    std::string reason(m.reason, strnlen(m.reason, sizeof m.reason));
    return make_error(errc::cancelled, "collectives: rank {} aborted operation {} of epoch {}: {}",
                      q, m.seq, m.epoch, reason);
  }

  result<void> check_aborts() const {
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      for (const auto& c : peers_[q].pending) {
        if (c.kind != bulk::completion_kind::send_received) continue;
        if (auto m = parse_msg(c.data)) {
          if (auto e = abort_error(q, *m)) return *e;
        }
      }
    }
    return ok();
  }

  result<void> check_external_abort() const {
    if (!external_abort_.load(std::memory_order_acquire)) return ok();
    std::lock_guard lock(external_mu_);
    return make_error(errc::cancelled, "collectives: rank {} aborted: {}", rank_, external_reason_);
  }

  // Polls every link without blocking, then blocks up to `slice` on `focus` (a rank != rank_).
  // Every completion taken from a link is filed (counts stay right) before an error is returned.
  result<void> pump(std::uint32_t focus, std::chrono::microseconds slice) {
    TESSERA_TRY(check_external_abort());
    bulk::completion c[16];
    std::optional<error> first;
    auto file_all = [&](std::uint32_t q, std::size_t got) {
      for (std::size_t i = 0; i < got; ++i) {
        auto r = file(q, std::move(c[i]));
        if (!r && !first) first = std::move(r).error();
      }
    };
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (q == rank_ || q == focus || peers_[q].down) continue;
      file_all(q, peers_[q].link->poll(c));
    }
    if (first) return *first;
    TESSERA_TRY(check_link(focus));
    auto got = peers_[focus].link->wait(c, slice);
    if (!got) {
      mark_down(focus, got.error());
      return check_link(focus);
    }
    file_all(focus, *got);
    if (first) return *first;
    return ok();
  }

  void mark_down(std::uint32_t q, const error& cause) {
    if (!peers_[q].down) peers_[q].down_cause = cause;
    peers_[q].down = true;
  }

  result<void> check_link(std::uint32_t q) const {
    if (!peers_[q].down) return ok();
    return make_error(errc::closed, "collectives: link to rank {} is down ({})", q,
                      peers_[q].down_cause ? peers_[q].down_cause->describe() : std::string("closed"));
  }

  // Waits for the received message from `from` that `match` accepts.
  // With drop_before, everything from `from` that arrived before the match is dropped as stale
  // (the hand-shake: a peer sends its hello before any traffic of the new epoch, so whatever came
  // earlier is older, whatever its 8-bit epoch tag says).
  template <class Match>
  result<bulk::completion> await(std::uint32_t from, steady::time_point deadline, Match&& match,
                                 const char* what, bool drop_before = false) {
    for (;;) {
      auto& pend = peers_[from].pending;
      for (auto it = pend.begin(); it != pend.end(); ++it) {
        if (match(*it)) {
          bulk::completion c = std::move(*it);
          if (drop_before) {
            stats_.stale_dropped += static_cast<std::uint64_t>(it - pend.begin());
            pend.erase(pend.begin(), it + 1);
          } else {
            pend.erase(it);
          }
          return c;
        }
      }
      TESSERA_TRY(check_link(from));
      TESSERA_TRY(check_aborts());
      const auto now = steady::now();
      if (now >= deadline) {
        return make_error(errc::timeout,
                          "collectives: rank {} waited {} ms for {} from rank {} (epoch {}, op {})",
                          rank_, options_.timeout_ms.count(), what, from, epoch_, seq_);
      }
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      TESSERA_TRY(pump(from, std::min(left, wait_slice)));
    }
  }

  result<bulk::completion> await_write(std::uint32_t from, std::uint32_t imm, std::uint64_t bytes,
                                       steady::time_point deadline, const char* what) {
    auto c = await(
        from, deadline,
        [imm](const bulk::completion& x) {
          return x.kind == bulk::completion_kind::write_received && x.imm == imm;
        },
        what);
    if (!c) return c;
    if (c->bytes != bytes) {
      return make_error(errc::protocol,
                        "collectives: rank {} sent {} bytes for {}, rank {} expected {} (do all "
                        "ranks pass the same sizes?)",
                        from, c->bytes, what, rank_, bytes);
    }
    return c;
  }

  // Waits until every posted write/send has completed locally (the work buffer may be reused).
  result<void> drain(steady::time_point deadline) {
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      while (peers_[q].outstanding > 0) {
        TESSERA_TRY(check_link(q));
        const auto now = steady::now();
        if (now >= deadline) {
          return make_error(errc::timeout, "collectives: writes to rank {} not completed in {} ms",
                            q, options_.timeout_ms.count());
        }
        TESSERA_TRY(pump(q, std::min(std::chrono::duration_cast<std::chrono::microseconds>(
                                         deadline - now),
                                     wait_slice)));
      }
    }
    return ok();
  }

  // A refused post: when the link went down with it (closed, or a remote access error because
  // the peer left and deregistered its buffers) it is errc::closed like any other dead peer.
  error refused(std::uint32_t to, const error& e, const char* what) {
    if (e.code == errc::closed || !peers_[to].link->is_up()) {
      mark_down(to, e);
      return make_error(errc::closed, "collectives: {} to rank {} failed, the link is down: {}",
                        what, to, e.describe());
    }
    return make_error(e.code, "collectives: {} to rank {} refused: {}", what, to, e.describe());
  }

  result<void> write(std::uint32_t to, std::uint64_t work_offset, std::uint64_t remote_offset,
                     std::uint64_t bytes, std::uint32_t imm) {
    peer& p = peers_[to];
    auto r = p.link->write_with_imm(p.work_h, work_offset, p.remote, remote_offset, bytes, imm, imm);
    if (!r) return refused(to, r.error(), "write");
    ++p.outstanding;
    return ok();
  }

  result<void> send_msg(std::uint32_t to, const wire_msg& m) {
    peer& p = peers_[to];
    auto r = p.link->send(to_bytes(m), 0);
    if (!r) return refused(to, r.error(), "message");
    ++p.outstanding;
    return ok();
  }

  // Records a failure, tells the live peers (best effort) and returns the error.
  error fail(error e) {
    wire_msg m;
    m.type = static_cast<std::uint32_t>(msg_type::abort);
    m.epoch = epoch_;
    m.rank = rank_;
    m.size = n_;
    m.seq = seq_;
    const std::size_t len = std::min(e.message.size(), sizeof m.reason - 1);
    std::memcpy(m.reason, e.message.data(), len);
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (q == rank_ || peers_[q].down) continue;
      if (peers_[q].link->send(to_bytes(m), 0)) {
        ++peers_[q].outstanding;
        ++stats_.aborts_sent;
      }
    }
    failed_ = e;
    return e;
  }

  result<void> usable() const {
    if (failed_) {
      return make_error(failed_->code, "collectives: group failed earlier ({}); set_epoch() re-plans",
                        failed_->message);
    }
    return ok();
  }

  // --- hand-shake -------------------------------------------------------------------------------

  result<void> handshake(std::uint32_t epoch) {
    const auto deadline = steady::now() + options_.timeout_ms;
    epoch_ = epoch;
    seq_ = 0;
    team_.clear();  // every rank starts the epoch at operation 0: teams may change
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      peer& p = peers_[q];
      p.p2p_send_seq = p.p2p_recv_seq = 0;
      p.p2p_unacked = false;
      // Traffic of older epochs that is still queued is stale now.
      std::erase_if(p.pending, [&](const bulk::completion& c) {
        bool stale = false;
        if (c.kind == bulk::completion_kind::write_received) {
          stale = epoch8_cmp(imm_epoch(c.imm), epoch_) < 0;
        } else if (auto m = parse_msg(c.data)) {
          stale = m->epoch < epoch_;
        }
        if (stale) ++stats_.stale_dropped;
        return stale;
      });
      auto desc = p.link->describe(p.recv_h);
      if (!desc) return desc.error();
      wire_msg m;
      m.type = static_cast<std::uint32_t>(msg_type::hello);
      m.epoch = epoch_;
      m.rank = rank_;
      m.size = n_;
      m.max_floats = options_.max_floats;
      m.buf_id = desc->id;
      m.buf_rkey = desc->rkey;
      m.buf_addr = desc->addr;
      m.buf_size = desc->size;
      TESSERA_TRY(send_msg(q, m));
    }
    for (std::uint32_t q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      auto c = await(
          q, deadline,
          [this](const bulk::completion& x) {
            if (x.kind != bulk::completion_kind::send_received) return false;
            auto m = parse_msg(x.data);
            return m && m->type == static_cast<std::uint32_t>(msg_type::hello) && m->epoch == epoch_;
          },
          "the hand-shake", /*drop_before=*/true);
      if (!c) return c.error();
      auto m = *parse_msg(c->data);
      if (m.rank != q || m.size != n_ || m.max_floats != options_.max_floats) {
        return make_error(errc::protocol,
                          "collectives: rank {} disagrees on the group: it says rank {} of {} with "
                          "max_floats {}, we expect rank {} of {} with max_floats {}",
                          q, m.rank, m.size, m.max_floats, q, n_, options_.max_floats);
      }
      peers_[q].remote = bulk::remote_buffer{m.buf_id, m.buf_addr, m.buf_rkey, m.buf_size};
      if (m.buf_size < peers_[q].recv.size()) {
        return make_error(errc::protocol, "collectives: rank {} offers a {} byte buffer, need {}", q,
                          m.buf_size, peers_[q].recv.size());
      }
    }
    TESSERA_TRY(drain(deadline));
    failed_.reset();
    return ok();
  }

  // --- operations -------------------------------------------------------------------------------
  // (defined in group_ops.cpp)
  result<void> mesh_all_reduce(std::span<float> data, steady::time_point deadline,
                               std::span<const std::uint32_t> members);
  result<void> no_team(const char* what) const;
  result<void> all_reduce_among(std::span<float> data, std::span<const std::uint32_t> members);
  static std::size_t chunk_begin(std::size_t len, std::uint32_t n, std::uint32_t c);
  result<void> ring_all_reduce(std::span<float> data, steady::time_point deadline);
  template <class Op>
  result<void> run_op(Op&& op);
  result<void> all_reduce(std::span<float> data, algorithm algo);
  result<void> all_gather(std::span<const float> mine, std::span<const std::size_t> counts,
                          std::span<float> out);
  result<void> check_peer(std::uint32_t r, const char* what) const;
  result<void> send(std::uint32_t to, std::uint64_t tag, std::span<const float> data);
  result<void> recv(std::uint32_t from, std::uint64_t tag, std::span<float> out);
};

}  // namespace tessera::inference::collectives
