// control_node's I/O thread: opens the ROUTER, the ZAP handler and one DEALER per peer, runs the
// loop (commands from callers, frames in and out, the fault layer's holds, heartbeats and the
// links' state machines, monitor events) and closes every socket on its way out.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <string>

#include <msgpack.hpp>
#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "actors/base/thread.hpp"
#include "transport/control/control_node_impl.hpp"

namespace tessera::transport::control {
using namespace node_detail;

result<void> control_node::impl::open_sockets() {
  ctx = std::make_unique<zmq::context_t>(1);
  try {
    if (cfg.keys) {
      // The ZAP handler must be bound before the ROUTER accepts its first connection.
      zap = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::rep);
      zap->set(zmq::sockopt::linger, 0);
      zap->bind(kZapEndpoint);
    }
    router = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::router);
    router->set(zmq::sockopt::linger, 0);
    router->set(zmq::sockopt::router_handover, 1);  // a restarted peer replaces its old connection
    router->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kHardMaxFrameSize));
    router->set(zmq::sockopt::rcvhwm, 10000);
    if (cfg.keys) {
      router->set(zmq::sockopt::curve_server, 1);
      router->set(zmq::sockopt::curve_secretkey,
                  zmq::const_buffer(cfg.keys->server.secret_key.data(), 32));
      router->set(zmq::sockopt::zap_domain, "tessera");
    }
    router_monitor = open_monitor(*router);
    router->bind(cfg.bind_endpoint);
    endpoint = router->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(errc::io, "control plane of node '{}': cannot bind {}: {}", cfg.node_id,
                      cfg.bind_endpoint, e.what());
  }
  if (cfg.advertise_endpoint.empty()) cfg.advertise_endpoint = endpoint;
  return ok();
}

std::unique_ptr<zmq::socket_t> control_node::impl::open_monitor(zmq::socket_t& s) {
  std::string ep = fmt::format("inproc://tessera-monitor-{}", monitor_seq++);
  if (zmq_socket_monitor(s.handle(), ep.c_str(), kMonitorEvents) != 0) {
    throw zmq::error_t();
  }
  auto mon = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::pair);
  mon->set(zmq::sockopt::linger, 0);
  mon->connect(ep);
  return mon;
}

void control_node::impl::connect_peer(const std::string& id, const std::string& ep) {
  auto it = links.find(id);
  if (it == links.end()) {
    it = links.emplace(id, peer_io{ep, nullptr, nullptr,
                                   peer_link(cfg.timing, cfg.seed ^ std::hash<std::string>{}(id),
                                             now_ms())})
             .first;
  }
  peer_io& p = it->second;
  close_peer(id, p);
  p.endpoint = ep;
  try {
    auto d = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::dealer);
    d->set(zmq::sockopt::linger, 0);
    d->set(zmq::sockopt::routing_id, cfg.node_id);
    // Queue only to completed connections: while the peer is away, frames wait in our bounded
    // queue (where send() sees the bound) instead of an invisible libzmq pipe.
    d->set(zmq::sockopt::immediate, 1);
    d->set(zmq::sockopt::sndhwm, 1000);
    d->set(zmq::sockopt::reconnect_ivl, static_cast<int>(cfg.timing.backoff_min_ms));
    d->set(zmq::sockopt::reconnect_ivl_max, static_cast<int>(cfg.timing.backoff_max_ms));
    if (cfg.keys) {
      d->set(zmq::sockopt::curve_serverkey,
             zmq::const_buffer(cfg.keys->server.public_key.data(), 32));
      d->set(zmq::sockopt::curve_publickey,
             zmq::const_buffer(cfg.keys->client.public_key.data(), 32));
      d->set(zmq::sockopt::curve_secretkey,
             zmq::const_buffer(cfg.keys->client.secret_key.data(), 32));
    }
    p.monitor = open_monitor(*d);
    d->connect(ep);
    p.dealer = std::move(d);
  } catch (const zmq::error_t& e) {
    spdlog::warn("control {}: cannot connect to peer {} at {}: {}", cfg.node_id, id, ep, e.what());
    p.monitor.reset();
    p.dealer.reset();
  }
}

