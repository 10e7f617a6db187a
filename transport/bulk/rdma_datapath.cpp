// The rdma endpoint's data path: completions drained and handed out, registrations, writes
// (chunked WRITE_WITH_IMM, lists posted as one chain), sends, the keepalive probe and the link's
// own deadline on posted work, wait() and close(). The set-up: rdma_endpoint.cpp.
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

void endpoint::drain_locked() {
  ibv_wc wcs[32];
  int n = 0;
  bool any = false;
  // sq_used_ counts every posted send WR until the signaled completion that retires it is polled
  // (once the link is down it only stays high): at zero nothing can be in the send CQ, and a
  // waiter spinning for an arrival polls only the receive CQ (each ibv_poll_cq takes a lock).
  while (sq_used_ > 0 && (n = ibv_poll_cq(send_cq_.get(), 32, wcs)) > 0) {
    any = true;
    for (int i = 0; i < n; ++i) on_send_wc(wcs[i]);
  }
  // A full received queue stops the draining: receives stay consumed, the peer gets RNR NAKs and
  // retries (backpressure) until the owner polls.
  while (received_queued_ < limits_.max_received) {
    const int room = static_cast<int>(std::min<std::uint32_t>(32, limits_.max_received - received_queued_));
    n = ibv_poll_cq(recv_cq_.get(), room, wcs);
    if (n <= 0) break;
    any = true;
    for (int i = 0; i < n; ++i) on_recv_wc(wcs[i]);
  }
  // A count, not a clock read: on a VM the clock may be an emulated HPET costing microseconds.
  if (any) ++activity_;
}

error endpoint::wc_error(const ibv_wc& wc, std::string_view what) const {
  const std::string peer = fmt::format("peer QPN {} at {}", remote_.qpn, rdma::format_gid(remote_.gid));
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
      return make_error(errc::timeout,
                        "rdma: {} to {} not acknowledged within ~{} ms (retry count exceeded): the "
                        "peer is dead or unreachable",
                        what, peer, options_.peer_timeout_ms.count());
    case IBV_WC_REM_ACCESS_ERR:
      return make_error(errc::protocol,
                        "rdma: {} refused by {} (remote access error): the target buffer is not "
                        "registered there (deregistered, or a wrong descriptor)",
                        what, peer);
    case IBV_WC_WR_FLUSH_ERR:
      return make_error(errc::closed, "rdma: {} flushed: the link to {} is down", what, peer);
    default:
      return make_error(errc::io, "rdma: {} to {} failed: {}", what, peer, wc_text(wc));
  }
}

void endpoint::on_send_wc(const ibv_wc& wc) {
  const auto slot = static_cast<std::uint32_t>(wc.wr_id);
  ++send_completions_;
  if (slot == control_slot_) {
    --sq_used_;
    control_status_ = wc.status;
    if (wc.status != IBV_WC_SUCCESS && state_ == link_state::up) {
      go_down_locked(wc_error(wc, "control message"));
    }
    return;
  }
  if (state_ == link_state::down) return;  // pending ops were failed when it went down
  if (wc.status != IBV_WC_SUCCESS) {
    const bool probe = slot == probe_slot_;
    go_down_locked(wc_error(wc, probe ? "keepalive probe" : "operation"));
    return;
  }
  if (slot == probe_slot_) {
    --sq_used_;
    probe_in_flight_ = false;
    return;
  }
  TESSERA_ASSERT(slot < ops_.size() && ops_[slot].busy, "send completion for idle slot {}", slot);
  pending_op& op = ops_[slot];
  sq_used_ -= op.wrs;
  completion c;
  c.kind = op.kind;
  c.wr_id = op.user_wr_id;
  c.bytes = op.bytes;
  ready_.push_back(std::move(c));
  release_slot(slot);
}

