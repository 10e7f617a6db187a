// The rdma backend's inside: the verbs helpers (device lists, port queries) and the `endpoint`
// that every link owns (its verbs objects, buffers, pending operations and completions). rdma.cpp
// has the pure parts, the device listing and the link; rdma_endpoint.cpp the endpoint's set-up
// (device, verbs objects, queue pair states, the hello); rdma_datapath.cpp its data path
// (registrations, writes, sends, completions, keepalive, close). Internal to transport/bulk.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <thread>

#include "actors/base/log.hpp"
#include "transport/bulk/backends.hpp"
#include "transport/bulk/link.hpp"
#include "transport/bulk/rdma.hpp"

namespace tessera::transport::bulk {
namespace rdma {

struct device_list_deleter {
  void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};
using device_list = std::unique_ptr<ibv_device*, device_list_deleter>;

struct context_deleter {
  void operator()(ibv_context* c) const noexcept { ibv_close_device(c); }
};
using context_ptr = std::unique_ptr<ibv_context, context_deleter>;

inline std::string errno_text(int err) { return std::strerror(err); }

inline result<port_info> query_port(ibv_context* ctx, std::uint8_t port) {
  ibv_port_attr attr{};
  if (int rc = ibv_query_port(ctx, port, &attr); rc != 0) {
    return make_error(errc::io, "{}: ibv_query_port({}): {}", ibv_get_device_name(ctx->device),
                      port, errno_text(rc));
  }
  port_info info;
  info.port = port;
  info.active = attr.state == IBV_PORT_ACTIVE;
  info.active_mtu = static_cast<std::uint8_t>(attr.active_mtu);
  info.lid = attr.lid;
  info.max_msg_bytes = attr.max_msg_sz;
  info.ethernet = attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid_entry entry{};
    // Empty slots answer ENODATA; the table is sparse, so keep reading.
    if (ibv_query_gid_ex(ctx, port, static_cast<std::uint32_t>(i), &entry, 0) != 0) continue;
    gid_entry g;
    g.index = entry.gid_index;
    g.type = entry.gid_type;
    std::memcpy(g.gid.data(), entry.gid.raw, 16);
    info.gids.push_back(g);
  }
  return info;
}

inline result<device_info> query_device(ibv_context* ctx) {
  ibv_device_attr attr{};
  if (int rc = ibv_query_device(ctx, &attr); rc != 0) {
    return make_error(errc::io, "{}: ibv_query_device: {}", ibv_get_device_name(ctx->device),
                      errno_text(rc));
  }
  device_info info;
  info.name = ibv_get_device_name(ctx->device);
  info.node_guid = be64toh(attr.node_guid);
  for (std::uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
    auto port = query_port(ctx, p);
    if (!port) return std::move(port).error();
    info.ports.push_back(std::move(*port));
  }
  return info;
}

}  // namespace rdma

namespace rdma_ep {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Immediates of SENDs say what the message is. User messages never see these.
enum class ctl : std::uint32_t { user = 0, hello = 1, bye = 2, write_notice = 3 };
inline constexpr std::size_t notice_bytes = 12;   // {imm u32, total bytes u64}
inline constexpr std::size_t hello_bytes = 8;     // the sender's nonce
inline constexpr std::uint32_t wanted_inline_bytes = 220;  // perftest's default for latency tests
// 6, not the IB maximum 7: rxe (and some HCAs) read retry_cnt 7 as "retry forever", which turns a
// dead peer into a hang. The ack timeout scales the budget instead.
inline constexpr std::uint8_t retry_cnt = 6;
// The responder's HCA asks a sender to retry while its receive queue is empty (backpressure from
// an owner that polls late). 7 retries without end at the HCA; the bound is the link's own
// deadline on posted work (maybe_probe_locked), which is peer_timeout_ms as link.hpp promises:
// a finite count (at most 7 x 655 ms) could not express a 10 s timeout.
inline constexpr std::uint8_t rnr_retry_infinite = 7;
inline constexpr std::uint32_t max_rq_depth = 64;  // receives kept posted (each max_send_bytes)

struct mr_deleter {
  void operator()(ibv_mr* mr) const noexcept { ibv_dereg_mr(mr); }
};
struct pd_deleter {
  void operator()(ibv_pd* pd) const noexcept { ibv_dealloc_pd(pd); }
};
struct channel_deleter {
  void operator()(ibv_comp_channel* ch) const noexcept { ibv_destroy_comp_channel(ch); }
};
struct cq_deleter {
  void operator()(ibv_cq* cq) const noexcept { ibv_destroy_cq(cq); }
};
struct qp_deleter {
  void operator()(ibv_qp* qp) const noexcept { ibv_destroy_qp(qp); }
};
struct free_deleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};

