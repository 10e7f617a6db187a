// Raft-style leader election (no replicated log beyond the member set) as a pure state machine.
//
// Owns: term, vote, role, the leader this node follows, and the committed member set ("config").
// Must not touch: sockets, threads, clocks; randomness only from its own seeded det_rng.
// Design and the membership-change rule: docs/design/001-election.md.
//
//                      election timeout, member of own config
//   +----------+ ----------------------------------------------> +---------------+
//   | follower |  <--- pre-vote rejected with a higher term ---- | pre_candidate |
//   +----------+  <--- heartbeat from a leader (term >= ours) -- +---------------+
//     ^  ^  ^                                                        | majority of
//     |  |  |                                                        | pre-votes
//     |  |  |   higher term seen / heartbeat (term >= ours)          v
//     |  |  +------------------------------------------------- +-----------+
//     |  |                                                     | candidate | --+ timeout:
//     |  |                                                     +-----------+ <-+ pre-vote again
//     |  | CheckQuorum fails (no majority heard within              | majority of votes
//     |  | election_timeout), or leave, or higher term while         v
//     |  | quorum is stale                                     +--------+
//     |  +-----------------------------------------------------| leader |--+ higher term from a
//     |                                                        +--------+  | member while quorum
//     +--- bootstrap (term 0, empty config, lowest alive id) ---^    ^     | is fresh: re-elect
//                                                                    +-----+ itself (candidate
//                                                                      at that term + 1, votes
//                                                                      forced from followers)
//
// Guarantees (checked by the simulator, tests/mesh/sim): at most one leader per term; a node
// that cannot reach a majority of its config never becomes leader and a leader that loses its
// majority steps down within two election timeouts (CheckQuorum runs once per timeout); a rejoining node (any term) does not change
// who leads a healthy majority; after faults heal, one leader that every member follows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <variant>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/result.hpp"
#include "mesh/membership/ids.hpp"
#include "mesh/membership/membership.hpp"

namespace tessera::mesh {

/// The agreed member set. Changes one member at a time, each committed (acked by a majority of
/// the new set) before the next is proposed. Ordered like a Raft log entry by (term, version).
struct member_config {
  std::uint64_t version = 0;       ///< 0 = no config yet (never bootstrapped nor joined)
  std::uint64_t term = 0;          ///< term of the leader that created this version
  member_id genesis = no_member;   ///< the node that bootstrapped this cluster lineage
  std::vector<member_id> members;  ///< sorted, unique, at most max_members
  MSGPACK_DEFINE(version, term, genesis, members);