void control_node::impl::close_peer(const std::string& id, peer_io& p) {
  if (p.dealer) zmq_socket_monitor(p.dealer->handle(), nullptr, 0);
  // Events queued before monitoring stopped are still counted (the monitor is read only with
  // heartbeats, see loop()).
  if (p.monitor) read_monitor(*p.monitor, false, id);
  p.monitor.reset();
  p.dealer.reset();
  p.want_pollout = false;
}

void control_node::impl::run(std::promise<result<void>>& started) {
  io_id = std::this_thread::get_id();
  auto r = open_sockets();
  const bool ok_start = r.has_value();
  started.set_value(std::move(r));
  if (ok_start) loop();
  // Close every socket on the thread that used them, then the context.
  for (auto& [id, p] : links) close_peer(id, p);
  links.clear();
  if (router) zmq_socket_monitor(router->handle(), nullptr, 0);
  router_monitor.reset();
  router.reset();
  zap.reset();
  ctx.reset();
}

void control_node::impl::loop() {
  // A plain poll() over the sockets' ZMQ_FDs instead of zmq_poll(): zmq_poll() asks every
  // libzmq socket in its set for ZMQ_EVENTS before it blocks and again after (each ask a poll()
  // and a getpid() system call, libzmq's fork check). With the monitors and every idle DEALER in
  // that set, a 64-byte round trip took 1.4-1.5x a raw libzmq ping-pong (target 1.3x), and the
  // set grew with the number of peers; now 1.3x, of which 1.1x is our two connections per pair
  // (bench/RESULTS.md, control plane).
  //
  // ZMQ_FD only signals that commands are waiting, not that messages are: it goes readable when
  // a socket that found its pipes empty is told a pipe has something again. So a socket is read
  // until it says EAGAIN (that recv processes the commands and leaves the pipes marked empty)
  // before we block, and afterwards only when its FD goes readable. The ROUTER and the ZAP
  // socket are only ever read here (replies to ZAP are sent before reading on to EAGAIN), so
  // nothing else consumes their signals. DEALERs only send (the peer's ROUTER never answers on
  // them): one is watched only while its queue waits for POLLOUT, asked for ZMQ_EVENTS before
  // each block since our own sends on it (heartbeats) may have taken its signal. The monitors
  // only count and log failed handshakes: drain_monitors() reads them with each heartbeat round.
  next_heartbeat_ms = now_ms();
  const int router_fd = router->get(zmq::sockopt::fd);
  const int zap_fd = zap ? zap->get(zmq::sockopt::fd) : -1;
  bool router_ready = true;  // nothing read yet: read until EAGAIN first
  bool zap_ready = zap != nullptr;
  bool wake_ready = false;
  std::vector<pollfd> fds;
  while (!stopping.load(std::memory_order_acquire)) {
    if (router_ready) router_ready = !read_router();
    if (zap_ready) {
      read_zap();
      // It reads to EAGAIN unless a socket error stopped it: then ask, so that a request left
      // behind is not waited on until the next handshake signals (ZAP traffic is rare).
      zap_ready = has_input(*zap);
    }
    if (wake_ready) drain_wake();
    if (!delayed.empty()) release_delayed();
    tick(now_ms());

    fds.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    fds.push_back({router_fd, POLLIN, 0});
    if (zap) fds.push_back({zap_fd, POLLIN, 0});
    std::uint64_t deadline = next_heartbeat_ms;
    for (auto& [id, p] : links) {
      deadline = std::min(deadline, p.link.next_deadline_ms());
      if (!p.dealer || !p.want_pollout) continue;
      if ((p.dealer->get(zmq::sockopt::events) & ZMQ_POLLOUT) != 0) flush(id, p);
      if (p.want_pollout) fds.push_back({p.dealer->get(zmq::sockopt::fd), POLLIN, 0});
    }
    const std::uint64_t now = now_ms();
    int timeout = deadline > now ? static_cast<int>(std::min<std::uint64_t>(deadline - now, 60000)) : 0;
    if (!delayed.empty()) {
      const std::int64_t wait_ns = delayed.begin()->first - now_ns();
      timeout = std::min(timeout, wait_ns <= 0 ? 0 : static_cast<int>(wait_ns / 1000000 + 1));
    }
    if (router_ready) timeout = 0;  // a batch's worth was read, more may wait
    const int rc = ::poll(fds.data(), fds.size(), timeout);
    if (rc < 0) {
      if (errno == EINTR) continue;
      spdlog::error("control {}: poll: {}", cfg.node_id, std::strerror(errno));
      break;
    }
    wake_ready = (fds[0].revents & POLLIN) != 0;
    router_ready = router_ready || fds[1].revents != 0;
    if (zap) zap_ready = fds[2].revents != 0;
    // A DEALER's FD that went readable needs nothing here: its ZMQ_EVENTS are asked before the
    // next block (by then a command may have removed that peer).
  }
}

