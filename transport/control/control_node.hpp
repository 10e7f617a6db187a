// The control plane of one node: ZeroMQ ROUTER/DEALER links to every peer, heartbeats, reconnect
// with backoff, bounded per-peer send queues, CURVE authentication (cluster_key.hpp).
//
// Shape (the zguide "Harmony" pattern, one direction per connection):
//
//   node A                                   node B
//   DEALER(routing id "A") ──── tcp ───────► ROUTER (bound)     A → B frames
//   ROUTER (bound)        ◄──── tcp ──────── DEALER(routing id "B")  B → A frames
//
// Each node binds one ROUTER (inbound only) and connects one DEALER per peer (outbound only). All
// sockets live on one I/O thread owned by the node; the public API is thread-safe: send() and
// add_peer() enqueue and wake the thread through an eventfd. Inbound messages and peer events are
// delivered by callbacks on the I/O thread (they must not block; they may call send(), which then
// writes to the socket directly, without a wake-up). Frame format: frame.hpp.
//
// Bounds: per-peer send queue (send_queue_capacity frames; full → errc::overloaded, counted),
// peers (max_peers), frame/body sizes and msgpack shape (frame_limits), ZMQ_SNDHWM/RCVHWM.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/control/frame.hpp"
#include "transport/control/peer_link.hpp"

namespace tessera::transport::control {

/// Hook points for the fault layer (transport/faults), called on the I/O thread. Empty functions:
/// no faults. `decide` sees every outgoing frame, heartbeats included, so a partition also stops
/// liveness and peers go down as they would on a real cut.
struct fault_hooks {
  /// Fate of one frame from this node to `to` sent at `now_ns` (steady clock): returns the
  /// number of copies to deliver (0 = lost, 1, 2 = duplicated) and their due times in `due_ns`.
  std::function<std::uint8_t(std::string_view to, std::int64_t now_ns,
                             std::array<std::int64_t, 2>& due_ns)>
      decide;
  /// A fault.set / fault.clear message from an authenticated peer (body: msgpack command).
  std::function<result<void>(msg_type type, std::span<const std::byte> body)> on_command;
};

/// Frames held back by the fault layer (delay, reorder) at most; beyond, they are dropped.
inline constexpr std::size_t kMaxDelayedFrames = 4096;

/// Configuration of one node's control plane.
struct node_config {
  std::string node_id;                             ///< [A-Za-z0-9._-]{1,64}; the DEALER routing id
  std::string bind_endpoint = "tcp://127.0.0.1:*"; ///< '*' port: an ephemeral port (see endpoint())
  std::string advertise_endpoint;                  ///< sent in heartbeats; empty: the bound endpoint
  /// Peers whose id starts with this are short-lived by design (`tessera status` clients): their
  /// links going down is logged at debug level, not as a warning. Empty: none.
  std::string transient_prefix;
  /// CURVE keys. nullopt = plaintext, no authentication: for tests and benchmarks only
  /// (`tessera node` always requires a cluster key).
  std::optional<cluster_keys> keys;
  frame_limits limits;
  link_timing timing;
  std::size_t send_queue_capacity = 1024;  ///< frames queued per peer before send() refuses
  std::size_t max_peers = 256;
  bool accept_unknown_peers = true;  ///< add a peer that introduces itself by heartbeat
  std::uint64_t seed = 0;            ///< backoff jitter and incarnation; 0: from the clock
  fault_hooks faults;                ///< fault injection; empty = none
};

/// One inbound application message (transport-internal types are consumed by the node).
struct inbound_message {
  std::string sender;
  std::uint16_t type = 0;
  std::uint64_t epoch = 0;
  std::uint64_t seq = 0;
  std::string body;  ///< msgpack bytes, validated by the codec
};

enum class peer_event_kind : std::uint8_t { up, down, restarted };
[[nodiscard]] std::string_view to_string(peer_event_kind k) noexcept;

/// A change in a peer's liveness as the transport sees it.
struct peer_event {
  peer_event_kind kind = peer_event_kind::up;
  std::string peer;
  std::string reason;  ///< for down: why (silence length, never heard from)
};

/// Callbacks, invoked on the node's I/O thread.
struct node_handlers {
  std::function<void(inbound_message&&)> on_message;
  std::function<void(const peer_event&)> on_peer_event;
};

/// Counters since start. Per-reason rejections are indexed by reject_reason.
struct control_stats {
  std::uint64_t frames_sent = 0;
  std::uint64_t frames_received = 0;  ///< accepted by the codec
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_delivered = 0;
  std::uint64_t heartbeats_sent = 0;
  std::uint64_t heartbeats_received = 0;
  std::array<std::uint64_t, kRejectReasonCount> rejected{};
  std::uint64_t duplicates_dropped = 0;  ///< seq <= last seen (duplicate or reordered)
  std::uint64_t frames_missing = 0;      ///< sum of sequence gaps
  std::uint64_t send_queue_full = 0;     ///< send() refused with errc::overloaded
  std::uint64_t zap_allowed = 0;
  std::uint64_t zap_denied = 0;                ///< handshakes refused by our ZAP handler
  std::uint64_t handshake_failed_inbound = 0;  ///< on our ROUTER (wrong keys, wrong mechanism)
  std::uint64_t handshake_failed_outbound = 0; ///< on our DEALERs (the peer is not of our cluster)
  std::uint64_t peer_up_events = 0;
  std::uint64_t peer_down_events = 0;
  std::uint64_t reconnects = 0;
  std::uint64_t deaf_reconnects = 0;  ///< of which: the peer's echo said it stopped hearing us
  std::uint64_t unknown_sender = 0;  ///< messages from a sender we have no link to (delivered)
  std::uint64_t fault_dropped = 0;     ///< frames the fault hook lost (or delayed past the bound)
  std::uint64_t fault_delayed = 0;     ///< copies the fault hook held back
  std::uint64_t fault_duplicated = 0;  ///< extra copies the fault hook made
  std::uint64_t fault_commands = 0;    ///< fault.set/fault.clear applied
  std::uint64_t fault_commands_refused = 0;  ///< ... refused by the hook, or no hook installed

