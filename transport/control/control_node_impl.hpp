// control_node's inside: the state the caller threads and the I/O thread share (`impl`), and the
// helpers both halves use. control_node.cpp is the public API (callers' threads),
// control_node_io.cpp the I/O thread (sockets, the loop, frames in and out, heartbeats,
// monitors). Internal to transport/control: included by those two files only.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <msgpack.hpp>
#include <zmq.hpp>

#include "actors/base/msgpack_bounded.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::transport::control {
namespace node_detail {

inline constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
inline constexpr int kMonitorEvents = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                      ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
inline constexpr std::size_t kMaxEndpointLen = 256;
// Inbound messages handled per poll round before timers run.
inline constexpr int kRecvBatch = 256;

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline std::uint64_t now_ms() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

// Whether a socket has a message now (ZMQ_EVENTS; it also takes the socket's pending commands).
inline bool has_input(zmq::socket_t& s) {
  try {
    return (s.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  } catch (const zmq::error_t&) {
    return false;
  }
}

inline bool is_valid_endpoint(std::string_view ep) {
  if (ep.empty() || ep.size() > kMaxEndpointLen) return false;
  return ep.starts_with("tcp://") || ep.starts_with("ipc://") || ep.starts_with("inproc://");
}

// At most one log line per reason per second; the next line says how many were suppressed.
class log_limiter {
 public:
  bool allow(std::size_t key, std::uint64_t now, std::uint64_t& suppressed) {
    auto& s = slots_[key];
    if (now >= s.last_ms + 1000 || s.last_ms == 0) {
      suppressed = s.suppressed;
      s.suppressed = 0;
      s.last_ms = now;
      return true;
    }
    ++s.suppressed;
    return false;
  }

 private:
  struct slot {
    std::uint64_t last_ms = 0;
    std::uint64_t suppressed = 0;
  };
  std::map<std::size_t, slot> slots_;
};

// Log keys beyond the reject reasons.
inline constexpr std::size_t kLogZap = 100;
inline constexpr std::size_t kLogHandshakeIn = 101;
inline constexpr std::size_t kLogHandshakeOut = 102;
inline constexpr std::size_t kLogUnknown = 103;

struct counters {
  std::atomic<std::uint64_t> frames_sent{0}, frames_received{0}, bytes_sent{0}, bytes_received{0},
      messages_delivered{0}, heartbeats_sent{0}, heartbeats_received{0}, duplicates_dropped{0},
      frames_missing{0}, send_queue_full{0}, zap_allowed{0}, zap_denied{0},
      handshake_failed_inbound{0}, handshake_failed_outbound{0}, peer_up_events{0},
      peer_down_events{0}, reconnects{0}, deaf_reconnects{0}, unknown_sender{0}, fault_dropped{0}, fault_delayed{0},
      fault_duplicated{0}, fault_commands{0}, fault_commands_refused{0};
  std::array<std::atomic<std::uint64_t>, kRejectReasonCount> rejected{};
};

inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) {
  c.fetch_add(n, std::memory_order_relaxed);
}

// A heartbeat body: our advertised endpoint, this link's heartbeat number and the echo of the
// last number heard from the receiver (see peer_link.hpp: how a deaf outbound link is found).
inline std::string heartbeat_body(const std::string& endpoint, std::uint64_t number,
                                  std::uint64_t echo) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(3);
  pk.pack(std::string_view("ep"));
  pk.pack(std::string_view(endpoint));
  pk.pack(std::string_view("n"));
  pk.pack(number);
  pk.pack(std::string_view("echo"));
  pk.pack(echo);
  return std::string(buf.data(), buf.size());
}

struct heartbeat_fields {
  std::string endpoint;  ///< empty when absent or malformed
  std::optional<std::uint64_t> number;
  std::optional<std::uint64_t> echo;
};