  [[nodiscard]] bool contains(member_id id) const;
  [[nodiscard]] std::size_t majority() const { return members.size() / 2 + 1; }
  bool operator==(const member_config&) const = default;
};

/// What must survive a restart (stored by the node in its data dir before the messages of the
/// same step are sent): losing it could let this node vote twice in one term.
struct durable_election_state {
  std::uint64_t term = 0;
  member_id voted_for = no_member;
  member_config config;
  MSGPACK_DEFINE(term, voted_for, config);
  bool operator==(const durable_election_state&) const = default;
};

enum class election_role : std::uint8_t {
  follower = 0,
  pre_candidate = 1,
  candidate = 2,
  leader = 3
};
const char* to_string(election_role role) noexcept;

/// Message kinds. Stable numbers: they travel on the wire.
enum class election_message_type : std::uint8_t {
  pre_vote = 1,       ///< would you vote for me at `term` (not yet ours)? config = my version
  pre_vote_resp = 2,  ///< granted or not; term = the asked term if granted, else voter's term
  vote = 3,           ///< vote for me at `term`; force = sent by your current leader
  vote_resp = 4,
  heartbeat = 5,       ///< leader -> members and learners: term, full config, commit_version
  heartbeat_resp = 6,  ///< granted = accepted; config.{version,term} = the config now held
};

/// Every election message. Vote requests and responses carry only config.{version,term,genesis}
/// (members empty); heartbeats carry the full member list (bounded by max_members).
struct election_message {
  std::uint8_t type = 0;  ///< an election_message_type
  member_id from = no_member;
  member_id to = no_member;
  std::uint64_t term = 0;
  bool granted = false;
  bool force = false;
  std::uint64_t commit_version = 0;
  member_config config;
  MSGPACK_DEFINE(type, from, to, term, granted, force, commit_version, config);
};

/// Tunables; defaults for a LAN/loopback cluster (a dead leader is replaced in about
/// election_timeout_ms .. 2*election_timeout_ms plus two round trips).
struct election_config {
  member_id self = no_member;
  std::uint64_t rng_seed = 1;
  std::uint32_t heartbeat_interval_ms = 50;
  /// Followers time out after a random value in [election_timeout_ms, 2*election_timeout_ms);
  /// it is also the CheckQuorum window. The lease (no votes granted while a leader was heard
  /// this recently) is election_timeout_ms - heartbeat_interval_ms.
  std::uint32_t election_timeout_ms = 300;
  /// The leader removes a member that membership has reported dead for this long, or left.
  std::uint32_t remove_dead_after_ms = 2'000;
  /// A never-configured node waits this long (hearing no leader) before bootstrapping.
  std::uint32_t bootstrap_wait_ms = 600;
  /// ... and bootstraps only while it sees at least this many alive nodes (self included).
  std::uint32_t bootstrap_expect = 1;
  std::size_t max_members = 64;  ///< config bound; alive nodes beyond it are not added (counted)

  [[nodiscard]] result<void> validate() const;
};

/// Inputs.
struct election_tick {};
struct election_receive {
  election_message message;
};
/// Membership's view of a peer (the node forwards membership events here).
struct peer_status_changed {
  member_id id = no_member;
  member_status status = member_status::alive;
};
/// Graceful leave: stop leading (if leading) and never campaign again.
struct election_leave {};
using election_input =
    std::variant<election_tick, election_receive, peer_status_changed, election_leave>;

/// Events for subscribers: one struct with a kind (not a variant) so that the node can forward
/// it as is.
enum class election_event_kind : std::uint8_t {
  leader_changed = 0,  ///< `leader` is the leader now known for `term` (no_member = none)
  role_changed = 1,    ///< this node's `role` in `term`
  config_changed = 2,  ///< `config` adopted/proposed (committed = false) or committed (true)
};
struct election_event {
  election_event_kind kind = election_event_kind::leader_changed;
  std::uint64_t term = 0;
  member_id leader = no_member;
  election_role role = election_role::follower;
  member_config config;
  bool committed = false;
};

struct election_output {
  std::vector<election_message> messages;  ///< send each to message.to
  std::vector<election_event> events;
  /// durable() changed in this step: store it before sending `messages`.
  bool persist = false;
  /// The single timer: call step(tick) at or after this time (replaces earlier requests).
  std::optional<std::uint64_t> timer_at_ms;
};

struct election_counters {
  std::uint64_t elections_started = 0;  ///< became candidate
  std::uint64_t pre_votes_started = 0;
  std::uint64_t votes_ignored_lease = 0;  ///< (pre-)vote requests ignored while a lease was fresh
  std::uint64_t check_quorum_step_downs = 0;
  std::uint64_t forced_reelections = 0;
  std::uint64_t members_refused = 0;  ///< alive nodes not added: config at max_members
  std::uint64_t malformed = 0;
};

/// The election state machine of one node.
class election {
 public:
  /// Validates `cfg`; `restored` is what the node persisted last (default: fresh node).
  [[nodiscard]] static result<election> create(const election_config& cfg,
                                               const durable_election_state& restored = {});

  /// Feeds one input at local time `now_ms` (monotonic).
  [[nodiscard]] election_output step(const election_input& input, std::uint64_t now_ms);

