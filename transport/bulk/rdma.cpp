// The rdma bulk backend. Design and state diagram: rdma.hpp; shared semantics: link.hpp.
#include "transport/bulk/rdma.hpp"

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
#include <optional>
#include <memory>
#include <mutex>
#include <thread>

#include "actors/base/log.hpp"
#include "transport/bulk/backends.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::transport::bulk {
namespace rdma {

bool gid_entry::ipv4_mapped() const noexcept {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return false;
  }
  return gid[10] == 0xff && gid[11] == 0xff;
}

bool gid_entry::link_local() const noexcept { return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80; }

result<std::uint32_t> pick_gid(std::span<const gid_entry> gids, bool ethernet,
                               const std::string& prefer_ipv4) {
  if (!ethernet) {
    for (const auto& g : gids) {
      if (g.index == 0) return g.index;
    }
    return make_error(errc::not_found, "InfiniBand port has no GID at index 0");
  }
  // A host with several addressed netdevs under RDMA devices: the GID of the address peers were
  // told (the same one the control plane and tcp links use) is the one whose route reaches them.
  in_addr want{};
  if (!prefer_ipv4.empty() && ::inet_pton(AF_INET, prefer_ipv4.c_str(), &want) == 1) {
    for (const auto& g : gids) {
      if (g.type == gid_type_roce_v2 && g.ipv4_mapped() &&
          std::memcmp(g.gid.data() + 12, &want.s_addr, 4) == 0)
        return g.index;
    }
  }
  for (const auto& g : gids) {
    if (g.type == gid_type_roce_v2 && g.ipv4_mapped()) return g.index;
  }
  for (const auto& g : gids) {
    if (g.type == gid_type_roce_v2 && !g.link_local()) return g.index;
  }
  return make_error(errc::not_found,
                    "no RoCE v2 GID with an IPv4 or global IPv6 address among {} entries (is the "
                    "netdev under the RDMA device up and addressed?)",
                    gids.size());
}

std::string format_gid(std::span<const std::uint8_t> gid) {
  if (gid.size() != 16) return fmt::format("<gid of {} bytes>", gid.size());
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.data(), text, sizeof text) == nullptr) return "<bad gid>";
  return text;
}

std::uint8_t ack_timeout_exponent(std::chrono::milliseconds peer_timeout,
                                  std::uint8_t retry_cnt) noexcept {
  const double per_try_us =
      static_cast<double>(std::max<std::int64_t>(peer_timeout.count(), 1)) * 1000.0 /
      (static_cast<double>(retry_cnt) + 1.0);
  std::uint8_t t = 10;
  while (t < 22 && 4.096 * static_cast<double>(1ull << (t + 1)) <= per_try_us) ++t;
  return t;
}

std::uint64_t chunk_count(std::uint64_t bytes, std::uint64_t max_msg_bytes) noexcept {
  if (bytes == 0 || max_msg_bytes == 0) return 1;
  return (bytes + max_msg_bytes - 1) / max_msg_bytes;
}

