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

#include <string>

#include "inference/collectives/group_impl.hpp"

namespace tessera::inference::collectives {

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