inline std::string wc_text(const ibv_wc& wc) {
  return fmt::format("{} (status {}, vendor error {:#x})", ibv_wc_status_str(wc.status),
                     static_cast<int>(wc.status), wc.vendor_err);
}

// A pending local operation, indexed by its slot (the wr_id of its signaled WR). Slot i also owns
// send staging buffer i.
struct pending_op {
  bool busy = false;
  completion_kind kind = completion_kind::write_done;
  std::uint64_t user_wr_id = 0;
  std::uint64_t bytes = 0;
  std::uint32_t wrs = 0;  // SQ entries it holds until its signaled WR completes
};

// A local registration: a handle names a range inside a (possibly shared) memory region.
struct registration {
  std::shared_ptr<ibv_mr> mr;
  std::byte* addr = nullptr;
  std::uint64_t size = 0;
  bool remote_writable = true;
};

enum class link_state { connecting, up, down };

// Everything a link owns: verbs objects, buffers, pending operations and the queue of completions
// that poll() hands out. Built by prepare_rdma_link(), finished by connect(), then owned by
// rdma_link. All bookkeeping is under mu_; only the blocking ppoll() runs without it.

class endpoint {
 public:
  static result<std::unique_ptr<endpoint>> open(const link_options& options);
  ~endpoint();
  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;

  const connect_params& local_params() const noexcept { return local_; }
  result<void> connect(const connect_params& remote);

  const link_limits& limits() const noexcept { return limits_; }
  result<buffer_handle> register_buffer(void* addr, std::size_t size);
  result<void> deregister_buffer(buffer_handle handle);
  result<remote_buffer> describe(buffer_handle handle) const;
  result<void> write_with_imm(buffer_handle local, std::uint64_t local_offset,
                              const remote_buffer& remote, std::uint64_t remote_offset,
                              std::uint64_t bytes, std::uint32_t imm, std::uint64_t wr_id);
  result<void> post_writes(std::span<const write_request> writes);
  result<void> send(std::span<const std::byte> message, std::uint64_t wr_id);
  std::size_t poll(std::span<completion> out);
  result<std::size_t> wait(std::span<completion> out, std::chrono::microseconds timeout);
  bool is_up() const noexcept { return up_.load(std::memory_order_acquire); }
  void close();

 private:
  endpoint() = default;
  result<void> open_device(const link_options& options);
  result<void> create_verbs();
  result<void> to_init();
  result<void> to_rtr_rts(const connect_params& remote);
  result<void> post_all_receives();
  int post_receive(std::uint32_t slot);
  int post_control(ctl type, std::span<const std::byte> payload);
  // `local`'s registration when write_with_imm() would accept the write, else nullptr and `why`.
  const registration* check_write_locked(buffer_handle local, std::uint64_t local_offset,
                                         const remote_buffer& remote, std::uint64_t remote_offset,
                                         std::uint64_t bytes, error& why) const;
  // Send-queue entries one write takes: one, or its chunks and the notice after them.
  std::uint32_t write_wr_count(std::uint64_t bytes) const noexcept;
  // Fills write_wr_count(bytes) work requests (linked among themselves, the last one's `next`
  // left null) and their scatter entries for one write held by `slot`.
  void fill_write_wrs(std::uint32_t slot, const registration& reg, std::uint64_t local_offset,
                      const remote_buffer& remote, std::uint64_t remote_offset,
                      std::uint64_t bytes, std::uint32_t imm, ibv_send_wr* wr, ibv_sge* sge);
  std::optional<std::uint32_t> take_slot();
  void release_slot(std::uint32_t slot);
  std::byte* staging(std::uint32_t slot) const noexcept {
    return send_mem_.get() + static_cast<std::size_t>(slot) * slot_bytes_;
  }
  void drain_locked();
  void on_send_wc(const ibv_wc& wc);
  void on_recv_wc(const ibv_wc& wc);
  error wc_error(const ibv_wc& wc, std::string_view what) const;
  void go_down_locked(error cause);
  std::size_t hand_out_locked(std::span<completion> out);
  error closed_error_locked() const;
  void maybe_probe_locked(clock_type::time_point now);
  template <class Pred>
  void block(std::chrono::microseconds max, Pred&& done);