void endpoint::on_recv_wc(const ibv_wc& wc) {
  if (state_ == link_state::down) return;
  if (wc.status == IBV_WC_WR_FLUSH_ERR && state_ == link_state::connecting) {
    return;  // a failed hello put the QP in error; connect() resets it and reposts
  }
  if (wc.status != IBV_WC_SUCCESS) {
    go_down_locked(wc_error(wc, "receive"));
    return;
  }
  const auto slot = static_cast<std::uint32_t>(wc.wr_id);
  const std::byte* data = recv_mem_.get() + slot * slot_bytes_;
  completion c;
  bool deliver = false;
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    c.kind = completion_kind::write_received;
    c.imm = ntohl(wc.imm_data);
    c.bytes = wc.byte_len;
    deliver = true;
  } else if (wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
    switch (static_cast<ctl>(ntohl(wc.imm_data))) {
      case ctl::user:
        c.kind = completion_kind::send_received;
        c.bytes = wc.byte_len;
        c.data.assign(data, data + wc.byte_len);
        deliver = true;
        break;
      case ctl::write_notice:
        if (wc.byte_len != notice_bytes) {
          go_down_locked(make_error(errc::protocol, "rdma: write notice of {} bytes", wc.byte_len));
          return;
        }
        c.kind = completion_kind::write_received;
        std::memcpy(&c.imm, data, 4);
        std::memcpy(&c.bytes, data + 4, 8);
        deliver = true;
        break;
      case ctl::hello: {
        std::uint64_t nonce = 0;
        if (wc.byte_len == hello_bytes) std::memcpy(&nonce, data, hello_bytes);
        if (wc.byte_len != hello_bytes || nonce != remote_.nonce) {
          go_down_locked(make_error(errc::unauthorized,
                                    "rdma: QPN {} greeted with a nonce that is not the one in its "
                                    "params: not the peer the control plane named",
                                    remote_.qpn));
          return;
        }
        hello_received_ = true;
        break;
      }
      case ctl::bye:
        go_down_locked(make_error(errc::closed, "rdma: the peer closed the link"));
        return;
      default:
        go_down_locked(make_error(errc::protocol, "rdma: unknown control message {}",
                                  ntohl(wc.imm_data)));
        return;
    }
  } else {
    go_down_locked(make_error(errc::protocol, "rdma: unexpected receive opcode {}",
                              static_cast<int>(wc.opcode)));
    return;
  }
  if (deliver) {
    ready_.push_back(std::move(c));
    ++received_queued_;
  }
  if (int rc = post_receive(slot); rc != 0) {
    go_down_locked(make_error(errc::io, "rdma: repost receive: {}", rdma::errno_text(rc)));
  }
}

void endpoint::go_down_locked(error cause) {
  if (state_ == link_state::down) return;
  const bool was_up = state_ == link_state::up;
  state_ = link_state::down;
  up_.store(false, std::memory_order_release);
  down_cause_ = cause;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE);  // flushes whatever is still posted
  for (std::uint32_t slot = 0; slot < ops_.size(); ++slot) {
    if (!ops_[slot].busy) continue;
    completion c;
    c.kind = ops_[slot].kind;
    c.wr_id = ops_[slot].user_wr_id;
    c.failure = cause;
    ready_.push_back(std::move(c));
    release_slot(slot);
  }
  if (was_up) {
    completion down;
    down.kind = completion_kind::link_down;
    down.failure = cause;
    ready_.push_back(std::move(down));
    spdlog::warn("rdma link {} -> QPN {} down: {}", local_.qpn, remote_.qpn, cause.describe());
  } else {
    link_down_delivered_ = true;  // never up: connect() returns the cause instead
  }
}

std::optional<std::uint32_t> endpoint::take_slot() {
  if (free_slots_.empty()) return std::nullopt;
  const std::uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  ops_[slot].busy = true;
  return slot;
}

void endpoint::release_slot(std::uint32_t slot) {
  ops_[slot] = pending_op{};
  free_slots_.push_back(slot);
}