void control_node::impl::drain_wake() {
  std::uint64_t v = 0;
  [[maybe_unused]] auto n = ::read(wake_fd, &v, sizeof v);
  // Clear before draining: a send() after this point wakes us again.
  wake_pending.store(false, std::memory_order_release);
  run_commands();
  flush_all();
}

void control_node::impl::run_commands() {
  std::vector<command> cmds;
  {
    std::lock_guard lock(mu);
    cmds.swap(commands);
  }
  for (auto& c : cmds) {
    if (c.kind == command::add) {
      connect_peer(c.peer, c.endpoint);
    } else if (auto it = links.find(c.peer); it != links.end()) {
      close_peer(c.peer, it->second);
      links.erase(it);
    }
  }
}

void control_node::impl::flush(const std::string& id, peer_io& p) {
  if (!p.dealer) return;
  std::lock_guard lock(mu);
  auto it = out.find(id);
  if (it == out.end()) return;
  auto& q = it->second.frames;
  p.want_pollout = false;
  while (!q.empty()) {
    if (cfg.faults.decide) {
      // Only once the socket can take it, so a frame is judged once: check writability first.
      if ((p.dealer->get(zmq::sockopt::events) & ZMQ_POLLOUT) == 0) {
        p.want_pollout = true;
        break;
      }
      std::string f = std::move(q.front());
      q.pop_front();
      (void)put_on_wire(id, p, f);
      continue;
    }
    // zmq_send copies the bytes; with DONTWAIT it never blocks, so holding `mu` is brief.
    if (!write_frame(p, q.front())) {
      p.want_pollout = true;  // no completed connection yet, or the HWM: retry on POLLOUT
      break;
    }
    q.pop_front();
  }
}

// Hands one frame to the peer's DEALER without blocking and counts it; false when there is no
// socket or it refused (no completed connection yet, or the high-water mark).
bool control_node::impl::write_frame(peer_io& p, const std::string& frame) {
  if (!p.dealer || zmq_send(p.dealer->handle(), frame.data(), frame.size(), ZMQ_DONTWAIT) < 0) {
    return false;
  }
  bump(ctr.frames_sent);
  bump(ctr.bytes_sent, frame.size());
  return true;
}

// Passes one frame through the fault hook: copies due now go to the socket, later ones wait in
// `delayed` (bounded). Returns false when nothing could be written now.
bool control_node::impl::put_on_wire(const std::string& id, peer_io& p, const std::string& frame) {
  const std::int64_t now = now_ns();
  std::array<std::int64_t, 2> due{now, now};
  std::uint8_t copies = 1;
  if (cfg.faults.decide) copies = std::min<std::uint8_t>(cfg.faults.decide(id, now, due), 2);
  if (copies == 0) {
    bump(ctr.fault_dropped);
    return false;
  }
  if (copies == 2) bump(ctr.fault_duplicated);
  bool wrote = false;
  for (std::uint8_t i = 0; i < copies; ++i) {
    if (due[i] > now) {
      if (delayed.size() >= kMaxDelayedFrames) {
        bump(ctr.fault_dropped);
        continue;
      }
      bump(ctr.fault_delayed);
      delayed.emplace(due[i], std::make_pair(id, frame));
      continue;
    }
    if (write_frame(p, frame)) {
      wrote = true;
    } else {
      bump(ctr.fault_dropped);  // judged already: a copy the socket refused is not retried
    }
  }
  return wrote;
}