namespace {

struct device_list_deleter {
  void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};
using device_list = std::unique_ptr<ibv_device*, device_list_deleter>;

struct context_deleter {
  void operator()(ibv_context* c) const noexcept { ibv_close_device(c); }
};
using context_ptr = std::unique_ptr<ibv_context, context_deleter>;

std::string errno_text(int err) { return std::strerror(err); }

result<port_info> query_port(ibv_context* ctx, std::uint8_t port) {
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

result<device_info> query_device(ibv_context* ctx) {
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

}  // namespace

result<std::vector<device_info>> list_devices() {
  int count = 0;
  device_list list(ibv_get_device_list(&count));
  std::vector<device_info> out;
  if (!list) {
    // ENOSYS: no kernel support at all, which is "no devices" rather than a failure.
    if (errno == ENOSYS || errno == ENOENT) return out;
    return make_error(errc::io, "ibv_get_device_list: {}", errno_text(errno));
  }
  for (int i = 0; i < count; ++i) {
    context_ptr ctx(ibv_open_device(list.get()[i]));
    if (!ctx) {
      return make_error(errc::io, "{}: ibv_open_device: {}",
                        ibv_get_device_name(list.get()[i]), errno_text(errno));
    }
    auto info = query_device(ctx.get());
    if (!info) return std::move(info).error();
    out.push_back(std::move(*info));
  }
  return out;
}

}  // namespace rdma

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Immediates of SENDs say what the message is. User messages never see these.
enum class ctl : std::uint32_t { user = 0, hello = 1, bye = 2, write_notice = 3 };
constexpr std::size_t notice_bytes = 12;   // {imm u32, total bytes u64}
constexpr std::size_t hello_bytes = 8;     // the sender's nonce
constexpr std::uint32_t wanted_inline_bytes = 220;  // perftest's default for latency tests
// 6, not the IB maximum 7: rxe (and some HCAs) read retry_cnt 7 as "retry forever", which turns a
// dead peer into a hang. The ack timeout scales the budget instead.
constexpr std::uint8_t retry_cnt = 6;
// The responder's HCA asks a sender to retry while its receive queue is empty (backpressure from
// an owner that polls late). 7 retries without end at the HCA; the bound is the link's own
// deadline on posted work (maybe_probe_locked), which is peer_timeout_ms as link.hpp promises:
// a finite count (at most 7 x 655 ms) could not express a 10 s timeout.
constexpr std::uint8_t rnr_retry_infinite = 7;
constexpr std::uint32_t max_rq_depth = 64;  // receives kept posted (each max_send_bytes)

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

std::string wc_text(const ibv_wc& wc) {
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

class rdma_link final : public link {
 public:
  explicit rdma_link(std::unique_ptr<endpoint> ep) : ep_(std::move(ep)) {}
  backend_kind kind() const noexcept override { return backend_kind::rdma; }
  const link_limits& limits() const noexcept override { return ep_->limits(); }
  result<buffer_handle> register_buffer(void* addr, std::size_t size) override {
    return ep_->register_buffer(addr, size);
  }
  using link::register_buffer;
  result<void> deregister_buffer(buffer_handle handle) override {
    return ep_->deregister_buffer(handle);
  }
  result<remote_buffer> describe(buffer_handle handle) const override {
    return ep_->describe(handle);
  }
  result<void> write_with_imm(buffer_handle local, std::uint64_t local_offset,
                              const remote_buffer& remote, std::uint64_t remote_offset,
                              std::uint64_t bytes, std::uint32_t imm, std::uint64_t wr_id) override {
    return ep_->write_with_imm(local, local_offset, remote, remote_offset, bytes, imm, wr_id);
  }
  result<void> post_writes(std::span<const write_request> writes) override {
    return ep_->post_writes(writes);
  }
  result<void> send(std::span<const std::byte> message, std::uint64_t wr_id) override {
    return ep_->send(message, wr_id);
  }
  std::size_t poll(std::span<completion> out) override { return ep_->poll(out); }
  result<std::size_t> wait(std::span<completion> out, std::chrono::microseconds timeout) override {
    return ep_->wait(out, timeout);
  }
  bool is_up() const noexcept override { return ep_->is_up(); }
  void close() override { ep_->close(); }

 private:
  std::unique_ptr<endpoint> ep_;
};

class rdma_setup final : public link_setup {
 public:
  explicit rdma_setup(std::unique_ptr<endpoint> ep)
      : params_(ep->local_params()), ep_(std::move(ep)) {}
  // A copy: still valid after connect() has handed the endpoint to the link.
  const connect_params& local_params() const noexcept override { return params_; }
  result<std::unique_ptr<link>> connect(const connect_params& remote) override {
    if (!ep_) return make_error(errc::invalid_argument, "rdma: connect() called twice");
    std::unique_ptr<endpoint> ep = std::move(ep_);
    TESSERA_TRY(ep->connect(remote));
    return std::unique_ptr<link>(std::make_unique<rdma_link>(std::move(ep)));
  }

 private:
  connect_params params_;
  std::unique_ptr<endpoint> ep_;
};

}  // namespace

namespace detail {

result<std::unique_ptr<link_setup>> prepare_rdma_link(const link_options& options) {
  auto ep = endpoint::open(options);
  if (!ep) return std::move(ep).error();
  return std::unique_ptr<link_setup>(std::make_unique<rdma_setup>(std::move(*ep)));
}

bool rdma_device_available() {
  auto devices = rdma::list_devices();
  if (!devices) return false;
  for (const auto& d : *devices) {
    for (const auto& p : d.ports) {
      if (p.active) return true;
    }
  }
  return false;
}

std::vector<std::string> rdma_port_descriptions() {
  std::vector<std::string> out;
  auto devices = rdma::list_devices();
  if (!devices) return out;
  for (const auto& d : *devices)
    for (const auto& p : d.ports) {
      if (!p.active) continue;
      auto pick = rdma::pick_gid(p.gids, p.ethernet);
      if (!pick) {
        out.push_back(fmt::format("{}/{} (no usable GID)", d.name, p.port));
        continue;
      }
      for (const auto& g : p.gids) {
        if (g.index != *pick) continue;
        const char* type = g.type == rdma::gid_type_roce_v2   ? "RoCE v2"
                           : g.type == rdma::gid_type_roce_v1 ? "RoCE v1"
                                                              : "IB";
        out.push_back(fmt::format("{}/{} {} ({}, GID index {})", d.name, p.port,
                                  rdma::format_gid(g.gid), type, g.index));
      }
    }
  return out;
}

}  // namespace detail
}  // namespace tessera::transport::bulk
