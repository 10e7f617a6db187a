#include "transport/control/control_node.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <msgpack.hpp>
#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"
#include "transport/control/control_node_impl.hpp"

namespace tessera::transport::control {
using namespace node_detail;

std::string_view to_string(peer_event_kind k) noexcept {
  switch (k) {
    case peer_event_kind::up: return "up";
    case peer_event_kind::down: return "down";
    case peer_event_kind::restarted: return "restarted";
  }
  return "unknown";
}

std::uint64_t control_stats::rejected_total() const {
  std::uint64_t n = 0;
  for (auto r : rejected) n += r;
  return n;
}

control_node::control_node(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

control_node::~control_node() { stop(); }

result<std::unique_ptr<control_node>> control_node::start(node_config cfg,
                                                          node_handlers handlers) {
  if (!is_valid_node_id(cfg.node_id)) {
    return make_error(errc::invalid_argument,
                      "node id '{}' is not 1..{} characters of [A-Za-z0-9._-]", cfg.node_id,
                      kMaxNodeIdLen);
  }
  if (!is_valid_endpoint(cfg.bind_endpoint)) {
    return make_error(errc::invalid_argument, "bind endpoint '{}' is not tcp://, ipc:// or inproc://",
                      cfg.bind_endpoint);
  }
  if (!cfg.advertise_endpoint.empty() && !is_valid_endpoint(cfg.advertise_endpoint)) {
    return make_error(errc::invalid_argument, "advertise endpoint '{}' is not valid",
                      cfg.advertise_endpoint);
  }
  if (cfg.limits.max_frame_size > kHardMaxFrameSize || cfg.limits.max_frame_size < 256 ||
      cfg.limits.max_body_size + kHeaderSize > cfg.limits.max_frame_size) {
    return make_error(errc::invalid_argument,
                      "frame limits: need 256 <= max_frame_size ({}) <= {} and max_body_size ({}) "
                      "+ {} <= max_frame_size",
                      cfg.limits.max_frame_size, kHardMaxFrameSize, cfg.limits.max_body_size,
                      kHeaderSize);
  }
  const auto& t = cfg.timing;
  if (t.heartbeat_interval_ms == 0 || t.dead_after_ms <= t.heartbeat_interval_ms ||
      t.backoff_min_ms == 0 || t.backoff_min_ms > t.backoff_max_ms) {
    return make_error(errc::invalid_argument,
                      "link timing: need dead_after_ms ({}) > heartbeat_interval_ms ({}) > 0 and "
                      "0 < backoff_min_ms ({}) <= backoff_max_ms ({})",
                      t.dead_after_ms, t.heartbeat_interval_ms, t.backoff_min_ms, t.backoff_max_ms);
  }
  if (cfg.send_queue_capacity == 0 || cfg.max_peers == 0) {
    return make_error(errc::invalid_argument, "send_queue_capacity and max_peers must be > 0");
  }
  // Create spdlog's registry (a lazy static in the shared library) here, before the I/O thread
  // logs for the first time: thread creation orders it for every node's thread.
  (void)spdlog::default_logger_raw();
  auto p = std::make_unique<impl>();
  if (cfg.seed == 0) {
    cfg.seed = static_cast<std::uint64_t>(
                   std::chrono::high_resolution_clock::now().time_since_epoch().count()) ^
               (static_cast<std::uint64_t>(::getpid()) << 32);
  }
  p->incarnation = cfg.seed * 0x9e3779b97f4a7c15ull + 1;
  p->cfg = std::move(cfg);
  p->handlers = std::move(handlers);
  p->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->wake_fd < 0) return make_error(errc::io, "eventfd: {}", std::strerror(errno));
  std::promise<result<void>> started;
  auto fut = started.get_future();
  impl* raw = p.get();
  p->io = std::thread([raw, &started] {
    name_this_thread("ctl-io");
    raw->run(started);
  });
  auto r = fut.get();
  if (!r) {
    p->io.join();
    return std::move(r).error();
  }
  return std::unique_ptr<control_node>(new control_node(std::move(p)));
}

void control_node::stop() {
  if (!impl_) return;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->stopping.store(true, std::memory_order_release);
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(impl_->wake_fd, &one, sizeof one);
  if (impl_->io.joinable()) impl_->io.join();
}

const std::string& control_node::node_id() const { return impl_->cfg.node_id; }
const std::string& control_node::endpoint() const { return impl_->endpoint; }

result<void> control_node::add_peer(std::string_view id, std::string_view endpoint) {
  if (!is_valid_node_id(id)) {
    return make_error(errc::invalid_argument, "peer id '{}' is not 1..{} characters of [A-Za-z0-9._-]",
                      id, kMaxNodeIdLen);
  }
  if (id == impl_->cfg.node_id) {
    return make_error(errc::invalid_argument, "peer id '{}' is this node's own id", id);
  }
  if (!is_valid_endpoint(endpoint)) {
    return make_error(errc::invalid_argument,
                      "endpoint '{}' of peer {} is not tcp://, ipc:// or inproc:// (max {} chars)",
                      endpoint, id, kMaxEndpointLen);
  }
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return make_error(errc::closed, "control node {} is stopped", node_id());
    auto it = impl_->out.find(id);
    if (it == impl_->out.end()) {
      if (impl_->out.size() >= impl_->cfg.max_peers) {
        return make_error(errc::no_capacity, "cannot add peer {}: {} peers is the limit", id,
                          impl_->cfg.max_peers);
      }
      impl_->out.emplace(std::string(id),
                         impl::out_queue{std::string(endpoint), {}, 1, link_state::connecting});
    } else {
      it->second.endpoint = std::string(endpoint);
    }
    impl_->commands.push_back({impl::command::add, std::string(id), std::string(endpoint)});
  }
  impl_->wake();
  return ok();
}