void control_node::impl::release_delayed() {
  const std::int64_t now = now_ns();
  while (!delayed.empty() && delayed.begin()->first <= now) {
    auto node = delayed.extract(delayed.begin());
    auto& [peer, frame] = node.mapped();
    auto it = links.find(peer);
    // A held-back frame is "in the network": if the socket cannot take it now, it is lost.
    if (it == links.end() || !write_frame(it->second, frame)) bump(ctr.fault_dropped);
  }
}

void control_node::impl::handle_fault_command(const frame_view& f) {
  const auto type = static_cast<msg_type>(f.header.type);
  if (!cfg.faults.on_command) {
    bump(ctr.fault_commands_refused);
    spdlog::warn("control {}: fault command from {} ignored: no fault layer installed",
                 cfg.node_id, f.header.sender);
    return;
  }
  auto r = cfg.faults.on_command(type, f.body);
  if (r) {
    bump(ctr.fault_commands);
    spdlog::info("control {}: fault command ({}) from {} applied", cfg.node_id,
                 type == msg_type::fault_set ? "fault.set" : "fault.clear", f.header.sender);
  } else {
    bump(ctr.fault_commands_refused);
    spdlog::warn("control {}: fault command from {} refused: {}", cfg.node_id, f.header.sender,
                 r.error().describe());
  }
}

void control_node::impl::flush_all() {
  for (auto& [id, p] : links) flush(id, p);
}

// Reads up to kRecvBatch messages; true when the ROUTER said EAGAIN (all read, see loop()).
bool control_node::impl::read_router() {
  for (int i = 0; i < kRecvBatch; ++i) {
    zmq::message_t rid;
    zmq::message_t frame;
    try {
      if (!router->recv(rid, zmq::recv_flags::dontwait)) return true;
      if (!rid.more()) {
        // A ROUTER always prepends the routing id: a one-part message cannot happen, but if it
        // does it is a frame without a routing id.
        reject(reject_reason::bad_parts, "message with a single part", {});
        continue;
      }
      (void)router->recv(frame, zmq::recv_flags::none);  // parts of one message arrive together
      bool extra = false;
      while (frame.more() || extra) {
        zmq::message_t drop;
        (void)router->recv(drop, zmq::recv_flags::none);
        extra = true;
        if (!drop.more()) break;
      }
      handle_inbound(rid, frame, extra);
    } catch (const zmq::error_t& e) {
      spdlog::error("control {}: receive: {}", cfg.node_id, e.what());
      return !has_input(*router);  // stopped before EAGAIN: whether to read on, ask
    }
  }
  return false;
}

void control_node::impl::reject(reject_reason why, const std::string& detail,
                                std::string_view rid) {
  bump(ctr.rejected[static_cast<std::size_t>(why)]);
  std::uint64_t suppressed = 0;
  if (limiter.allow(static_cast<std::size_t>(why), now_ms(), suppressed)) {
    spdlog::warn("control {}: rejected frame from '{}' ({}): {}{}", cfg.node_id, rid,
                 to_string(why), detail,
                 suppressed ? fmt::format(" ({} similar suppressed)", suppressed) : "");
  }
}

