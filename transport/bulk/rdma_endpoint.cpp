// The rdma endpoint's set-up: the device and port (GID choice, MTU), the verbs objects (PD, CQs,
// completion channel, QP, staging memory), the queue pair's INIT -> RTR -> RTS, the receives kept
// posted, and connect()'s hello exchange. The data path: rdma_datapath.cpp.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "actors/base/log.hpp"
#include "transport/bulk/backends.hpp"
#include "transport/bulk/rdma_endpoint.hpp"

namespace tessera::transport::bulk::rdma_ep {

result<void> endpoint::open_device(const link_options& options) {
  int count = 0;
  rdma::device_list list(ibv_get_device_list(&count));
  if (!list || count == 0) {
    return make_error(errc::unsupported, "rdma: no RDMA device on this host");
  }
  std::string names;
  for (int i = 0; i < count; ++i) {
    ibv_device* dev = list.get()[i];
    const std::string name = ibv_get_device_name(dev);
    names += (names.empty() ? "" : ", ") + name;
    if (!options.rdma_device.empty() && name != options.rdma_device) continue;
    rdma::context_ptr ctx(ibv_open_device(dev));
    if (!ctx) {
      return make_error(errc::io, "rdma: {}: ibv_open_device: {}", name, rdma::errno_text(errno));
    }
    auto port = rdma::query_port(ctx.get(), 1);
    if (!port) return std::move(port).error();
    if (!port->active) {
      if (!options.rdma_device.empty()) {
        return make_error(errc::unsupported, "rdma: {} port 1 is not active", name);
      }
      continue;
    }
    if (options.rdma_gid_index >= 0) {
      gid_index_ = static_cast<std::uint32_t>(options.rdma_gid_index);
      auto it = std::find_if(port->gids.begin(), port->gids.end(),
                             [&](const rdma::gid_entry& g) { return g.index == gid_index_; });
      if (it == port->gids.end()) {
        return make_error(errc::invalid_argument, "rdma: {} has no GID at index {}", name,
                          gid_index_);
      }
    } else {
      auto gid = rdma::pick_gid(port->gids, port->ethernet, options.advertise_address);
      if (!gid) return make_error(gid.error().code, "rdma: {}: {}", name, gid.error().message);
      gid_index_ = *gid;
    }
    for (const auto& g : port->gids) {
      if (g.index == gid_index_) local_.gid.assign(g.gid.begin(), g.gid.end());
    }
    device_name_ = name;
    ethernet_ = port->ethernet;
    active_mtu_ = port->active_mtu;
    max_msg_bytes_ = port->max_msg_bytes;
    local_.lid = port->lid;
    ctx_ = std::move(ctx);
    return ok();
  }
  if (!options.rdma_device.empty()) {
    return make_error(errc::not_found, "rdma: device '{}' not found (devices: {})",
                      options.rdma_device, names);
  }
  return make_error(errc::unsupported, "rdma: no device with an active port (devices: {})", names);
}

result<void> endpoint::create_verbs() {
  const std::string& dev = device_name_;
  pd_.reset(ibv_alloc_pd(ctx_.get()));
  if (!pd_) return make_error(errc::io, "rdma: {}: ibv_alloc_pd: {}", dev, rdma::errno_text(errno));
  channel_.reset(ibv_create_comp_channel(ctx_.get()));
  if (!channel_) {
    return make_error(errc::io, "rdma: {}: ibv_create_comp_channel: {}", dev,
                      rdma::errno_text(errno));
  }
  // Non-blocking, so that several threads waiting on one link never block in ibv_get_cq_event.
  const int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return make_error(errc::io, "rdma: {}: completion channel O_NONBLOCK: {}", dev,
                      rdma::errno_text(errno));
  }
  send_cq_.reset(ibv_create_cq(ctx_.get(), static_cast<int>(sq_depth_), nullptr, channel_.get(), 0));
  recv_cq_.reset(ibv_create_cq(ctx_.get(), static_cast<int>(rq_depth_), nullptr, channel_.get(), 0));
  if (!send_cq_ || !recv_cq_) {
    return make_error(errc::io, "rdma: {}: ibv_create_cq: {}", dev, rdma::errno_text(errno));
  }
  // aligned_alloc wants a multiple of the alignment.
  auto pages = [](std::size_t n) { return (n + 4095) / 4096 * 4096; };
  const std::size_t recv_total = pages(static_cast<std::size_t>(rq_depth_) * slot_bytes_);
  const std::size_t send_total = pages(static_cast<std::size_t>(control_slot_ + 1) * slot_bytes_);
  recv_mem_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, recv_total)));
  send_mem_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, send_total)));
  if (!recv_mem_ || !send_mem_) {
    return make_error(errc::no_capacity, "rdma: cannot allocate {} bytes of message buffers",
                      recv_total + send_total);
  }
  recv_mr_.reset(ibv_reg_mr(pd_.get(), recv_mem_.get(), recv_total, IBV_ACCESS_LOCAL_WRITE));
  send_mr_.reset(ibv_reg_mr(pd_.get(), send_mem_.get(), send_total, 0));
  if (!recv_mr_ || !send_mr_) {
    return make_error(errc::io, "rdma: {}: ibv_reg_mr of message buffers: {}", dev,
                      rdma::errno_text(errno));
  }
  ibv_qp_init_attr init{};
  init.send_cq = send_cq_.get();
  init.recv_cq = recv_cq_.get();
  init.cap.max_send_wr = sq_depth_;
  init.cap.max_recv_wr = rq_depth_;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  // Small writes and sends inline, as perftest's latency tests do by default (220 bytes); a
  // device that cannot gets a QP without (the payload is then read from the registered buffer).
  init.cap.max_inline_data = wanted_inline_bytes;
  qp_.reset(ibv_create_qp(pd_.get(), &init));
  if (!qp_) {
    init.cap.max_inline_data = 0;
    qp_.reset(ibv_create_qp(pd_.get(), &init));
  }
  max_inline_ = qp_ ? init.cap.max_inline_data : 0;
  if (!qp_) {
    return make_error(errc::io, "rdma: {}: ibv_create_qp (sq {}, rq {}): {}", dev, sq_depth_,
                      rq_depth_, rdma::errno_text(errno));
  }
  return ok();
}