  link_limits limits_;
  link_options options_;
  connect_params local_;
  connect_params remote_;
  std::string device_name_;
  std::uint32_t gid_index_ = 0;
  std::uint8_t port_ = 1;
  bool ethernet_ = true;
  std::uint8_t active_mtu_ = IBV_MTU_1024;
  std::uint64_t max_msg_bytes_ = 0;
  std::uint32_t sq_depth_ = 0;
  // Payloads up to this many bytes travel inside the work request (IBV_SEND_INLINE): the HCA
  // (Soft-RoCE: the kernel) takes them from the WQE instead of reading them through the memory
  // region. 0 when the device offers none.
  std::uint32_t max_inline_ = 0;
  /// Flags of a signaled WR carrying `bytes`: inline when they fit.
  [[nodiscard]] unsigned signaled_flags(std::size_t bytes) const noexcept {
    return IBV_SEND_SIGNALED | (bytes <= max_inline_ ? unsigned{IBV_SEND_INLINE} : 0u);
  }
  std::uint32_t rq_depth_ = 0;
  std::size_t slot_bytes_ = 0;
  std::uint32_t probe_slot_ = 0;    // == max_outstanding
  std::uint32_t control_slot_ = 0;  // == max_outstanding + 1 (hello, bye)
  clock_type::duration keepalive_{};

  // Declaration order is teardown order reversed: the QP goes first, then MRs, memory, CQs, the
  // channel, the PD and the device context.
  rdma::context_ptr ctx_;
  std::unique_ptr<ibv_pd, pd_deleter> pd_;
  std::unique_ptr<ibv_comp_channel, channel_deleter> channel_;
  std::unique_ptr<ibv_cq, cq_deleter> send_cq_;
  std::unique_ptr<ibv_cq, cq_deleter> recv_cq_;
  std::unique_ptr<std::byte, free_deleter> recv_mem_;
  std::unique_ptr<std::byte, free_deleter> send_mem_;
  std::unique_ptr<ibv_mr, mr_deleter> recv_mr_;
  std::unique_ptr<ibv_mr, mr_deleter> send_mr_;
  std::map<std::uint32_t, registration> regs_;
  std::unique_ptr<ibv_qp, qp_deleter> qp_;

  mutable std::mutex mu_;
  std::atomic<bool> up_{false};
  link_state state_ = link_state::connecting;
  std::optional<error> down_cause_;
  bool link_down_delivered_ = false;
  std::vector<pending_op> ops_;
  std::vector<std::uint32_t> free_slots_;
  std::uint32_t outstanding_ = 0;
  std::uint32_t sq_used_ = 0;
  std::deque<completion> ready_;
  std::uint32_t received_queued_ = 0;
  std::uint32_t next_handle_ = 1;
  bool probe_in_flight_ = false;
  std::uint64_t activity_ = 0;       // completions seen (bumped per drain that found any)
  std::uint64_t activity_seen_ = 0;  // activity_ when idle_since_ was taken
  clock_type::time_point idle_since_{};
  std::uint32_t empty_polls_ = 0;
  // The link's own deadline for posted work (link.hpp: backpressure never longer than
  // peer_timeout_ms). Send-queue completions counted, and since when none came while work was
  // posted: a peer that is alive but does not read answers RNR NAKs, retried without end at
  // rnr_retry 7, and its HCA still acknowledges nothing else behind them (the queue is in order).
  std::uint64_t send_completions_ = 0;
  std::uint64_t send_completions_seen_ = 0;
  clock_type::time_point stuck_since_{};
  // handshake
  bool hello_received_ = false;
  std::optional<ibv_wc_status> control_status_;
};

template <class Pred>
void endpoint::block(std::chrono::microseconds max, Pred&& done) {
  {
    std::lock_guard lock(mu_);
    // Arm first, then look: a completion that lands between the two is seen by the drain, one
    // that lands after it raises an event on the channel.
    ibv_req_notify_cq(send_cq_.get(), 0);
    ibv_req_notify_cq(recv_cq_.get(), 0);
    drain_locked();
    if (done()) return;
  }
  pollfd pfd{channel_->fd, POLLIN, 0};
  const auto us = std::max<std::int64_t>(max.count(), 0);
  timespec ts{static_cast<time_t>(us / 1'000'000), static_cast<long>(us % 1'000'000) * 1000};
  if (ppoll(&pfd, 1, &ts, nullptr) > 0) {
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    while (ibv_get_cq_event(channel_.get(), &cq, &cq_context) == 0) ibv_ack_cq_events(cq, 1);
  }
}

}  // namespace rdma_ep
}  // namespace tessera::transport::bulk
