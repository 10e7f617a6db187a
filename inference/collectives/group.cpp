// Collectives over bulk links. Design: docs/design/009-collectives.md.
//
// Buffers. Each rank owns, per peer p, one receive buffer that only p writes into:
//   [collective region, parity 0][collective region, parity 1][p2p header + payload]
// A collective region holds one operation's data from p (mesh: the whole vector; ring: one chunk
// per step; all-gather: p's slice). Operation k uses parity k % 2. Rank r starts operation k+2
// only after it received, in operation k+1, data that every peer produced after finishing
// operation k (mesh and all-gather: directly; ring: every rank's reduced chunk reaches every rank
// in the all-gather phase), so a region is never overwritten while its reader still uses it.
// p2p uses one slot per direction with an acknowledgement (one tensor chunk in flight).
// Each rank also owns one registered work buffer: the source of its writes and the ring's
// accumulator.
//
// Immediates: [epoch & 0xff : 8][kind : 4][step : 4][sequence & 0xffff : 16]. Messages sent with
// send() (hello, ack, abort) carry a fixed header with the full epoch.
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

namespace {

enum class kind : std::uint8_t { mesh = 1, ring_reduce = 2, ring_gather = 3, gather = 4, p2p = 5 };

constexpr std::uint32_t magic = 0x4c4f4354;  // "TCOL"
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

std::uint32_t make_imm(std::uint32_t epoch, kind k, std::uint32_t step, std::uint32_t seq) {
  return ((epoch & 0xffu) << 24) | ((static_cast<std::uint32_t>(k) & 0xfu) << 20) |
         ((step & 0xfu) << 16) | (seq & 0xffffu);
}
std::uint32_t imm_epoch(std::uint32_t imm) { return imm >> 24; }
kind imm_kind(std::uint32_t imm) { return static_cast<kind>((imm >> 20) & 0xfu); }
std::uint32_t imm_seq(std::uint32_t imm) { return imm & 0xffffu; }

// Serial-number comparison: negative when a is older than b.
int epoch8_cmp(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::int8_t>(static_cast<std::uint8_t>(a - b));
}
int seq16_cmp(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::int16_t>(static_cast<std::uint16_t>(a - b));
}

std::optional<wire_msg> parse_msg(const std::vector<std::byte>& data) {
  if (data.size() != sizeof(wire_msg)) return std::nullopt;
  wire_msg m;
  std::memcpy(&m, data.data(), sizeof m);
  if (m.magic_ != magic) return std::nullopt;
  return m;
}

std::vector<std::byte> to_bytes(const wire_msg& m) {
  std::vector<std::byte> out(sizeof m);
  std::memcpy(out.data(), &m, sizeof m);
  return out;
}

// Bound of received-but-unconsumed messages kept per peer (early arrivals, newer epochs).
constexpr std::size_t max_pending = 256;
// How long one blocking wait on a link lasts before the other links are looked at again (so an
// abort or a link_down elsewhere is seen promptly).
constexpr std::chrono::microseconds wait_slice{2000};

}  // namespace

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

  // Sum over `members` (every rank, or a team), in members order.
  result<void> mesh_all_reduce(std::span<float> data, steady::time_point deadline,
                               std::span<const std::uint32_t> members) {
    const std::uint64_t bytes = data.size() * sizeof(float);
    std::memcpy(work_.data(), data.data(), bytes);
    const std::uint32_t imm = make_imm(epoch_, kind::mesh, 0, seq_);
    for (std::uint32_t q : members) {
      if (q != rank_) TESSERA_TRY(write(q, 0, region_offset(seq_), bytes, imm));
    }
    for (std::uint32_t q : members) {
      if (q != rank_) TESSERA_TRY(await_write(q, imm, bytes, deadline, "mesh all-reduce data"));
    }
    // Members order on every member: acc = x0; acc += x1; ... (element-wise, no reassociation).
    const float* own = work_floats();
    auto src = [&](std::uint32_t r) { return r == rank_ ? own : region(r, seq_); };
    const float* x0 = src(members[0]);
    float* out = data.data();
    std::copy(x0, x0 + data.size(), out);
    for (std::size_t k = 1; k < members.size(); ++k) {
      const float* x = src(members[k]);
      for (std::size_t i = 0; i < data.size(); ++i) out[i] = out[i] + x[i];
    }
    return drain(deadline);
  }

  result<void> no_team(const char* what) const {
    if (team_.empty()) return ok();
    return make_error(errc::invalid_argument,
                      "collectives: rank {} reduces within its team; a full-group {} is refused",
                      rank_, what);
  }

  result<void> all_reduce_among(std::span<float> data, std::span<const std::uint32_t> members) {
    if (data.empty()) return make_error(errc::invalid_argument, "collectives: all_reduce of 0 floats");
    const bool sorted = std::adjacent_find(members.begin(), members.end(),
                                           [](auto a, auto b) { return a >= b; }) == members.end();
    if (members.empty() || !sorted || members.back() >= n_ ||
        std::find(members.begin(), members.end(), rank_) == members.end())
      return make_error(errc::invalid_argument,
                        "collectives: a team must be sorted rank ids below {} including rank {}",
                        n_, rank_);
    if (team_.empty()) {
      team_.assign(members.begin(), members.end());
    } else if (!std::equal(team_.begin(), team_.end(), members.begin(), members.end())) {
      return make_error(errc::invalid_argument,
                        "collectives: rank {} reduces with one fixed team ({} ranks), not another",
                        rank_, team_.size());
    }
    TESSERA_TRY(usable());
    if (members.size() == 1) return ok();
    for (std::size_t off = 0; off < data.size(); off += options_.max_floats) {
      auto piece = data.subspan(off, std::min(options_.max_floats, data.size() - off));
      TESSERA_TRY(run_op([&](steady::time_point deadline) {
        return mesh_all_reduce(piece, deadline, team_);
      }));
    }
    return ok();
  }

  // Chunk c of n: [c*len/n, (c+1)*len/n).
  static std::size_t chunk_begin(std::size_t len, std::uint32_t n, std::uint32_t c) {
    return len * c / n;
  }

  result<void> ring_all_reduce(std::span<float> data, steady::time_point deadline) {
    const std::size_t len = data.size();
    const std::size_t chunk_max = (len + n_ - 1) / n_;
    std::memcpy(work_.data(), data.data(), len * sizeof(float));
    float* acc = work_floats();
    const std::uint32_t next = (rank_ + 1) % n_;
    const std::uint32_t prev = (rank_ + n_ - 1) % n_;
    auto mod = [this](std::int64_t v) {
      return static_cast<std::uint32_t>(((v % n_) + n_) % n_);
    };
    // Step t of 2(n-1) writes into the successor's region at slot t.
    auto exchange = [&](std::uint32_t t, kind k, std::uint32_t send_chunk,
                        std::uint32_t recv_chunk) -> result<const float*> {
      const std::size_t sb = chunk_begin(len, n_, send_chunk);
      const std::size_t se = chunk_begin(len, n_, send_chunk + 1);
      const std::uint32_t step = k == kind::ring_reduce ? t : t - (n_ - 1);
      TESSERA_TRY(write(next, sb * sizeof(float),
                        region_offset(seq_) + t * chunk_max * sizeof(float),
                        (se - sb) * sizeof(float), make_imm(epoch_, k, step, seq_)));
      const std::size_t rb = chunk_begin(len, n_, recv_chunk);
      const std::size_t re = chunk_begin(len, n_, recv_chunk + 1);
      auto c = await_write(prev, make_imm(epoch_, k, step, seq_), (re - rb) * sizeof(float),
                           deadline, "ring data");
      if (!c) return c.error();
      // Our write of this step read from acc: it must be done before acc changes.
      TESSERA_TRY(drain(deadline));
      return region(prev, seq_) + t * chunk_max;
    };
    // Reduce-scatter: at step s send chunk r-s, receive chunk r-s-1 and add our own to it, so
    // chunk c is summed in the order c, c+1, ..., c-1 and ends complete on rank c-1.
    for (std::uint32_t s = 0; s + 1 < n_; ++s) {
      const std::uint32_t rc = mod(static_cast<std::int64_t>(rank_) - s - 1);
      auto in = exchange(s, kind::ring_reduce, mod(static_cast<std::int64_t>(rank_) - s), rc);
      if (!in) return in.error();
      const std::size_t b = chunk_begin(len, n_, rc), e = chunk_begin(len, n_, rc + 1);
      for (std::size_t i = b; i < e; ++i) acc[i] = (*in)[i - b] + acc[i];
    }
    // All-gather: the owner's bits travel around the ring unchanged.
    for (std::uint32_t s = 0; s + 1 < n_; ++s) {
      const std::uint32_t rc = mod(static_cast<std::int64_t>(rank_) - s);
      auto in = exchange(n_ - 1 + s, kind::ring_gather,
                         mod(static_cast<std::int64_t>(rank_) + 1 - s), rc);
      if (!in) return in.error();
      const std::size_t b = chunk_begin(len, n_, rc), e = chunk_begin(len, n_, rc + 1);
      std::copy(*in, *in + (e - b), acc + b);
    }
    std::memcpy(data.data(), acc, len * sizeof(float));
    return ok();
  }

  template <class Op>
  result<void> run_op(Op&& op) {
    TESSERA_TRY(usable());
    const auto deadline = steady::now() + options_.timeout_ms;
    auto r = op(deadline);
    if (!r) return fail(std::move(r).error());
    ++seq_;
    ++stats_.operations;
    return ok();
  }

  result<void> all_reduce(std::span<float> data, algorithm algo) {
    if (data.empty()) return make_error(errc::invalid_argument, "collectives: all_reduce of 0 floats");
    TESSERA_TRY(no_team("all_reduce"));
    TESSERA_TRY(usable());
    if (n_ == 1) return ok();
    const bool ring = algo == algorithm::ring ||
                      (algo == algorithm::automatic && data.size() >= options_.ring_threshold_floats);
    for (std::size_t off = 0; off < data.size(); off += options_.max_floats) {
      auto piece = data.subspan(off, std::min(options_.max_floats, data.size() - off));
      TESSERA_TRY(run_op([&](steady::time_point deadline) {
        return ring ? ring_all_reduce(piece, deadline) : mesh_all_reduce(piece, deadline, all_ranks_);
      }));
    }
    return ok();
  }

  result<void> all_gather(std::span<const float> mine, std::span<const std::size_t> counts,
                          std::span<float> out) {
    TESSERA_TRY(no_team("all_gather"));
    if (counts.size() != n_) {
      return make_error(errc::invalid_argument, "collectives: all_gather got {} counts for {} ranks",
                        counts.size(), n_);
    }
    std::size_t total = 0;
    for (std::uint32_t r = 0; r < n_; ++r) {
      if (counts[r] > options_.max_floats) {
        return make_error(errc::invalid_argument,
                          "collectives: all_gather slice of rank {} has {} floats, above the "
                          "group's max_floats {}",
                          r, counts[r], options_.max_floats);
      }
      total += counts[r];
    }
    if (mine.size() != counts[rank_]) {
      return make_error(errc::invalid_argument,
                        "collectives: all_gather: rank {} passes {} floats, counts say {}", rank_,
                        mine.size(), counts[rank_]);
    }
    if (out.size() != total) {
      return make_error(errc::invalid_argument,
                        "collectives: all_gather output holds {} floats, counts sum to {}",
                        out.size(), total);
    }
    auto offset_of = [&](std::uint32_t r) {
      std::size_t o = 0;
      for (std::uint32_t i = 0; i < r; ++i) o += counts[i];
      return o;
    };
    return run_op([&](steady::time_point deadline) -> result<void> {
      const std::uint64_t bytes = mine.size() * sizeof(float);
      if (bytes > 0) std::memcpy(work_.data(), mine.data(), bytes);
      const std::uint32_t imm = make_imm(epoch_, kind::gather, 0, seq_);
      for (std::uint32_t q = 0; q < n_; ++q) {
        if (q != rank_) TESSERA_TRY(write(q, 0, region_offset(seq_), bytes, imm));
      }
      std::copy(mine.begin(), mine.end(), out.begin() + static_cast<std::ptrdiff_t>(offset_of(rank_)));
      for (std::uint32_t q = 0; q < n_; ++q) {
        if (q == rank_) continue;
        TESSERA_TRY(await_write(q, imm, counts[q] * sizeof(float), deadline, "all-gather slice"));
        const float* in = region(q, seq_);
        std::copy(in, in + counts[q], out.begin() + static_cast<std::ptrdiff_t>(offset_of(q)));
      }
      return drain(deadline);
    });
  }

  result<void> check_peer(std::uint32_t r, const char* what) const {
    if (r >= n_ || r == rank_) {
      return make_error(errc::invalid_argument, "collectives: {} rank {} is not a peer of rank {} (group of {})",
                        what, r, rank_, n_);
    }
    return ok();
  }

  result<void> send(std::uint32_t to, std::uint64_t tag, std::span<const float> data) {
    TESSERA_TRY(check_peer(to, "send to"));
    TESSERA_TRY(usable());
    const auto deadline = steady::now() + options_.timeout_ms;
    peer& p = peers_[to];
    std::size_t off = 0;
    do {
      const std::size_t count = std::min(options_.max_floats, data.size() - off);
      if (p.p2p_unacked) {
        const std::uint32_t want = p.p2p_send_seq - 1;
        auto a = await(
            to, deadline,
            [this, want](const bulk::completion& x) {
              if (x.kind != bulk::completion_kind::send_received) return false;
              auto m = parse_msg(x.data);
              return m && m->type == static_cast<std::uint32_t>(msg_type::ack) &&
                     m->epoch == epoch_ && m->seq == want;
            },
            "the receiver's acknowledgement");
        if (!a) return fail(std::move(a).error());
        p.p2p_unacked = false;
      }
      p2p_header h{tag, data.size(), off, count};
      std::memcpy(work_.data(), &h, sizeof h);
      if (count > 0) {
        std::memcpy(work_.data() + sizeof h, data.data() + off, count * sizeof(float));
      }
      auto w = write(to, 0, p2p_offset(), sizeof h + count * sizeof(float),
                     make_imm(epoch_, kind::p2p, 0, p.p2p_send_seq));
      if (!w) return fail(std::move(w).error());
      ++p.p2p_send_seq;
      p.p2p_unacked = true;
      auto d = drain(deadline);
      if (!d) return fail(std::move(d).error());
      off += count;
    } while (off < data.size());
    return ok();
  }

  result<void> recv(std::uint32_t from, std::uint64_t tag, std::span<float> out) {
    TESSERA_TRY(check_peer(from, "recv from"));
    TESSERA_TRY(usable());
    const auto deadline = steady::now() + options_.timeout_ms;
    peer& p = peers_[from];
    std::size_t off = 0;
    do {
      const std::uint32_t imm = make_imm(epoch_, kind::p2p, 0, p.p2p_recv_seq);
      auto c = await(
          from, deadline,
          [imm](const bulk::completion& x) {
            return x.kind == bulk::completion_kind::write_received && x.imm == imm;
          },
          "a pipeline tensor");
      if (!c) return fail(std::move(c).error());
      p2p_header h;
      const std::byte* slot = p.recv.data() + p2p_offset();
      if (c->bytes < sizeof h) {
        return fail(make_error(errc::protocol, "collectives: short pipeline message from rank {}", from));
      }
      std::memcpy(&h, slot, sizeof h);
      if (h.tag != tag || h.total != out.size() || h.offset != off ||
          c->bytes != sizeof h + h.count * sizeof(float) || h.offset + h.count > out.size()) {
        // Consumed; the group fails (the plan is inconsistent) and the sender learns by the abort.
        ++p.p2p_recv_seq;
        return fail(make_error(errc::protocol,
                               "collectives: rank {} sent a tensor with tag {} of {} floats "
                               "(chunk at {}), rank {} expected tag {} of {} floats",
                               from, h.tag, h.total, h.offset, rank_, tag, out.size()));
      }
      std::memcpy(out.data() + off, slot + sizeof h, h.count * sizeof(float));
      wire_msg m;
      m.type = static_cast<std::uint32_t>(msg_type::ack);
      m.epoch = epoch_;
      m.seq = p.p2p_recv_seq;
      m.rank = rank_;
      m.size = n_;
      auto s = send_msg(from, m);
      if (!s) return fail(std::move(s).error());
      ++p.p2p_recv_seq;
      off += h.count;
    } while (off < out.size());
    return drain(deadline);
  }
};