std::size_t endpoint::hand_out_locked(std::span<completion> out) {
  std::size_t n = 0;
  while (n < out.size() && !ready_.empty()) {
    completion& c = ready_.front();
    switch (c.kind) {
      case completion_kind::write_done:
      case completion_kind::send_done: --outstanding_; break;
      case completion_kind::write_received:
      case completion_kind::send_received: --received_queued_; break;
      case completion_kind::link_down: link_down_delivered_ = true; break;
    }
    out[n++] = std::move(c);
    ready_.pop_front();
  }
  return n;
}

error endpoint::closed_error_locked() const {
  return make_error(errc::closed, "rdma link is down: {}",
                    down_cause_ ? down_cause_->describe() : std::string("not connected"));
}

void endpoint::maybe_probe_locked(clock_type::time_point now) {
  // Work posted and not one send-queue completion for peer_timeout_ms: the peer is unreachable
  // or alive and not reading (e.g. `tessera fault pause`). The link goes down, failing every
  // pending operation, instead of retrying into the peer's empty receive queue forever.
  if (state_ == link_state::up && sq_used_ > 0) {
    if (send_completions_ != send_completions_seen_) {
      send_completions_seen_ = send_completions_;
      stuck_since_ = now;
    } else if (now - stuck_since_ > options_.peer_timeout_ms) {
      go_down_locked(make_error(
          errc::timeout,
          "rdma: peer QPN {} at {} completed none of {} posted operations for {} ms: it does not "
          "read (its receive queue is empty, RNR) or cannot be reached",
          remote_.qpn, rdma::format_gid(remote_.gid), sq_used_,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - stuck_since_).count()));
      return;
    }
  } else {
    send_completions_seen_ = send_completions_;
    stuck_since_ = now;
  }
  if (activity_ != activity_seen_) {  // something moved since the last look: idle from now
    activity_seen_ = activity_;
    idle_since_ = now;
    return;
  }
  if (state_ != link_state::up || probe_in_flight_ || now - idle_since_ < keepalive_ ||
      sq_used_ >= sq_depth_) {
    return;
  }
  // A zero-byte RDMA WRITE needs no rkey (IBTA C9-88), consumes nothing at the peer and is
  // acknowledged by its HCA: a dead peer turns it into IBV_WC_RETRY_EXC_ERR.
  ibv_send_wr wr{};
  wr.wr_id = probe_slot_;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_.get(), &wr, &bad); rc != 0) {
    go_down_locked(make_error(errc::io, "rdma: post keepalive probe: {}", rdma::errno_text(rc)));
    return;
  }
  ++sq_used_;
  probe_in_flight_ = true;
  idle_since_ = now;
}

