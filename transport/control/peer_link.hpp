// Liveness, reconnect backoff and sequence tracking for one peer: a pure state machine (time and
// randomness come in from outside; no sockets) so that it is tested, and simulated, without I/O.
//
//              frame                      silence >= dead_after_ms
//   connecting ───────► up ◄──────────────┐ ─────────────────────────► down
//       │                ▲                 │                            │ │
//       │ silence >=     └── frame ────────┼────────────────────────────┘ │ backoff expired:
//       │ dead_after_ms                    │                              │ `reconnect` action,
//       └──────────────────────────────────┴──────────────► down ◄────────┘ next backoff doubles
//
// "down" is reported once per outage (emit_down with a reason); "up" once per recovery.
// Backoff: min(backoff_max_ms, backoff_min_ms * 2^attempt), jittered to [d/2, d] by a seeded rng.
//
// Liveness above is inbound only: it cannot see that *our* frames stopped reaching the peer. That
// happens for real: when another connection announces our routing id to the peer's ROUTER
// (router_handover), libzmq detaches our pipe but keeps the TCP connection open, so our DEALER
// sends into a void and never reconnects while the peer's frames keep arriving. Heartbeats
// therefore number themselves per link and echo the last number heard from the peer; when the
// peer keeps sending heartbeats whose echo of our numbers does not move, although we kept
// sending, the link asks for a `reconnect` (a fresh socket) without reporting the peer down.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::transport::control {

/// Timing of the liveness protocol. Bounds: dead_after_ms > heartbeat_interval_ms > 0,
/// 0 < backoff_min_ms <= backoff_max_ms.
struct link_timing {
  std::uint32_t heartbeat_interval_ms = 250;
  std::uint32_t dead_after_ms = 2000;
  std::uint32_t backoff_min_ms = 100;
  std::uint32_t backoff_max_ms = 5000;
};

enum class link_state : std::uint8_t { connecting, up, down };

/// What the caller must do after feeding an event.
struct link_actions {
  bool emit_up = false;    ///< report the peer up
  bool emit_down = false;  ///< report the peer down; `reason` says why
  bool reconnect = false;  ///< tear down and re-create the connection to the peer now
  std::string reason;
};

/// Receiver-side verdict on a frame's (incarnation, seq).
enum class seq_verdict : std::uint8_t {
  in_order,   ///< seq == last + 1, or the first frame seen
  gap,        ///< seq > last + 1: frames were lost (counted), this one is delivered
  duplicate,  ///< seq <= last: duplicate or late (reordered) frame; dropped
  restarted,  ///< a new incarnation of the peer: tracking restarts from this frame
  unsequenced ///< seq 0 (heartbeats): not tracked
};

class peer_link {
 public:
  peer_link(const link_timing& timing, std::uint64_t seed, std::uint64_t now_ms);

  /// A valid frame from the peer arrived.
  [[nodiscard]] link_actions on_frame(std::uint64_t now_ms);
  /// Time passed; call at or after next_deadline_ms().
  [[nodiscard]] link_actions on_tick(std::uint64_t now_ms);
  /// The next time on_tick has something to do.
  [[nodiscard]] std::uint64_t next_deadline_ms() const;

  /// The number to put in the next heartbeat to this peer (1, 2, ...).
  [[nodiscard]] std::uint64_t next_heartbeat_number() { return ++heartbeats_sent_; }
  /// The echo to put in heartbeats to this peer: the last heartbeat number heard from it.
  [[nodiscard]] std::uint64_t echo_for_peer() const { return heard_number_; }
  /// A heartbeat from the peer arrived with its own number and (from peers that echo) the last
  /// of our numbers it heard. May ask for a reconnect (see the header comment).
  [[nodiscard]] link_actions on_heartbeat(std::uint64_t number, std::optional<std::uint64_t> echo,
                                          std::uint64_t now_ms);
  /// Reconnects asked for because the peer stopped hearing us.
  [[nodiscard]] std::uint64_t deaf_reconnects() const { return deaf_reconnects_; }

  /// Checks (incarnation, seq) of a delivered frame; `missing` gets the gap size on `gap`.
  [[nodiscard]] seq_verdict on_seq(std::uint64_t incarnation, std::uint64_t seq,
                                   std::uint64_t& missing);

  [[nodiscard]] link_state state() const { return state_; }
  [[nodiscard]] std::uint32_t reconnect_attempts() const { return attempts_; }
  /// The backoff delay (before jitter) for a given attempt number.
  [[nodiscard]] std::uint64_t backoff_ms(std::uint32_t attempt) const;

 private:
  std::uint64_t jittered(std::uint64_t d);
  void go_down(std::uint64_t now_ms);

  link_timing timing_;
  std::uint64_t rng_;
  link_state state_ = link_state::connecting;
  std::uint64_t last_heard_ms_;
  std::uint64_t reconnect_at_ms_ = 0;
  std::uint32_t attempts_ = 0;
  // Outbound check (on_heartbeat). The echo must stay still across kDeafHeartbeats of ours and
  // of theirs and for dead_after_ms: counts make a stalled thread (ours or theirs) harmless.
  static constexpr std::uint64_t kDeafHeartbeats = 3;
  std::uint64_t heartbeats_sent_ = 0;
  std::uint64_t heard_number_ = 0;
  std::uint64_t last_echo_ = 0;
  std::uint64_t echo_moved_ms_;
  std::uint64_t sent_at_echo_move_ = 0;
  std::uint64_t heard_since_echo_move_ = 0;
  std::uint64_t deaf_reconnects_ = 0;
  bool have_incarnation_ = false;
  std::uint64_t incarnation_ = 0;
  std::uint64_t last_seq_ = 0;
};

}  // namespace tessera::transport::control