result<void> control_node::remove_peer(std::string_view id) {
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->out.find(id);
    if (it == impl_->out.end()) return make_error(errc::not_found, "no peer '{}'", id);
    impl_->out.erase(it);
    impl_->commands.push_back({impl::command::remove, std::string(id), {}});
  }
  impl_->wake();
  return ok();
}

result<void> control_node::send(std::string_view peer, std::uint16_t type,
                                std::span<const std::byte> body) {
  auto& s = *impl_;
  const bool fault_type = type == static_cast<std::uint16_t>(msg_type::fault_set) ||
                          type == static_cast<std::uint16_t>(msg_type::fault_clear);
  if (!is_known_type(type) ||
      (type < static_cast<std::uint16_t>(msg_type::actor_envelope) && !fault_type)) {
    return make_error(errc::invalid_argument,
                      "message type {} to {} is reserved or unknown (use actor_envelope, "
                      "fault_set/fault_clear or >= {})",
                      type, peer, static_cast<std::uint16_t>(msg_type::app_first));
  }
  if (!is_valid_msgpack_body(body, s.cfg.limits)) {
    return make_error(errc::invalid_argument,
                      "body of message type {} to {} is not one msgpack object within the limits",
                      type, peer);
  }
  frame_header h;
  h.type = type;
  h.epoch = s.epoch.load(std::memory_order_relaxed);
  h.incarnation = s.incarnation;
  h.sender = s.cfg.node_id;
  auto frame = encode_frame(h, body, s.cfg.limits);
  if (!frame) return std::move(frame).error();
  const bool on_io_thread = std::this_thread::get_id() == s.io_id;
  {
    std::lock_guard lock(s.mu);
    if (s.stopped) return make_error(errc::closed, "control node {} is stopped", s.cfg.node_id);
    auto it = s.out.find(peer);
    if (it == s.out.end()) return make_error(errc::not_found, "no peer '{}'", peer);
    auto& q = it->second;
    if (q.frames.size() >= s.cfg.send_queue_capacity) {
      bump(s.ctr.send_queue_full);
      return make_error(errc::overloaded, "send queue to {} is full ({} frames)", peer,
                        s.cfg.send_queue_capacity);
    }
    patch_seq(*frame, q.next_seq++);
    if (on_io_thread && q.frames.empty() && !s.cfg.faults.decide) {
      // From a handler with nothing queued ahead: straight to the socket, as flush() would do
      // next (the links are the I/O thread's, and this is it). Only a refusal is queued.
      auto link = s.links.find(peer);
      if (link != s.links.end() && s.write_frame(link->second, *frame)) return ok();
    }
    q.frames.push_back(std::move(*frame));
  }
  if (on_io_thread) {
    // Called from a handler: write straight to the socket, no wake-up round trip.
    auto it = s.links.find(peer);
    if (it != s.links.end()) s.flush(it->first, it->second);
  } else {
    s.wake();
  }
  return ok();
}

void control_node::set_epoch(std::uint64_t e) { impl_->epoch.store(e, std::memory_order_relaxed); }

control_stats control_node::stats() const {
  const auto& c = impl_->ctr;
  control_stats s;
  auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.frames_sent = ld(c.frames_sent);
  s.frames_received = ld(c.frames_received);
  s.bytes_sent = ld(c.bytes_sent);
  s.bytes_received = ld(c.bytes_received);
  s.messages_delivered = ld(c.messages_delivered);
  s.heartbeats_sent = ld(c.heartbeats_sent);
  s.heartbeats_received = ld(c.heartbeats_received);
  for (std::size_t i = 0; i < kRejectReasonCount; ++i) s.rejected[i] = ld(c.rejected[i]);
  s.duplicates_dropped = ld(c.duplicates_dropped);
  s.frames_missing = ld(c.frames_missing);
  s.send_queue_full = ld(c.send_queue_full);
  s.zap_allowed = ld(c.zap_allowed);
  s.zap_denied = ld(c.zap_denied);
  s.handshake_failed_inbound = ld(c.handshake_failed_inbound);
  s.handshake_failed_outbound = ld(c.handshake_failed_outbound);
  s.peer_up_events = ld(c.peer_up_events);
  s.peer_down_events = ld(c.peer_down_events);
  s.reconnects = ld(c.reconnects);
  s.deaf_reconnects = ld(c.deaf_reconnects);
  s.unknown_sender = ld(c.unknown_sender);
  s.fault_dropped = ld(c.fault_dropped);
  s.fault_delayed = ld(c.fault_delayed);
  s.fault_duplicated = ld(c.fault_duplicated);
  s.fault_commands = ld(c.fault_commands);
  s.fault_commands_refused = ld(c.fault_commands_refused);
  return s;
}

std::vector<peer_info> control_node::peers() const {
  std::vector<peer_info> v;
  std::lock_guard lock(impl_->mu);
  for (const auto& [id, q] : impl_->out) v.push_back({id, q.endpoint, q.state, q.frames.size()});
  return v;
}

}  // namespace tessera::transport::control