result<buffer_handle> endpoint::register_buffer(void* addr, std::size_t size) {
  if (addr == nullptr || size == 0) {
    return make_error(errc::invalid_argument, "rdma: register_buffer of an empty range ({}, {})",
                      addr, size);
  }
  std::lock_guard lock(mu_);
  if (state_ == link_state::down) return closed_error_locked();
  if (regs_.size() >= limits_.max_buffers) {
    return make_error(errc::no_capacity, "rdma: {} buffers registered already (max_buffers)",
                      regs_.size());
  }
  auto* begin = static_cast<std::byte*>(addr);
  registration reg{nullptr, begin, size, true};
  // Reuse: a range inside an existing memory region shares it (registration pins pages and costs
  // a system call; collectives register slices of one arena again and again).
  for (const auto& [id, other] : regs_) {
    auto* mr_begin = static_cast<std::byte*>(other.mr->addr);
    if (begin >= mr_begin && begin + size <= mr_begin + other.mr->length) {
      reg.mr = other.mr;
      reg.remote_writable = other.remote_writable;
      break;
    }
  }
  if (!reg.mr) {
    ibv_mr* mr = ibv_reg_mr(pd_.get(), addr, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (mr == nullptr && (errno == EFAULT || errno == EACCES || errno == EPERM)) {
      // Read-only memory (a mapped model file) can still be the source of a write.
      mr = ibv_reg_mr(pd_.get(), addr, size, 0);
      reg.remote_writable = false;
    }
    if (mr == nullptr) {
      return make_error(errc::io, "rdma: {}: ibv_reg_mr of {} bytes at {}: {}", device_name_, size,
                        addr, rdma::errno_text(errno));
    }
    reg.mr.reset(mr, mr_deleter{});
  }
  while (next_handle_ == 0 || regs_.contains(next_handle_)) ++next_handle_;
  const std::uint32_t id = next_handle_++;
  regs_.emplace(id, std::move(reg));
  return buffer_handle{id};
}

result<void> endpoint::deregister_buffer(buffer_handle handle) {
  std::lock_guard lock(mu_);
  if (regs_.erase(handle.id) == 0) {
    return make_error(errc::invalid_argument, "rdma: buffer handle {} is not registered", handle.id);
  }
  return ok();
}

result<remote_buffer> endpoint::describe(buffer_handle handle) const {
  std::lock_guard lock(mu_);
  auto it = regs_.find(handle.id);
  if (it == regs_.end()) {
    return make_error(errc::invalid_argument, "rdma: buffer handle {} is not registered", handle.id);
  }
  if (!it->second.remote_writable) {
    return make_error(errc::invalid_argument,
                      "rdma: buffer handle {} is read-only memory: it can be a write source only",
                      handle.id);
  }
  return remote_buffer{handle.id, reinterpret_cast<std::uintptr_t>(it->second.addr),
                       it->second.mr->rkey, it->second.size};
}

const registration* endpoint::check_write_locked(buffer_handle local, std::uint64_t local_offset,
                                                const remote_buffer& remote,
                                                std::uint64_t remote_offset, std::uint64_t bytes,
                                                error& why) const {
  auto it = regs_.find(local.id);
  if (it == regs_.end()) {
    why = make_error(errc::invalid_argument, "rdma: write from unregistered buffer handle {}",
                     local.id);
    return nullptr;
  }
  const registration& reg = it->second;
  if (local_offset > reg.size || bytes > reg.size - local_offset) {
    why = make_error(errc::invalid_argument,
                     "rdma: write source [{}, +{}) outside local buffer {} of {} bytes",
                     local_offset, bytes, local.id, reg.size);
    return nullptr;
  }
  if (remote_offset > remote.size || bytes > remote.size - remote_offset) {
    why = make_error(errc::invalid_argument,
                     "rdma: write target [{}, +{}) outside remote buffer {} of {} bytes",
                     remote_offset, bytes, remote.id, remote.size);
    return nullptr;
  }
  if (bytes > limits_.max_write_bytes) {
    why = make_error(errc::invalid_argument, "rdma: write of {} bytes > max_write_bytes {}", bytes,
                     limits_.max_write_bytes);
    return nullptr;
  }
  return &reg;
}

std::uint32_t endpoint::write_wr_count(std::uint64_t bytes) const noexcept {
  const std::uint64_t chunks = rdma::chunk_count(bytes, max_msg_bytes_);
  return static_cast<std::uint32_t>(chunks == 1 ? 1 : chunks + 1);
}

void endpoint::fill_write_wrs(std::uint32_t slot, const registration& reg,
                              std::uint64_t local_offset, const remote_buffer& remote,
                              std::uint64_t remote_offset, std::uint64_t bytes, std::uint32_t imm,
                              ibv_send_wr* wr, ibv_sge* sge) {
  const std::uint64_t chunks = rdma::chunk_count(bytes, max_msg_bytes_);
  const std::uint32_t wrs = write_wr_count(bytes);
  for (std::uint64_t i = 0; i < chunks; ++i) {
    const std::uint64_t off = i * max_msg_bytes_;
    const std::uint64_t len = std::min<std::uint64_t>(bytes - std::min(bytes, off), max_msg_bytes_);
    sge[i].addr = reinterpret_cast<std::uintptr_t>(reg.addr + local_offset + off);
    sge[i].length = static_cast<std::uint32_t>(len);
    sge[i].lkey = reg.mr->lkey;
    wr[i] = ibv_send_wr{};
    wr[i].wr_id = slot;
    wr[i].sg_list = &sge[i];
    wr[i].num_sge = len == 0 ? 0 : 1;
    wr[i].opcode = IBV_WR_RDMA_WRITE;
    wr[i].wr.rdma.remote_addr = remote.addr + remote_offset + off;
    wr[i].wr.rdma.rkey = remote.rkey;
    if (i + 1 < wrs) wr[i].next = &wr[i + 1];
  }
  if (chunks == 1) {
    wr[0].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr[0].imm_data = htonl(imm);
    wr[0].send_flags = signaled_flags(bytes);
  } else {
    // Longer than one message: the notice SEND after the last chunk carries {imm, total}.
    std::byte* note = staging(slot);
    std::memcpy(note, &imm, 4);
    std::memcpy(note + 4, &bytes, 8);
    ibv_send_wr& n = wr[wrs - 1];
    n = ibv_send_wr{};
    sge[wrs - 1] = ibv_sge{reinterpret_cast<std::uintptr_t>(note), notice_bytes, send_mr_->lkey};
    n.wr_id = slot;
    n.sg_list = &sge[wrs - 1];
    n.num_sge = 1;
    n.opcode = IBV_WR_SEND_WITH_IMM;
    n.imm_data = htonl(static_cast<std::uint32_t>(ctl::write_notice));
    n.send_flags = signaled_flags(notice_bytes);
  }
}

result<void> endpoint::write_with_imm(buffer_handle local, std::uint64_t local_offset,
                                      const remote_buffer& remote, std::uint64_t remote_offset,
                                      std::uint64_t bytes, std::uint32_t imm, std::uint64_t wr_id) {
  std::lock_guard lock(mu_);
  if (state_ != link_state::up) return closed_error_locked();
  error why;
  const registration* reg = check_write_locked(local, local_offset, remote, remote_offset, bytes,
                                               why);
  if (reg == nullptr) return why;
  const std::uint32_t wrs = write_wr_count(bytes);
  if (outstanding_ >= limits_.max_outstanding || sq_used_ + wrs > sq_depth_) {
    return make_error(errc::overloaded, "rdma: {} operations outstanding (max_outstanding {})",
                      outstanding_, limits_.max_outstanding);
  }
  const std::uint32_t slot = *take_slot();  // outstanding_ < max: a slot is free
  // Work requests on the stack for the common case; only long chunked writes allocate.
  std::array<ibv_send_wr, 4> wr_small{};
  std::array<ibv_sge, 4> sge_small{};
  std::vector<ibv_send_wr> wr_big;
  std::vector<ibv_sge> sge_big;
  if (wrs > wr_small.size()) {
    wr_big.resize(wrs);
    sge_big.resize(wrs);
  }
  ibv_send_wr* wr = wrs > wr_small.size() ? wr_big.data() : wr_small.data();
  ibv_sge* sge = wrs > wr_small.size() ? sge_big.data() : sge_small.data();
  fill_write_wrs(slot, *reg, local_offset, remote, remote_offset, bytes, imm, wr, sge);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_.get(), wr, &bad); rc != 0) {
    release_slot(slot);
    return make_error(errc::io, "rdma: ibv_post_send (write of {} bytes): {}", bytes,
                      rdma::errno_text(rc));
  }
  ops_[slot] = pending_op{true, completion_kind::write_done, wr_id, bytes, wrs};
  ++outstanding_;
  sq_used_ += wrs;
  return ok();
}

