#include "mesh/runtime/bandwidth_probe.hpp"

#include <array>
#include <condition_variable>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"

namespace tessera::mesh::runtime {

namespace bulk = transport::bulk;
using clock_type = std::chrono::steady_clock;

namespace {

std::string pack_setup(const bulk_setup_message& m) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, m);
  return std::string(buf.data(), buf.size());
}

std::vector<std::uint8_t> to_u8(const std::vector<std::byte>& b) {
  std::vector<std::uint8_t> out(b.size());
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
  return out;
}

bulk::link_options probe_options(const bulk::link_addresses& addresses) {
  bulk::link_options o;
  addresses.apply_to(o);
  o.connect_timeout_ms = kProbeTimeout;
  o.peer_timeout_ms = kProbeTimeout;
  return o;
}

/// Waits until `want` completions of `kind` arrived (or any failure), in 100 ms slices so that
/// `stopping` is honoured. The first send_received's data goes to `data` when given.
result<void> wait_for(bulk::link& l, bulk::completion_kind kind, std::uint32_t want,
                      clock_type::time_point deadline, const std::atomic<bool>& stopping,
                      std::vector<std::byte>* data = nullptr) {
  std::array<bulk::completion, 16> c;
  std::uint32_t got = 0;
  while (got < want) {
    if (stopping) return make_error(errc::cancelled, "node stopping");
    if (clock_type::now() >= deadline)
      return make_error(errc::timeout, "bandwidth probe: no {} within {} ms", bulk::to_string(kind),
                        kProbeTimeout.count());
    auto n = l.wait(c, std::chrono::milliseconds(100));
    if (!n) return n.error();
    for (std::size_t i = 0; i < *n; ++i) {
      if (!c[i].ok()) return *c[i].failure;
      if (c[i].kind == kind) {
        if (data && got == 0) *data = c[i].data;
        ++got;
      }
    }
  }
  return ok();
}

}  // namespace

bandwidth_prober::bandwidth_prober(bulk::link_addresses addresses, sender send,
                                   std::uint16_t offer_type, std::uint16_t answer_type)
    : addresses_(std::move(addresses)),
      send_(std::move(send)),
      offer_type_(offer_type),
      answer_type_(answer_type) {}

bandwidth_prober::~bandwidth_prober() {
  stop();
}

void bandwidth_prober::stop() {
  stopping_ = true;
  cv_.notify_all();
  std::vector<worker> ws;
  {
    std::lock_guard lock(mu_);
    ws.swap(workers_);
  }
  for (auto& w : ws)
    if (w.thread.joinable()) w.thread.join();
}