void control_node::impl::handle_inbound(zmq::message_t& rid, zmq::message_t& frame, bool extra) {
  std::string_view routing_id(static_cast<const char*>(rid.data()), rid.size());
  if (extra) {
    reject(reject_reason::bad_parts, "message with more than [routing id, frame] parts",
           routing_id);
    return;
  }
  frame_view f;
  std::string detail;
  auto bytes = std::span<const std::byte>(static_cast<const std::byte*>(frame.data()), frame.size());
  auto why = decode_frame(bytes, cfg.limits, f, &detail);
  if (why != reject_reason::none) {
    reject(why, detail, routing_id);
    return;
  }
  if (f.header.sender != routing_id) {
    // The routing id is what the connection announced; a frame claiming another sender is a
    // confused or lying peer.
    reject(reject_reason::sender_mismatch,
           fmt::format("header says '{}'", f.header.sender), routing_id);
    return;
  }
  bump(ctr.frames_received);
  bump(ctr.bytes_received, frame.size());
  handle_frame(f);
}

void control_node::impl::handle_frame(const frame_view& f) {
  const std::string sender(f.header.sender);
  auto it = links.find(sender);
  if (it == links.end()) {
    // add_peer() may have queued this peer a moment ago: take it in before judging the sender.
    run_commands();
    it = links.find(sender);
  }
  if (it == links.end() && f.header.type == static_cast<std::uint16_t>(msg_type::heartbeat) &&
      cfg.accept_unknown_peers) {
    std::string ep = parse_heartbeat(f.body).endpoint;
    if (is_valid_endpoint(ep) && sender != cfg.node_id) {
      bool added = false;
      {
        std::lock_guard lock(mu);
        if (out.size() < cfg.max_peers && !out.contains(sender)) {
          out.emplace(sender, out_queue{ep, {}, 1, link_state::connecting});
          added = true;
        }
      }
      if (added) {
        spdlog::info("control {}: peer {} introduced itself at {}", cfg.node_id, sender, ep);
        connect_peer(sender, ep);
        it = links.find(sender);
      }
    }
  }
  if (it != links.end()) {
    apply(sender, it->second.link.on_frame(now_ms()));
    std::uint64_t missing = 0;
    switch (it->second.link.on_seq(f.header.incarnation, f.header.seq, missing)) {
      case seq_verdict::duplicate:
        bump(ctr.duplicates_dropped);
        return;
      case seq_verdict::gap:
        bump(ctr.frames_missing, missing);
        break;
      case seq_verdict::restarted:
        it->second.check_endpoint = true;
        emit(peer_event_kind::restarted, sender, "new incarnation");
        break;
      case seq_verdict::in_order:
      case seq_verdict::unsequenced:
        break;
    }
  } else if (f.header.type != static_cast<std::uint16_t>(msg_type::heartbeat)) {
    bump(ctr.unknown_sender);
  }
  switch (static_cast<msg_type>(f.header.type)) {
    case msg_type::heartbeat:
      bump(ctr.heartbeats_received);
      if (it != links.end()) {
        const auto hb = parse_heartbeat(f.body);
        if (it->second.check_endpoint) {
          // Only a new incarnation may move the link: one process keeps its endpoint for life,
          // and a peer we dialled under another spelling of its address is left alone.
          it->second.check_endpoint = false;
          if (is_valid_endpoint(hb.endpoint) && hb.endpoint != it->second.endpoint) {
            spdlog::info("control {}: peer {} restarted at {} (was {}): dialling it there",
                         cfg.node_id, sender, hb.endpoint, it->second.endpoint);
            {
              std::lock_guard lock(mu);
              if (auto o = out.find(sender); o != out.end()) o->second.endpoint = hb.endpoint;
            }
            connect_peer(sender, hb.endpoint);
            flush(sender, it->second);
          }
        }
        if (hb.number) apply(sender, it->second.link.on_heartbeat(*hb.number, hb.echo, now_ms()));
      }
      return;
    case msg_type::fault_set:
    case msg_type::fault_clear:
      handle_fault_command(f);  // consumed by the transport, never delivered
      return;
    default:
      break;
  }
  bump(ctr.messages_delivered);
  if (handlers.on_message) {
    handlers.on_message(inbound_message{sender, f.header.type, f.header.epoch, f.header.seq,
                                        std::string(reinterpret_cast<const char*>(f.body.data()),
                                                    f.body.size())});
  }
}