result<void> endpoint::post_writes(std::span<const write_request> writes) {
  if (writes.empty()) return ok();
  if (writes.size() > limits_.max_outstanding) {
    return make_error(errc::invalid_argument,
                      "post_writes: {} writes in one list exceed max_outstanding ({})",
                      writes.size(), limits_.max_outstanding);
  }
  std::lock_guard lock(mu_);
  if (state_ != link_state::up) return closed_error_locked();
  std::vector<const registration*> regs(writes.size());
  std::uint32_t wrs = 0;
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const write_request& w = writes[i];
    error why;
    regs[i] = check_write_locked(w.local, w.local_offset, w.remote, w.remote_offset, w.bytes, why);
    if (regs[i] == nullptr) {
      return make_error(why.code, "post_writes: write {}: {}", i, why.message);
    }
    wrs += write_wr_count(w.bytes);
  }
  if (wrs > sq_depth_) {
    return make_error(errc::invalid_argument,
                      "post_writes: the list takes {} work requests, the send queue holds {}", wrs,
                      sq_depth_);
  }
  if (outstanding_ + writes.size() > limits_.max_outstanding || sq_used_ + wrs > sq_depth_) {
    return make_error(errc::overloaded,
                      "rdma: {} operations outstanding, {} more do not fit (max_outstanding {})",
                      outstanding_, writes.size(), limits_.max_outstanding);
  }
  // One chain, one ibv_post_send: one doorbell for the list (what it is for).
  std::vector<ibv_send_wr> wr(wrs);
  std::vector<ibv_sge> sge(wrs);
  std::vector<std::uint32_t> slots(writes.size());
  std::uint32_t at = 0;
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const write_request& w = writes[i];
    slots[i] = *take_slot();  // outstanding_ + size <= max: slots are free
    fill_write_wrs(slots[i], *regs[i], w.local_offset, w.remote, w.remote_offset, w.bytes, w.imm,
                   &wr[at], &sge[at]);
    at += write_wr_count(w.bytes);
    if (at < wrs) wr[at - 1].next = &wr[at];
  }
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_.get(), wr.data(), &bad);
  if (rc != 0 && bad == wr.data()) {
    for (std::uint32_t slot : slots) release_slot(slot);
    return make_error(errc::io, "rdma: ibv_post_send (list of {} writes): {}", writes.size(),
                      rdma::errno_text(rc));
  }
  // Writes wholly before `bad` (all of them when the post succeeded) are in flight: account them.
  // One cut inside the list leaves the queue pair with part of a list (maybe part of a chunked
  // write) that no caller can reason about: the link goes down, which flushes what was posted
  // with errors, and the rest was never posted.
  at = 0;
  std::size_t posted = writes.size();
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const std::uint32_t n = write_wr_count(writes[i].bytes);
    const bool whole = rc == 0 || &wr[at + n - 1] < bad;
    if (!whole && posted == writes.size()) posted = i;
    if (i >= posted) {
      release_slot(slots[i]);
    } else {
      ops_[slots[i]] = pending_op{true, completion_kind::write_done, writes[i].wr_id,
                                  writes[i].bytes, n};
      ++outstanding_;
      sq_used_ += n;
    }
    at += n;
  }
  if (rc != 0) {
    auto cause = make_error(errc::io, "rdma: ibv_post_send took {} of a list of {} writes: {}",
                            posted, writes.size(), rdma::errno_text(rc));
    go_down_locked(cause);
    return make_error(errc::closed, "bulk link is down: {}", cause.describe());
  }
  return ok();
}