void bandwidth_prober::reap() {
  // mu_ held by the caller.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (*it->done) {
      it->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

bool bandwidth_prober::busy() const {
  std::lock_guard lock(mu_);
  return initiating_;
}

bool bandwidth_prober::start(member_id peer, const std::string& peer_hex,
                             bulk::backend_kind backend) {
  std::lock_guard lock(mu_);
  reap();
  if (initiating_ || stopping_) return false;
  initiating_ = true;
  current_id_ = next_id_++;
  answer_.reset();
  auto done = std::make_shared<std::atomic<bool>>(false);
  const std::uint64_t id = current_id_;
  workers_.push_back({std::thread([this, peer, peer_hex, backend, id, done] {
                        name_this_thread("bw-probe");
                        initiate(peer, peer_hex, backend, id);
                        *done = true;
                      }),
                      done});
  return true;
}

void bandwidth_prober::on_answer(member_id /*peer*/, const bulk_setup_message& m) {
  std::lock_guard lock(mu_);
  if (!initiating_ || m.probe_id != current_id_) return;  // late answer of an abandoned probe
  answer_ = m;
  cv_.notify_all();
}

void bandwidth_prober::on_offer(member_id peer, const std::string& peer_hex,
                                const bulk_setup_message& m) {
  std::lock_guard lock(mu_);
  reap();
  if (stopping_ || responders_ >= kMaxResponders) return;  // bound: the initiator times out
  ++responders_;
  auto done = std::make_shared<std::atomic<bool>>(false);
  workers_.push_back({std::thread([this, peer, peer_hex, m, done] {
                        name_this_thread("bw-answer");
                        respond(peer, peer_hex, m);
                        {
                          std::lock_guard l(mu_);
                          --responders_;
                        }
                        *done = true;
                      }),
                      done});
}

std::vector<bandwidth_result> bandwidth_prober::take_results() {
  std::lock_guard lock(mu_);
  std::vector<bandwidth_result> out;
  out.swap(results_);
  return out;
}

void bandwidth_prober::finish(bandwidth_result r) {
  std::lock_guard lock(mu_);
  initiating_ = false;
  results_.push_back(std::move(r));
}

void bandwidth_prober::initiate(member_id peer, std::string hex, bulk::backend_kind backend,
                                std::uint64_t id) {
  bandwidth_result r{peer, static_cast<std::uint8_t>(backend), 0, {}};
  auto fail = [&](const error& e) {
    r.error = e.describe();
    finish(r);
  };
  auto setup = bulk::prepare_link(backend, probe_options(addresses_));
  if (!setup) return fail(setup.error());
  send_(hex, offer_type_,
        pack_setup({id, static_cast<std::uint8_t>(backend),
                    to_u8(bulk::encode((*setup)->local_params()))}));
  std::optional<bulk_setup_message> answer;
  {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, kProbeTimeout, [&] { return answer_.has_value() || stopping_.load(); });
    answer = answer_;
  }
  if (!answer) return fail(make_error(errc::timeout, "no bulk.answer from the peer"));
  auto params = bulk::decode_connect_params(
      std::span(reinterpret_cast<const std::byte*>(answer->params.data()), answer->params.size()));
  if (!params) return fail(params.error());
  auto link = (*setup)->connect(*params);
  if (!link) return fail(link.error());
  const auto deadline = clock_type::now() + 2 * kProbeTimeout;
  std::vector<std::byte> desc_bytes;
  if (auto w = wait_for(**link, bulk::completion_kind::send_received, 1, deadline, stopping_,
                        &desc_bytes);
      !w)
    return fail(w.error());
  bulk::remote_buffer remote;
  try {
    auto oh = tessera::bounded_unpack(reinterpret_cast<const char*>(desc_bytes.data()),
                                      desc_bytes.size());
    remote = oh.get().as<bulk::remote_buffer>();
  } catch (const std::exception&) {
    return fail(make_error(errc::corrupt, "bandwidth probe: undecodable buffer descriptor"));
  }
  // Round trips: a small send, echoed by the peer.
  {
    std::vector<double> rtts;
    const std::array<std::byte, 8> ping{};
    for (std::uint32_t i = 0; i < kPings; ++i) {
      const auto t0 = clock_type::now();
      if (auto s = (*link)->send(ping, 100 + i); !s) return fail(s.error());
      if (auto w = wait_for(**link, bulk::completion_kind::send_received, 1, deadline, stopping_);
          !w)
        return fail(w.error());
      rtts.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    std::nth_element(rtts.begin(), rtts.begin() + static_cast<std::ptrdiff_t>(rtts.size() / 2),
                     rtts.end());
    r.rtt_us = rtts[rtts.size() / 2];
  }
  const std::uint64_t chunk = kBurstBytes / kBurstWrites;
  if (remote.size < chunk) return fail(make_error(errc::protocol, "peer buffer too small"));
  auto src = bulk::allocate_buffer(chunk);
  if (!src) return fail(src.error());
  auto h = (*link)->register_buffer(*src);
  if (!h) return fail(h.error());
  // Each burst is one list of writes: one post (one doorbell on rdma, one system call on tcp).
  std::array<bulk::write_request, kBurstWrites> burst;
  for (std::uint32_t i = 0; i < kBurstWrites; ++i)
    burst[i] = {*h, 0, remote, 0, chunk, i, i};
  for (std::uint32_t b = 0; b < 1 + kTimedBursts; ++b) {
    const auto t0 = clock_type::now();
    if (auto w = (*link)->post_writes(burst); !w) return fail(w.error());
    // The peer answers with a send once the burst's last write landed.
    std::array<bulk::completion, 16> c;
    std::uint32_t done = 0;
    bool confirmed = false;
    while (!confirmed || done < kBurstWrites) {
      if (stopping_) return fail(make_error(errc::cancelled, "node stopping"));
      if (clock_type::now() >= deadline) return fail(make_error(errc::timeout, "burst timed out"));
      auto n = (*link)->wait(c, std::chrono::milliseconds(100));
      if (!n) return fail(n.error());
      for (std::size_t i = 0; i < *n; ++i) {
        if (!c[i].ok()) return fail(*c[i].failure);
        if (c[i].kind == bulk::completion_kind::write_done) ++done;
        if (c[i].kind == bulk::completion_kind::send_received) {
          confirmed = true;
          const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
          if (b > 0 && s > 0) r.mbps = std::max(r.mbps, static_cast<double>(kBurstBytes) / s / 1e6);
        }
      }
    }
  }
  (*link)->close();
  finish(r);
}

void bandwidth_prober::respond(member_id peer, std::string hex, bulk_setup_message offer) {
  auto log_fail = [&](const error& e) {
    spdlog::debug("bandwidth probe from {:016x}: {}", peer, e.describe());
  };
  const auto backend = static_cast<bulk::backend_kind>(offer.backend);
  auto setup = bulk::prepare_link(backend, probe_options(addresses_));
  if (!setup) return log_fail(setup.error());
  auto params = bulk::decode_connect_params(
      std::span(reinterpret_cast<const std::byte*>(offer.params.data()), offer.params.size()));
  if (!params) return log_fail(params.error());
  send_(hex, answer_type_,
        pack_setup({offer.probe_id, offer.backend, to_u8(bulk::encode((*setup)->local_params()))}));
  auto link = (*setup)->connect(*params);
  if (!link) return log_fail(link.error());
  auto buf = bulk::allocate_buffer(kBurstBytes / kBurstWrites);
  if (!buf) return log_fail(buf.error());
  auto h = (*link)->register_buffer(*buf);
  if (!h) return log_fail(h.error());
  auto desc = (*link)->describe(*h);
  if (!desc) return log_fail(desc.error());
  msgpack::sbuffer sb;
  msgpack::pack(sb, *desc);
  if (auto s =
          (*link)->send(std::span(reinterpret_cast<const std::byte*>(sb.data()), sb.size()), 1);
      !s)
    return log_fail(s.error());
  const auto deadline = clock_type::now() + 2 * kProbeTimeout;
  // Echo every ping, then confirm every burst once its last write landed.
  const std::array<std::byte, 8> pong{};
  for (std::uint32_t i = 0; i < kPings; ++i) {
    if (auto w = wait_for(**link, bulk::completion_kind::send_received, 1, deadline, stopping_); !w)
      return log_fail(w.error());
    if (auto s = (*link)->send(pong, 200 + i); !s) return log_fail(s.error());
  }
  for (std::uint32_t b = 0; b < 1 + kTimedBursts; ++b) {
    if (auto w = wait_for(**link, bulk::completion_kind::write_received, kBurstWrites, deadline,
                          stopping_);
        !w)
      return log_fail(w.error());
    const std::byte ok_byte{1};
    if (auto s = (*link)->send(std::span(&ok_byte, 1), 2); !s) return log_fail(s.error());
  }
  // Keep the link until the initiator closes it (or a short bound), so the confirmation is not
  // cut off by our close.
  (void)wait_for(**link, bulk::completion_kind::link_down, 1,
                 clock_type::now() + std::chrono::milliseconds(1000), stopping_);
  (*link)->close();
}

}  // namespace tessera::mesh::runtime
