// SWIM-style membership and failure detection as a pure state machine.
//
// Owns: the member table of one node (who is in the cluster, with which incarnation and status),
// failure detection by probing, dissemination by piggyback, join and graceful leave.
// Must not touch: sockets, threads, clocks, randomness sources other than its own seeded det_rng.
// The node feeds it inputs with the current time and carries out its outputs (send these
// messages, call tick at this time, publish these events).
//
// Member status, as seen by one observer (i = incarnation; precedence rule in apply_update()):
//
//                 probe round fails           suspicion_timeout_ms passes
//     +-------+  (direct + k indirect) +---------+ without refutation  +------+
//  -->| alive |----------------------->| suspect |-------------------->| dead |
//     +-------+<-----------------------+---------+                     +------+
//       ^  |     alive(i' > i): the member refuted                        |
//       |  |                                                              |
//       |  +---- leave / left(i) ----> +------+    alive(i' > i): rejoin  |
//       |                              | left |---------------------------+-> alive
//       +------------------------------+------+<--------------------------+
//
//   A dead member (or a seed not known live) gets a join every reconnect_interval_ms, so two
//   sides of a healed partition meet again.
//   dead and left entries stay as tombstones for tombstone_ms (so a stale alive(i) cannot
//   resurrect them), then are forgotten. A node that hears suspect/dead/left about itself with
//   incarnation >= its own refutes: it bumps its incarnation and gossips alive.
//
// Probe round (every probe_interval_ms): ping one member (shuffled round robin over alive and
// suspect members); no ack within probe_timeout_ms -> ping_req to indirect_probes others, which
// ping the target on our behalf and relay its ack, or send a nack when the target has not
// answered them within 4/5 of their own probe_timeout_ms; no ack (direct or relayed) by the end
// of the round -> the target becomes suspect.
//
// Lifeguard (Dadgar et al., "Lifeguard: Local Health Awareness for More Accurate Failure
// Detection", 2018), because a node starved of CPU is the likeliest source of false suspicion:
//  - Local health: a score in [0, max_health] that rises when this node shows signs of being the
//    slow one (a probe round failed without the helpers' nacks, it had to refute a suspicion of
//    itself, it was run late) and falls with each direct ack. Probe interval and timeout are
//    stretched by (1 + health).
//  - Stalls: a step that comes more than stall_threshold_ms after the timer this machine asked
//    for means the host did not run it; every pending deadline moves by the lateness, so the
//    time it was absent is not counted against the peers it could not hear.
//  - Dynamic suspicion: an unconfirmed suspicion lasts suspicion_max_mult x
//    suspicion_timeout_ms; each other member that independently suspects the same incarnation
//    shortens it (log scale) down to suspicion_timeout_ms at suspicion_confirmations (capped by
//    the alive members that could confirm: with none, the minimum applies at once). A crashed
//    member is confirmed by everyone at once; a member only one slow node cannot hear is not.
//  - Buddy: a message to a member we hold suspect carries that suspicion first, so it refutes
//    at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/result.hpp"
#include "mesh/membership/ids.hpp"