result<void> endpoint::to_init() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = port_;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  if (int rc = ibv_modify_qp(qp_.get(), &attr, mask); rc != 0) {
    return make_error(errc::io, "rdma: {}: QP {} to INIT: {}", device_name_, qp_->qp_num,
                      rdma::errno_text(rc));
  }
  return ok();
}

result<void> endpoint::to_rtr_rts(const connect_params& remote) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(std::min(active_mtu_, remote.mtu));
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;  // 0.64 ms before a sender retries into an empty receive queue
  attr.ah_attr.is_global = ethernet_ ? 1 : 0;
  std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
  attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_index_);
  attr.ah_attr.grh.hop_limit = 64;
  attr.ah_attr.dlid = remote.lid;
  attr.ah_attr.port_num = port_;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int rc = ibv_modify_qp(qp_.get(), &attr, mask); rc != 0) {
    return make_error(errc::io, "rdma: {}: QP {} to RTR towards QPN {} at {}: {}", device_name_,
                      qp_->qp_num, remote.qpn, rdma::format_gid(remote.gid), rdma::errno_text(rc));
  }
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = rdma::ack_timeout_exponent(options_.peer_timeout_ms, retry_cnt);
  attr.retry_cnt = retry_cnt;
  attr.rnr_retry = rnr_retry_infinite;
  attr.sq_psn = local_.psn;
  attr.max_rd_atomic = 1;
  mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
         IBV_QP_MAX_QP_RD_ATOMIC;
  if (int rc = ibv_modify_qp(qp_.get(), &attr, mask); rc != 0) {
    return make_error(errc::io, "rdma: {}: QP {} to RTS: {}", device_name_, qp_->qp_num,
                      rdma::errno_text(rc));
  }
  return ok();
}