  [[nodiscard]] const durable_election_state& durable() const { return d_; }
  [[nodiscard]] election_role role() const { return role_; }
  [[nodiscard]] std::uint64_t term() const { return d_.term; }
  [[nodiscard]] member_id leader() const { return leader_; }
  [[nodiscard]] const member_config& config() const { return d_.config; }
  [[nodiscard]] std::uint64_t commit_version() const { return commit_version_; }
  [[nodiscard]] const election_counters& counters() const { return counters_; }

 private:
  explicit election(const election_config& cfg, const durable_election_state& restored);

  struct ack_state {
    std::uint64_t last_ack_ms = 0;
    std::uint64_t version = 0;
    std::uint64_t config_term = 0;
  };
  struct peer_state {
    member_status status = member_status::alive;
    std::uint64_t since_ms = 0;
  };

  void on_tick(std::uint64_t now_ms, election_output& out);
  void on_receive(const election_message& m, std::uint64_t now_ms, election_output& out);
  void on_peer(const peer_status_changed& p, std::uint64_t now_ms, election_output& out);
  void on_leave(std::uint64_t now_ms, election_output& out);

  void on_pre_vote(const election_message& m, std::uint64_t now_ms, election_output& out);
  void on_vote(const election_message& m, std::uint64_t now_ms, election_output& out);
  void on_heartbeat(const election_message& m, std::uint64_t now_ms, election_output& out);
  void on_heartbeat_resp(const election_message& m, std::uint64_t now_ms, election_output& out);
  void on_vote_resp(const election_message& m, std::uint64_t now_ms, election_output& out);

  void maybe_bootstrap(std::uint64_t now_ms, election_output& out);
  void start_pre_vote(std::uint64_t now_ms, election_output& out);
  void start_election(std::uint64_t now_ms, bool force, election_output& out);
  void become_follower(std::uint64_t term, member_id leader, std::uint64_t now_ms,
                       election_output& out);
  void become_leader(std::uint64_t now_ms, election_output& out);
  void send_heartbeats(std::uint64_t now_ms, election_output& out);
  void check_quorum(std::uint64_t now_ms, election_output& out);
  void change_config(std::uint64_t now_ms, election_output& out);
  void propose(member_config next, election_output& out);
  void maybe_commit(election_output& out);
  void adopt_config(const member_config& c, election_output& out);
  void set_leader(member_id leader, election_output& out);
  void set_role(election_role role, election_output& out);
  void reset_election_deadline(std::uint64_t now_ms);

  [[nodiscard]] bool lease_fresh(std::uint64_t now_ms) const;
  [[nodiscard]] bool quorum_fresh(std::uint64_t now_ms) const;
  [[nodiscard]] bool up_to_date(const member_config& c) const;
  [[nodiscard]] bool may_campaign() const;
  [[nodiscard]] std::vector<member_id> learners(std::uint64_t now_ms) const;
  [[nodiscard]] election_message make(election_message_type type, member_id to) const;
  [[nodiscard]] std::optional<std::uint64_t> next_timer() const;

  election_config cfg_;
  det_rng rng_;
  durable_election_state d_;
  election_role role_ = election_role::follower;
  member_id leader_ = no_member;
  bool started_ = false;
  bool leaving_ = false;
  bool heard_cluster_ = false;
  std::uint64_t boot_ms_ = 0;
  std::uint64_t last_leader_contact_ms_ = 0;
  std::uint64_t election_deadline_ms_ = 0;
  std::set<member_id> votes_;
  bool vote_force_ = false;
  // Leader state.
  std::map<member_id, ack_state> acks_;
  std::uint64_t next_heartbeat_ms_ = 0;
  std::uint64_t check_quorum_ms_ = 0;
  bool committed_in_term_ = false;
  std::uint64_t commit_version_ = 0;
  // Membership's view.
  std::map<member_id, peer_state> peers_;
  election_counters counters_;
};

}  // namespace tessera::mesh