result<void> endpoint::send(std::span<const std::byte> message, std::uint64_t wr_id) {
  std::lock_guard lock(mu_);
  if (state_ != link_state::up) return closed_error_locked();
  if (message.size() > limits_.max_send_bytes) {
    return make_error(errc::invalid_argument, "rdma: send of {} bytes > max_send_bytes {}",
                      message.size(), limits_.max_send_bytes);
  }
  if (outstanding_ >= limits_.max_outstanding || sq_used_ + 1 > sq_depth_) {
    return make_error(errc::overloaded, "rdma: {} operations outstanding (max_outstanding {})",
                      outstanding_, limits_.max_outstanding);
  }
  const std::uint32_t slot = *take_slot();
  std::byte* buf = staging(slot);
  if (!message.empty()) std::memcpy(buf, message.data(), message.size());
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), static_cast<std::uint32_t>(message.size()),
              send_mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = message.empty() ? nullptr : &sge;
  wr.num_sge = message.empty() ? 0 : 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(static_cast<std::uint32_t>(ctl::user));
  wr.send_flags = signaled_flags(message.size());
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_.get(), &wr, &bad); rc != 0) {
    release_slot(slot);
    return make_error(errc::io, "rdma: ibv_post_send (send of {} bytes): {}", message.size(),
                      rdma::errno_text(rc));
  }
  ops_[slot] = pending_op{true, completion_kind::send_done, wr_id, message.size(), 1};
  ++outstanding_;
  ++sq_used_;
  return ok();
}