namespace tessera::mesh {

/// Status of a member as seen by this node. Stable numbers: they travel in messages.
enum class member_status : std::uint8_t { alive = 0, suspect = 1, dead = 2, left = 3 };
const char* to_string(member_status status) noexcept;

/// One piece of gossip: "member `id` is `status` at `incarnation`, reachable at `address`".
/// `address` is opaque to membership (the node puts its control endpoint there); empty = unknown.
struct member_update {
  member_id id = no_member;
  std::uint64_t incarnation = 0;
  std::uint8_t status = 0;  ///< a member_status
  std::string address;
  /// For a suspect update: the member whose own probe accused it (Lifeguard confirmations count
  /// distinct accusers); no_member otherwise. Last field: older encodings decode with none.
  member_id origin = no_member;
  MSGPACK_DEFINE(id, incarnation, status, address, origin);
};

/// Message kinds. Stable numbers: they travel on the wire.
enum class membership_message_type : std::uint8_t {
  ping = 1,      ///< are you alive? (seq); also sent by a relay on behalf of a ping_req
  ack = 2,       ///< answer to ping (seq); `target` = the probed node when relayed
  ping_req = 3,  ///< please ping `target` for me and relay its ack (seq)
  join = 4,      ///< a new node asks a seed for the member list
  join_ack = 5,  ///< the seed's full member list (updates), bounded by max_members
  leave = 6,     ///< graceful leave, sent directly to every member at once
  nack = 7,      ///< a ping_req helper's "the target has not answered me yet" (seq, target)
};

/// Every membership message. `sender` is the sender's own alive record (so an unknown sender is
/// learnt from any message); `updates` is the piggybacked gossip, at most
/// max_updates_per_message entries (join_ack: at most max_members).
struct membership_message {
  std::uint8_t type = 0;  ///< a membership_message_type
  member_update sender;
  member_id to = no_member;
  std::uint64_t seq = 0;
  member_id target = no_member;
  std::vector<member_update> updates;
  MSGPACK_DEFINE(type, sender, to, seq, target, updates);
};

/// Tunables. Defaults are for a LAN/loopback cluster (justification in mesh/README.md): a
/// crashed member is suspected within ~1-2 probe rounds of the first probe that misses it and
/// declared dead suspicion_timeout_ms later. Leader failover does not wait for this: election
/// has its own, faster lease/timeout (docs/design/002-election.md).
struct membership_config {
  member_id self = no_member;
  std::string self_address;
  std::uint64_t rng_seed = 1;
  std::uint32_t probe_interval_ms = 100;     ///< one probe round per interval
  std::uint32_t probe_timeout_ms = 40;       ///< direct ack deadline before indirect probes
  std::uint32_t indirect_probes = 3;         ///< k members asked to ping_req
  std::uint32_t suspicion_timeout_ms = 400;  ///< suspect -> dead without refutation
  std::uint32_t tombstone_ms = 30'000;       ///< dead/left entries are kept this long
  std::uint32_t join_retry_ms = 500;         ///< join re-sent to seeds until answered
  /// Every interval, one join goes to a random dead member or a seed not known live: after a
  /// partition heals, both sides hold each other dead and neither probes the other; this is how
  /// they meet again (and refute).
  std::uint32_t reconnect_interval_ms = 1'000;
  std::uint32_t retransmit_mult = 3;        ///< gossip sent retransmit_mult*ceil(log2(n+1)) times
  std::size_t max_members = 128;            ///< table bound (tombstones included)
  std::size_t max_piggyback = 64;           ///< queued gossip bound; at the bound the most-sent
                                            ///< entry is evicted (counted)
  std::size_t max_updates_per_message = 8;  ///< piggyback entries per message
  std::size_t max_relays = 16;              ///< concurrent ping_req relays; beyond: refused
  std::size_t max_address_bytes = 255;      ///< longer addresses are malformed input
  /// Lifeguard local health: probe interval and timeout are stretched by (1 + health), health
  /// bounded by this.
  std::uint32_t max_health = 8;
  /// A step this much later than the timer asked for is a stall of this node (not its peers').
  std::uint32_t stall_threshold_ms = 50;
  /// An unconfirmed suspicion lasts suspicion_max_mult x suspicion_timeout_ms.
  std::uint32_t suspicion_max_mult = 4;
  /// Independent accusers that bring a suspicion down to suspicion_timeout_ms.
  std::uint32_t suspicion_confirmations = 2;

  /// Checks the values are usable; the error names the bad field.
  [[nodiscard]] result<void> validate() const;
};

/// A status change to publish to subscribers (the node routes these to subscribing actors and
/// to election as peer_status_changed).
struct member_event {
  member_id id = no_member;
  member_status status = member_status::alive;
  std::uint64_t incarnation = 0;
  std::string address;
  bool operator==(const member_event&) const = default;
};

/// Inputs.
struct membership_tick {};  ///< a timer fired (or any time: early ticks are harmless)
struct membership_receive {
  membership_message message;
};
struct membership_join {  ///< contact these seeds (id + address) to enter the cluster
  std::vector<member_update> seeds;
};
struct membership_leave {};  ///< graceful leave: announced at once, then silent
using membership_input =
    std::variant<membership_tick, membership_receive, membership_join, membership_leave>;

/// What one step asks the node to do.
struct membership_output {
  std::vector<membership_message> messages;  ///< send each to message.to
  std::vector<member_event> events;          ///< publish, in order
  /// The single timer: call step(tick) at or after this time (replaces any earlier request;
  /// nullopt = no timer needed).
  std::optional<std::uint64_t> timer_at_ms;
};

/// Counters for what was dropped at a bound or refused as malformed.
struct membership_counters {
  std::uint64_t piggyback_evicted = 0;  ///< gossip evicted because max_piggyback was reached
  std::uint64_t members_refused = 0;    ///< new members refused because max_members was reached
  std::uint64_t relays_refused = 0;     ///< ping_req refused because max_relays was reached
  std::uint64_t malformed = 0;          ///< messages/updates rejected as malformed
  std::uint64_t suspicions = 0;         ///< members this node suspected
  std::uint64_t refutations = 0;        ///< times this node refuted gossip about itself
  std::uint64_t stalls = 0;             ///< steps run late by more than stall_threshold_ms
  std::uint64_t nacks_sent = 0;         ///< as a ping_req helper
  std::uint64_t nacks_missed = 0;       ///< helpers that sent neither ack nor nack in time
  std::uint64_t confirmations = 0;      ///< independent accusers heard of members held suspect
};

/// One member as seen by this node.
struct member_info {
  member_id id = no_member;
  std::uint64_t incarnation = 0;
  member_status status = member_status::alive;
  std::string address;
  std::uint64_t changed_ms = 0;  ///< when status last changed (moved on by stalls)
  /// While suspect: who accused it (first the accuser, then independent confirmations), at
  /// most suspicion_confirmations + 1 entries.
  std::vector<member_id> accusers;
};

/// The SWIM membership state machine of one node. Deterministic: the same inputs at the same
/// times with the same config produce the same outputs.
class membership {
 public:
  /// Validates `cfg` and builds the state machine (self alive at incarnation `incarnation`).
  [[nodiscard]] static result<membership> create(const membership_config& cfg,
                                                 std::uint64_t incarnation = 0);