int endpoint::post_receive(std::uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(recv_mem_.get() + slot * slot_bytes_);
  sge.length = static_cast<std::uint32_t>(slot_bytes_);
  sge.lkey = recv_mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp_.get(), &wr, &bad);
}

result<void> endpoint::post_all_receives() {
  for (std::uint32_t i = 0; i < rq_depth_; ++i) {
    if (int rc = post_receive(i); rc != 0) {
      return make_error(errc::io, "rdma: {}: ibv_post_recv: {}", device_name_,
                        rdma::errno_text(rc));
    }
  }
  return ok();
}

result<std::unique_ptr<endpoint>> endpoint::open(const link_options& options) {
  const link_limits& l = options.limits;
  if (l.max_buffers == 0 || l.max_outstanding == 0 || l.max_send_bytes == 0 ||
      l.max_received == 0) {
    return make_error(errc::invalid_argument,
                      "rdma: link limits must be positive (buffers {}, outstanding {}, send bytes "
                      "{}, received {})",
                      l.max_buffers, l.max_outstanding, l.max_send_bytes, l.max_received);
  }
  std::unique_ptr<endpoint> ep(new endpoint());
  ep->options_ = options;
  ep->limits_ = options.limits;
  TESSERA_TRY(ep->open_device(options));
  // The device's message limit (rxe: 8 MiB) bounds one send; longer writes are chunked.
  ep->limits_.max_send_bytes = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(ep->limits_.max_send_bytes, ep->max_msg_bytes_));
  ep->slot_bytes_ = std::max<std::size_t>({ep->limits_.max_send_bytes, notice_bytes, hello_bytes});
  ep->slot_bytes_ = (ep->slot_bytes_ + 63) / 64 * 64;
  ep->probe_slot_ = ep->limits_.max_outstanding;
  ep->control_slot_ = ep->limits_.max_outstanding + 1;
  // Room for every small op, the probe, a control message and the largest chunked write.
  ep->sq_depth_ = static_cast<std::uint32_t>(
      ep->limits_.max_outstanding + 2 +
      rdma::chunk_count(ep->limits_.max_write_bytes, ep->max_msg_bytes_) + 1);
  ep->rq_depth_ = std::clamp<std::uint32_t>(ep->limits_.max_received, 4, max_rq_depth);
  ep->keepalive_ = std::clamp<clock_type::duration>(options.peer_timeout_ms / 4, 50ms, 5s);
  TESSERA_TRY(ep->create_verbs());
  TESSERA_TRY(ep->to_init());
  TESSERA_TRY(ep->post_all_receives());
  ep->ops_.resize(ep->limits_.max_outstanding);
  for (std::uint32_t i = ep->limits_.max_outstanding; i > 0; --i) ep->free_slots_.push_back(i - 1);
  ep->local_.backend = static_cast<std::uint8_t>(backend_kind::rdma);
  ep->local_.host_id = this_host_id();
  ep->local_.nonce = detail::random_u64();
  ep->local_.qpn = ep->qp_->qp_num;
  ep->local_.psn = static_cast<std::uint32_t>(detail::random_u64() & 0xffffff);
  ep->local_.mtu = ep->active_mtu_;
  return ep;
}

int endpoint::post_control(ctl type, std::span<const std::byte> payload) {
  TESSERA_ASSERT(payload.size() <= slot_bytes_, "control payload {} > slot {}", payload.size(),
                 slot_bytes_);
  std::byte* buf = staging(control_slot_);
  if (!payload.empty()) std::memcpy(buf, payload.data(), payload.size());
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(buf);
  sge.length = static_cast<std::uint32_t>(payload.size());
  sge.lkey = send_mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = control_slot_;
  wr.sg_list = payload.empty() ? nullptr : &sge;
  wr.num_sge = payload.empty() ? 0 : 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(static_cast<std::uint32_t>(type));
  ibv_send_wr* bad = nullptr;
  control_status_.reset();
  const int rc = ibv_post_send(qp_.get(), &wr, &bad);
  if (rc == 0) ++sq_used_;
  return rc;
}