result<std::unique_ptr<group>> group::create(std::uint32_t rank,
                                             std::vector<bulk::link*> links,
                                             const group_options& options) {
  const auto n = static_cast<std::uint32_t>(links.size());
  if (n == 0 || n > max_group_size) {
    return make_error(errc::invalid_argument, "collectives: group size {} is outside 1..{}", n,
                      max_group_size);
  }
  if (rank >= n) {
    return make_error(errc::invalid_argument, "collectives: rank {} outside a group of {}", rank, n);
  }
  if (options.epoch == 0) {
    return make_error(errc::invalid_argument, "collectives: epoch 0 is reserved; start at 1");
  }
  if (options.max_floats == 0 || options.max_floats > (std::size_t{1} << 28)) {
    return make_error(errc::invalid_argument, "collectives: max_floats {} outside 1..2^28",
                      options.max_floats);
  }
  for (std::uint32_t q = 0; q < n; ++q) {
    if (q == rank && links[q] != nullptr) {
      return make_error(errc::invalid_argument, "collectives: links[{}] (this rank) must be null", q);
    }
    if (q != rank && (links[q] == nullptr || !links[q]->is_up())) {
      return make_error(errc::invalid_argument, "collectives: no live link to rank {}", q);
    }
  }
  auto im = std::make_unique<impl>();
  im->rank_ = rank;
  im->n_ = n;
  for (std::uint32_t r = 0; r < n; ++r) im->all_ranks_.push_back(r);
  im->options_ = options;
  // A ring operation uses 2(n-1) chunks of ceil(len/n) floats: at most 2*len + 2n floats.
  im->region_bytes_ = ((2 * options.max_floats + 2 * max_group_size) * sizeof(float) + 63) / 64 * 64;
  auto work = bulk::allocate_buffer(options.max_floats * sizeof(float) + sizeof(p2p_header));
  if (!work) return work.error();
  im->work_ = std::move(*work);
  im->peers_.resize(n);
  for (std::uint32_t q = 0; q < n; ++q) {
    if (q == rank) continue;
    auto& p = im->peers_[q];
    p.link = links[q];
    auto buf = bulk::allocate_buffer(2 * im->region_bytes_ + sizeof(p2p_header) +
                                     options.max_floats * sizeof(float));
    if (!buf) return buf.error();
    p.recv = std::move(*buf);
    auto rh = p.link->register_buffer(p.recv);
    if (!rh) {
      return make_error(rh.error().code, "collectives: cannot register the receive buffer for rank {}: {}",
                        q, rh.error().describe());
    }
    p.recv_h = *rh;
    auto wh = p.link->register_buffer(im->work_);
    if (!wh) {
      return make_error(wh.error().code, "collectives: cannot register the work buffer on the link to rank {}: {}",
                        q, wh.error().describe());
    }
    p.work_h = *wh;
  }
  TESSERA_TRY(im->handshake(options.epoch));
  return std::unique_ptr<group>(new group(std::move(im)));
}