void control_node::impl::read_zap() {
  for (;;) {
    std::vector<zmq::message_t> parts;
    try {
      zmq::message_t m;
      if (!zap->recv(m, zmq::recv_flags::dontwait)) return;
      parts.push_back(std::move(m));
      while (parts.back().more() && parts.size() < 16) {
        zmq::message_t next;
        (void)zap->recv(next, zmq::recv_flags::none);
        parts.push_back(std::move(next));
      }
      // ZAP request (RFC 27): version, request id, domain, address, identity, mechanism, creds.
      bool allow = parts.size() == 7 && parts[0].to_string_view() == "1.0" &&
                   parts[5].to_string_view() == "CURVE" && parts[6].size() == 32 &&
                   std::memcmp(parts[6].data(), cfg.keys->client.public_key.data(), 32) == 0;
      std::string address = parts.size() > 3 ? parts[3].to_string() : std::string("?");
      if (allow) {
        bump(ctr.zap_allowed);
      } else {
        bump(ctr.zap_denied);
        std::uint64_t suppressed = 0;
        if (limiter.allow(kLogZap, now_ms(), suppressed)) {
          spdlog::warn("control {}: refused a {} handshake from {}: client key not derived from "
                       "this cluster's secret{}",
                       cfg.node_id, parts.size() > 5 ? parts[5].to_string() : "?", address,
                       suppressed ? fmt::format(" ({} similar suppressed)", suppressed) : "");
        }
      }
      const std::string request_id = parts.size() > 1 ? parts[1].to_string() : std::string();
      zap->send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
      zap->send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      zap->send(allow ? zmq::str_buffer("200") : zmq::str_buffer("400"), zmq::send_flags::sndmore);
      zap->send(allow ? zmq::str_buffer("OK") : zmq::str_buffer("not a member of this cluster"),
                zmq::send_flags::sndmore);
      zap->send(zmq::str_buffer("member"), zmq::send_flags::sndmore);  // user id
      zap->send(zmq::str_buffer(""), zmq::send_flags::none);           // metadata
    } catch (const zmq::error_t& e) {
      spdlog::error("control {}: ZAP handler: {}", cfg.node_id, e.what());
      return;
    }
  }
}

void control_node::impl::read_monitor(zmq::socket_t& mon, bool inbound, const std::string& peer) {
  for (;;) {
    zmq::message_t ev;
    zmq::message_t addr;
    try {
      if (!mon.recv(ev, zmq::recv_flags::dontwait)) return;
      if (ev.more()) (void)mon.recv(addr, zmq::recv_flags::none);
    } catch (const zmq::error_t&) {
      return;
    }
    if (ev.size() < 6) continue;
    std::uint16_t event = 0;
    std::uint32_t value = 0;
    std::memcpy(&event, ev.data(), 2);
    std::memcpy(&value, static_cast<const char*>(ev.data()) + 2, 4);
    if ((event & kMonitorEvents) == 0) continue;
    bump(inbound ? ctr.handshake_failed_inbound : ctr.handshake_failed_outbound);
    std::uint64_t suppressed = 0;
    if (limiter.allow(inbound ? kLogHandshakeIn : kLogHandshakeOut, now_ms(), suppressed)) {
      // `value` is a ZMQ_PROTOCOL_ERROR_* code (or the ZAP status code), not an errno. For an
      // inbound failure libzmq's monitor names only our listening endpoint, not the caller (a
      // caller that got as far as ZAP is named by the ZAP handler's own line).
      spdlog::warn(
          "control {}: {} handshake failed {} {} (zmq event 0x{:x}, detail 0x{:x}){}", cfg.node_id,
          inbound ? "inbound" : "outbound", inbound ? "on our listening endpoint" : "to",
          inbound ? addr.to_string() + " (caller unknown to libzmq's monitor)"
                  : peer + " at " + addr.to_string(),
          event, value, suppressed ? fmt::format(" ({} similar suppressed)", suppressed) : "");
    }
  }
}