  [[nodiscard]] std::uint64_t rejected_total() const;
  [[nodiscard]] std::uint64_t rejected_for(reject_reason r) const {
    return rejected[static_cast<std::size_t>(r)];
  }
};

/// A snapshot of one peer.
struct peer_info {
  std::string id;
  std::string endpoint;
  link_state state = link_state::connecting;
  std::size_t queued = 0;
};

class control_node {
 public:
  /// Binds the ROUTER (and the ZAP handler when keys are set) and starts the I/O thread.
  /// Errors: invalid_argument (config), io (bind failed: the message names the endpoint).
  [[nodiscard]] static result<std::unique_ptr<control_node>> start(node_config config,
                                                                   node_handlers handlers);
  ~control_node();
  control_node(const control_node&) = delete;
  control_node& operator=(const control_node&) = delete;

  [[nodiscard]] const std::string& node_id() const;
  /// The bound endpoint with the real port (e.g. "tcp://127.0.0.1:40123").
  [[nodiscard]] const std::string& endpoint() const;

  /// Adds (or re-points) a peer and connects to it. Thread-safe. Errors: invalid_argument (id,
  /// endpoint, self), no_capacity (max_peers reached).
  [[nodiscard]] result<void> add_peer(std::string_view id, std::string_view endpoint);
  /// Forgets a peer; its queued frames are dropped. Thread-safe. errc::not_found if unknown.
  [[nodiscard]] result<void> remove_peer(std::string_view id);

  /// Queues one message to `peer`. Thread-safe; never blocks. `body` must be one msgpack object.
  /// Types: actor_envelope, application types (>= app_first), fault_set / fault_clear.
  /// Errors: not_found (unknown peer), overloaded (queue full, counted; retry later),
  /// invalid_argument (body not msgpack, type reserved), overloaded (frame larger than limits),
  /// closed (node stopped).
  [[nodiscard]] result<void> send(std::string_view peer, std::uint16_t type,
                                  std::span<const std::byte> body);
  [[nodiscard]] result<void> send(std::string_view peer, msg_type type,
                                  std::span<const std::byte> body) {
    return send(peer, static_cast<std::uint16_t>(type), body);
  }

  /// The epoch stamped on every frame sent from now on.
  void set_epoch(std::uint64_t epoch);

  [[nodiscard]] control_stats stats() const;
  [[nodiscard]] std::vector<peer_info> peers() const;

  /// Stops the I/O thread and closes every socket (idempotent; the destructor calls it).
  void stop();

  struct impl;

 private:
  explicit control_node(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tessera::transport::control