result<void> endpoint::connect(const connect_params& remote) {
  if (remote.version != connect_params::current_version) {
    return make_error(errc::unsupported, "rdma: peer params version {} (we speak {})",
                      remote.version, connect_params::current_version);
  }
  if (remote.backend != static_cast<std::uint8_t>(backend_kind::rdma)) {
    return make_error(errc::invalid_argument, "rdma: connect_params of backend {} given to an rdma link",
                      remote.backend);
  }
  if (remote.gid.size() != 16 || remote.qpn == 0 || remote.qpn > 0xffffff ||
      remote.psn > 0xffffff || remote.mtu < IBV_MTU_256 || remote.mtu > IBV_MTU_4096) {
    return make_error(errc::invalid_argument,
                      "rdma: malformed peer params (gid {} bytes, qpn {}, psn {}, mtu enum {})",
                      remote.gid.size(), remote.qpn, remote.psn, remote.mtu);
  }
  remote_ = remote;
  TESSERA_TRY(to_rtr_rts(remote));
  const auto deadline = clock_type::now() + options_.connect_timeout_ms;
  std::array<std::byte, hello_bytes> hello{};
  std::memcpy(hello.data(), &local_.nonce, hello_bytes);
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (int rc = post_control(ctl::hello, hello); rc != 0) {
        return make_error(errc::io, "rdma: post hello: {}", rdma::errno_text(rc));
      }
    }
    for (;;) {
      {
        std::lock_guard lock(mu_);
        drain_locked();
        if (state_ == link_state::down) return *down_cause_;
        if (control_status_ && *control_status_ == IBV_WC_SUCCESS && hello_received_) {
          state_ = link_state::up;
          up_.store(true, std::memory_order_release);
          idle_since_ = clock_type::now();
          activity_seen_ = activity_;
          return ok();
        }
        if (control_status_ && *control_status_ != IBV_WC_SUCCESS) break;
      }
      const auto now = clock_type::now();
      if (now >= deadline) {
        return make_error(errc::timeout,
                          "rdma: peer QPN {} at {} did not complete the handshake within {} ms",
                          remote.qpn, rdma::format_gid(remote.gid),
                          options_.connect_timeout_ms.count());
      }
      block(std::min<std::chrono::microseconds>(
                std::chrono::duration_cast<std::chrono::microseconds>(deadline - now), 100ms),
            [&] { return control_status_.has_value() || state_ == link_state::down; });
    }
    // Our hello was not acknowledged: the peer's QP was not yet ready to receive (it calls
    // connect() later than the retry budget), or it is gone. Start over from RESET while time is
    // left. Once the peer's hello arrived its PSNs have moved on, so a reset would desynchronise.
    const ibv_wc_status status = *control_status_;
    if (hello_received_ || status != IBV_WC_RETRY_EXC_ERR || clock_type::now() >= deadline) {
      return make_error(status == IBV_WC_RETRY_EXC_ERR ? errc::timeout : errc::io,
                        "rdma: handshake with QPN {} at {} failed: {}", remote.qpn,
                        rdma::format_gid(remote.gid), ibv_wc_status_str(status));
    }
    std::lock_guard lock(mu_);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RESET;
    if (int rc = ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE); rc != 0) {
      return make_error(errc::io, "rdma: QP to RESET: {}", rdma::errno_text(rc));
    }
    ibv_wc wcs[16];
    while (ibv_poll_cq(send_cq_.get(), 16, wcs) > 0 || ibv_poll_cq(recv_cq_.get(), 16, wcs) > 0) {
    }
    sq_used_ = 0;
    TESSERA_TRY(to_init());
    TESSERA_TRY(post_all_receives());
    TESSERA_TRY(to_rtr_rts(remote));
  }
}

}  // namespace tessera::transport::bulk::rdma_ep