  /// Feeds one input at local time `now_ms` (monotonic, never decreasing across calls).
  [[nodiscard]] membership_output step(const membership_input& input, std::uint64_t now_ms);

  /// Members other than self, including tombstones, ordered by id.
  [[nodiscard]] const std::map<member_id, member_info>& members() const { return members_; }
  /// Status of `id` as seen here (self: alive or left); nullopt when unknown.
  [[nodiscard]] std::optional<member_status> status_of(member_id id) const;
  [[nodiscard]] std::uint64_t incarnation() const { return incarnation_; }
  [[nodiscard]] member_id self() const { return cfg_.self; }
  [[nodiscard]] const membership_counters& counters() const { return counters_; }
  /// Number of members (self included) currently alive or suspect.
  [[nodiscard]] std::size_t live_count() const;
  /// Lifeguard local health score (0 = healthy); see the header comment.
  [[nodiscard]] std::uint32_t health() const { return health_; }
  /// The probe interval in force: probe_interval_ms x (1 + health).
  [[nodiscard]] std::uint32_t probe_interval_now() const;
  /// While `m` is suspect: when it becomes dead, given its accusers and who could confirm.
  [[nodiscard]] std::uint64_t suspect_deadline(const member_info& m) const;

 private:
  explicit membership(const membership_config& cfg, std::uint64_t incarnation);

  struct piggyback_entry {
    member_update update;
    std::uint32_t transmits = 0;
  };
  struct relay {
    member_id requester = no_member;
    std::uint64_t requester_seq = 0;
    member_id target = no_member;
    std::uint64_t deadline_ms = 0;
    std::uint64_t nack_at_ms = 0;  ///< the target's ack has not come by then: nack the requester
    bool nacked = false;
  };
  enum class probe_phase : std::uint8_t { idle, direct, indirect };

  void on_tick(std::uint64_t now_ms, membership_output& out);
  void on_receive(const membership_message& msg, std::uint64_t now_ms, membership_output& out);
  void on_join(const membership_join& join, std::uint64_t now_ms, membership_output& out);
  void on_leave(std::uint64_t now_ms, membership_output& out);

  void run_probe_round(std::uint64_t now_ms, membership_output& out);
  void send_indirect_probes(membership_output& out);
  void expire(std::uint64_t now_ms, membership_output& out);
  void send_joins(membership_output& out);
  void reconnect(membership_output& out);

  void apply_update(const member_update& u, std::uint64_t now_ms, membership_output& out);
  void on_stall(std::uint64_t late_ms);
  void adjust_health(int delta);
  void accuse(member_info& m, member_id accuser);
  [[nodiscard]] std::uint32_t probe_timeout_now() const;
  void refute(std::uint64_t seen_incarnation);
  void set_status(member_info& m, member_status s, std::uint64_t incarnation, std::uint64_t now_ms,
                  membership_output& out);
  bool insert_member(const member_update& u, std::uint64_t now_ms);
  void enqueue_gossip(const member_update& u);
  void attach_gossip(membership_message& msg, member_id to);
  [[nodiscard]] bool valid(const member_update& u) const;
  [[nodiscard]] member_update self_update() const;
  [[nodiscard]] member_update update_of(const member_info& m) const;
  [[nodiscard]] membership_message make(membership_message_type type, member_id to,
                                        std::uint64_t seq, member_id target);
  [[nodiscard]] member_id next_probe_target();
  [[nodiscard]] std::uint32_t retransmit_limit() const;
  [[nodiscard]] std::optional<std::uint64_t> next_timer() const;

  membership_config cfg_;
  det_rng rng_;
  std::uint64_t incarnation_ = 0;
  bool leaving_ = false;
  bool started_ = false;
  std::map<member_id, member_info> members_;
  std::vector<piggyback_entry> piggyback_;
  std::map<std::uint64_t, relay> relays_;  // by the seq we used to ping the target
  std::vector<member_id> probe_order_;
  std::size_t probe_index_ = 0;
  std::uint64_t next_seq_ = 1;
  std::uint64_t next_probe_ms_ = 0;
  member_id probe_target_ = no_member;
  std::uint64_t probe_seq_ = 0;
  std::uint64_t probe_direct_deadline_ms_ = 0;
  probe_phase probe_phase_ = probe_phase::idle;
  std::uint32_t nacks_expected_ = 0;  // helpers asked in this round
  std::uint32_t nacks_heard_ = 0;     // of them, nacks received
  std::uint32_t health_ = 0;
  std::uint64_t expected_wake_ms_ = 0;  // the timer the last step asked for (0: none)
  std::vector<member_update> seeds_;
  bool joined_ = false;
  std::uint64_t next_join_ms_ = 0;
  std::uint64_t next_reconnect_ms_ = 0;
  membership_counters counters_;
};

}  // namespace tessera::mesh
