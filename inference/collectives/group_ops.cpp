// The collectives' operations on one rank: all-reduce over the whole group (direct mesh, or ring
// reduce-scatter + all-gather) or within a team, all-gather of uneven slices, pipeline send and
// recv with acknowledgements. Each runs under run_op(): one deadline, the sequence advanced only
// on success, a failure fails the group. The wire format and progress: group_impl.hpp.
#include <algorithm>
#include <cstring>

#include "inference/collectives/group_impl.hpp"

namespace tessera::inference::collectives {

// Defined first: every operation below runs under it.
template <class Op>
result<void> group::impl::run_op(Op&& op) {
  TESSERA_TRY(usable());
  const auto deadline = steady::now() + options_.timeout_ms;
  auto r = op(deadline);
  if (!r) return fail(std::move(r).error());
  ++seq_;
  ++stats_.operations;
  return ok();
}

// Sum over `members` (every rank, or a team), in members order.
result<void> group::impl::mesh_all_reduce(std::span<float> data, steady::time_point deadline,
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

result<void> group::impl::no_team(const char* what) const {
  if (team_.empty()) return ok();
  return make_error(errc::invalid_argument,
                    "collectives: rank {} reduces within its team; a full-group {} is refused",
                    rank_, what);
}

result<void> group::impl::all_reduce_among(std::span<float> data,
                                           std::span<const std::uint32_t> members) {
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
std::size_t group::impl::chunk_begin(std::size_t len, std::uint32_t n, std::uint32_t c) {
  return len * c / n;
}

result<void> group::impl::ring_all_reduce(std::span<float> data, steady::time_point deadline) {
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

result<void> group::impl::all_reduce(std::span<float> data, algorithm algo) {
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

result<void> group::impl::all_gather(std::span<const float> mine,
                                     std::span<const std::size_t> counts, std::span<float> out) {
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

result<void> group::impl::check_peer(std::uint32_t r, const char* what) const {
  if (r >= n_ || r == rank_) {
    return make_error(errc::invalid_argument, "collectives: {} rank {} is not a peer of rank {} (group of {})",
                      what, r, rank_, n_);
  }
  return ok();
}

result<void> group::impl::send(std::uint32_t to, std::uint64_t tag,
                               std::span<const float> data) {
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

result<void> group::impl::recv(std::uint32_t from, std::uint64_t tag,
                               std::span<float> out) {
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

}  // namespace tessera::inference::collectives