// Counts and logs the failed handshakes the monitors saw since the last heartbeat round. A
// monitor's pipe holds about a thousand events (libzmq's default high-water marks; libzmq drops
// what does not fit), so a flood of more failed handshakes than that within one heartbeat
// interval is undercounted; nothing acts on these counters but status and logs.
void control_node::impl::drain_monitors() {
  if (router_monitor) read_monitor(*router_monitor, true, {});
  for (auto& [id, p] : links) {
    if (p.monitor) read_monitor(*p.monitor, false, id);
  }
}

void control_node::impl::emit(peer_event_kind kind, const std::string& peer, std::string reason) {
  if (kind == peer_event_kind::up) bump(ctr.peer_up_events);
  if (kind == peer_event_kind::down) bump(ctr.peer_down_events);
  const bool transient = !cfg.transient_prefix.empty() && peer.starts_with(cfg.transient_prefix);
  spdlog::log(transient                          ? spdlog::level::debug
              : kind == peer_event_kind::down ? spdlog::level::warn
                                              : spdlog::level::info,
              "control {}: peer {} {}{}{}", cfg.node_id, peer, to_string(kind),
              reason.empty() ? "" : ": ", reason);
  if (handlers.on_peer_event) handlers.on_peer_event(peer_event{kind, peer, std::move(reason)});
}

void control_node::impl::apply(const std::string& id, const link_actions& a) {
  if (a.emit_up || a.emit_down) {
    std::lock_guard lock(mu);
    if (auto it = out.find(id); it != out.end()) {
      it->second.state = a.emit_up ? link_state::up : link_state::down;
    }
  }
  if (a.emit_up) emit(peer_event_kind::up, id, {});
  if (a.emit_down) emit(peer_event_kind::down, id, a.reason);
  if (a.reconnect) {
    auto it = links.find(id);
    if (it != links.end()) {
      bump(ctr.reconnects);
      if (!a.emit_down && !a.reason.empty()) {
        // The peer is up but deaf to us (see peer_link.hpp): say so, it is never routine.
        bump(ctr.deaf_reconnects);
        spdlog::warn("control {}: peer {}: {}: reconnecting", cfg.node_id, id, a.reason);
      }
      // A fresh socket drops a half-open TCP connection that libzmq's own retry would keep.
      std::string ep = it->second.endpoint;
      connect_peer(id, ep);
      flush(id, it->second);
    }
  }
}

void control_node::impl::tick(std::uint64_t now) {
  if (now >= next_heartbeat_ms) {
    send_heartbeats();
    drain_monitors();
    next_heartbeat_ms = now + cfg.timing.heartbeat_interval_ms;
  }
  for (auto& [id, p] : links) {
    if (now >= p.link.next_deadline_ms()) apply(id, p.link.on_tick(now));
  }
}

void control_node::impl::send_heartbeats() {
  if (links.empty()) return;
  frame_header h;
  h.type = static_cast<std::uint16_t>(msg_type::heartbeat);
  h.epoch = epoch.load(std::memory_order_relaxed);
  h.incarnation = incarnation;
  h.seq = 0;  // unsequenced: a heartbeat that cannot be sent is simply skipped
  h.sender = cfg.node_id;
  for (auto& [id, p] : links) {
    if (!p.dealer) continue;
    // Per link: the body numbers this link's heartbeats and echoes the peer's.
    const std::string body = heartbeat_body(cfg.advertise_endpoint,
                                            p.link.next_heartbeat_number(), p.link.echo_for_peer());
    auto frame = encode_frame(h, as_bytes(body), cfg.limits);
    TESSERA_ASSERT(frame.has_value(), "heartbeat frame: {}", frame.error().describe());
    if (cfg.faults.decide) {
      if ((p.dealer->get(zmq::sockopt::events) & ZMQ_POLLOUT) == 0) continue;
      if (put_on_wire(id, p, *frame)) bump(ctr.heartbeats_sent);
      continue;
    }
    if (write_frame(p, *frame)) bump(ctr.heartbeats_sent);
  }
}

}  // namespace tessera::transport::control