group::group(std::unique_ptr<impl> impl) : impl_(std::move(impl)) {}
group::~group() = default;

std::uint32_t group::rank() const noexcept { return impl_->rank_; }
std::uint32_t group::size() const noexcept { return impl_->n_; }
std::uint32_t group::epoch() const noexcept { return impl_->epoch_; }
group_stats group::stats() const noexcept { return impl_->stats_; }
void group::set_timeout(std::chrono::milliseconds timeout) noexcept {
  impl_->options_.timeout_ms = timeout;
}

result<void> group::all_reduce(std::span<float> data, algorithm algo) {
  return impl_->all_reduce(data, algo);
}
result<void> group::all_reduce_among(std::span<float> data,
                                     std::span<const std::uint32_t> members) {
  return impl_->all_reduce_among(data, members);
}
result<void> group::all_gather(std::span<const float> mine, std::span<const std::size_t> counts,
                               std::span<float> out) {
  return impl_->all_gather(mine, counts, out);
}
result<void> group::send(std::uint32_t to, std::uint64_t tag, std::span<const float> data) {
  return impl_->send(to, tag, data);
}
result<void> group::recv(std::uint32_t from, std::uint64_t tag, std::span<float> out) {
  return impl_->recv(from, tag, out);
}
void group::abort(std::string reason) {
  {
    std::lock_guard lock(impl_->external_mu_);
    if (impl_->external_abort_.load(std::memory_order_relaxed)) return;  // the first reason stays
    impl_->external_reason_ = std::move(reason);
  }
  impl_->external_abort_.store(true, std::memory_order_release);
}

result<void> group::set_epoch(std::uint32_t epoch) {
  if (epoch <= impl_->epoch_) {
    return make_error(errc::invalid_argument, "collectives: new epoch {} is not after the current {}",
                      epoch, impl_->epoch_);
  }
  auto r = impl_->handshake(epoch);
  if (!r) impl_->failed_ = r.error();
  return r;
}

}  // namespace tessera::inference::collectives