std::size_t endpoint::poll(std::span<completion> out) {
  std::lock_guard lock(mu_);
  if (state_ != link_state::down) {
    drain_locked();
    // A caller that only polls still gets dead-peer detection on an idle link; the clock is read
    // once per 1024 empty polls, not on the hot path.
    if (ready_.empty() && ++empty_polls_ % 1024 == 0) maybe_probe_locked(clock_type::now());
  }
  return hand_out_locked(out);
}

result<std::size_t> endpoint::wait(std::span<completion> out, std::chrono::microseconds timeout) {
  {
    // Completions already there: hand them out without reading the clock.
    std::lock_guard lock(mu_);
    if (link_down_delivered_ && ready_.empty()) return closed_error_locked();
    if (state_ != link_state::down) drain_locked();
    if (std::size_t n = hand_out_locked(out); n > 0) return n;
  }
  const auto start = clock_type::now();
  const auto deadline = start + timeout;
  const auto spin_until = start + std::chrono::microseconds(options_.spin_us);
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (link_down_delivered_ && ready_.empty()) return closed_error_locked();
      if (state_ != link_state::down) drain_locked();
      if (std::size_t n = hand_out_locked(out); n > 0) return n;
    }
    const auto now = clock_type::now();
    if (now >= deadline) return std::size_t{0};
    if (now < spin_until) continue;
    {
      std::lock_guard lock(mu_);
      maybe_probe_locked(now);
    }
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    const auto slice = std::min<std::chrono::microseconds>(
        left, std::chrono::duration_cast<std::chrono::microseconds>(keepalive_));
    block(slice, [&] { return !ready_.empty(); });
  }
}

void endpoint::close() {
  std::unique_lock lock(mu_);
  if (state_ == link_state::up && sq_used_ < sq_depth_ &&
      post_control(ctl::bye, {}) == 0) {
    // Let the bye reach the peer so it learns now rather than by its next timeout; bounded.
    lock.unlock();
    const auto deadline = clock_type::now() + std::min<std::chrono::milliseconds>(
                                                  options_.peer_timeout_ms, 1000ms);
    for (;;) {
      {
        std::lock_guard relock(mu_);
        drain_locked();
        if (control_status_ || state_ == link_state::down) break;
      }
      const auto now = clock_type::now();
      if (now >= deadline) break;
      block(std::chrono::duration_cast<std::chrono::microseconds>(deadline - now),
            [&] { return control_status_.has_value() || state_ == link_state::down; });
    }
    lock.lock();
  }
  go_down_locked(make_error(errc::closed, "rdma: the link was closed locally"));
}

endpoint::~endpoint() {
  if (qp_) close();
}

}  // namespace tessera::transport::bulk::rdma_ep