// The fields of a heartbeat body; unknown keys are skipped, malformed ones read as absent.
inline heartbeat_fields parse_heartbeat(std::span<const std::byte> body) {
  heartbeat_fields h;
  try {
    auto handle = tessera::bounded_unpack(reinterpret_cast<const char*>(body.data()), body.size());
    const msgpack::object& o = handle.get();
    if (o.type != msgpack::type::MAP) return h;
    for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
      const auto& kv = o.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) continue;
      const auto key = kv.key.as<std::string_view>();
      if (key == "ep" && kv.val.type == msgpack::type::STR) {
        h.endpoint = kv.val.as<std::string>();
      } else if (key == "n" && kv.val.type == msgpack::type::POSITIVE_INTEGER) {
        h.number = kv.val.via.u64;
      } else if (key == "echo" && kv.val.type == msgpack::type::POSITIVE_INTEGER) {
        h.echo = kv.val.via.u64;
      }
    }
  } catch (const std::exception&) {
  }
  return h;
}

}  // namespace node_detail

// ---------------------------------------------------------------------------------------------
// State shared between the caller threads and the I/O thread lives under `mu`; everything else
// (sockets, links) is touched by the I/O thread only.
struct control_node::impl {
  struct out_queue {
    std::string endpoint;
    std::deque<std::string> frames;
    std::uint64_t next_seq = 1;
    link_state state = link_state::connecting;  // a copy of the I/O thread's, for peers()
  };
  struct command {
    enum kind_t { add, remove } kind;
    std::string peer;
    std::string endpoint;
  };
  struct peer_io {
    std::string endpoint;
    std::unique_ptr<zmq::socket_t> dealer;
    std::unique_ptr<zmq::socket_t> monitor;
    peer_link link;
    bool want_pollout = false;
    // A new incarnation of the peer was seen: its next heartbeat says where it listens now, and
    // a process that restarted on another port or address is dialled there (repoint()).
    bool check_endpoint = false;
  };

  node_config cfg;
  node_handlers handlers;
  std::string endpoint;
  std::uint64_t incarnation = 0;
  std::atomic<std::uint64_t> epoch{0};
  node_detail::counters ctr;

  mutable std::mutex mu;
  std::map<std::string, out_queue, std::less<>> out;  // guarded by mu
  std::vector<command> commands;                      // guarded by mu
  bool stopped = false;                               // guarded by mu

  int wake_fd = -1;
  std::atomic<bool> wake_pending{false};
  std::atomic<bool> stopping{false};
  std::thread io;
  std::thread::id io_id;

  // I/O thread only.
  std::unique_ptr<zmq::context_t> ctx;
  std::unique_ptr<zmq::socket_t> router, zap, router_monitor;
  std::map<std::string, peer_io, std::less<>> links;
  std::uint64_t next_heartbeat_ms = 0;
  std::uint64_t monitor_seq = 0;
  node_detail::log_limiter limiter;
  std::multimap<std::int64_t, std::pair<std::string, std::string>> delayed;  // due ns -> (peer, frame)

  ~impl() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() {
    if (!wake_pending.exchange(true, std::memory_order_acq_rel)) {
      std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
    }
  }

  // ---- setup (I/O thread) ----
  result<void> open_sockets();
  std::unique_ptr<zmq::socket_t> open_monitor(zmq::socket_t& s);
  void connect_peer(const std::string& id, const std::string& ep);
  void close_peer(const std::string& id, peer_io& p);

  // ---- loop (I/O thread) ----
  void run(std::promise<result<void>>& started);
  void loop();
  void drain_wake();
  void run_commands();
  void flush(const std::string& id, peer_io& p);
  bool put_on_wire(const std::string& id, peer_io& p, const std::string& frame);
  bool write_frame(peer_io& p, const std::string& frame);
  void release_delayed();
  void handle_fault_command(const frame_view& f);
  void flush_all();
  bool read_router();
  void handle_inbound(zmq::message_t& rid, zmq::message_t& frame, bool extra_parts);
  void handle_frame(const frame_view& f);
  void read_zap();
  void read_monitor(zmq::socket_t& mon, bool inbound, const std::string& peer);
  void drain_monitors();
  void tick(std::uint64_t now);
  void send_heartbeats();
  void apply(const std::string& id, const link_actions& a);
  void reject(reject_reason why, const std::string& detail, std::string_view rid);
  void emit(peer_event_kind kind, const std::string& peer, std::string reason);
};

}  // namespace tessera::transport::control
