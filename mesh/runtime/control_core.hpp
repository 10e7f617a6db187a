// control_core: the node's control wiring — membership, election, topology (probes, rows,
// views) and the serving plan — with no threads, sockets, clocks or randomness of its own.
//
// Why a core: `tessera node` and the deterministic simulator must run the same control code.
// Before it, mesh/sim wired the state machines a second time "the way the node does" and drifted
// from it (incarnation at start, topology rows without the bridge-partition rule, planner
// settings, stale views counted as garbage; issue 30). Now the node (mesh/runtime/runtime.cpp)
// and the simulated node (mesh/sim/mesh_node.cpp) each host one control_core and differ only in
// their control_port: what a send, a persist, a clock reading and the engine hand-off are.
//
// Calls come from one thread at a time (the node's loop thread; the simulator's actor), each
// with the caller's `now_ms` (the protocols' clock: monotonic, never decreasing). The core never
// blocks. What it wants done goes through the port, in order: an election output is persisted
// before any of its messages is sent.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/logger.h>
#include <nlohmann/json.hpp>

#include "mesh/election/election.hpp"
#include "mesh/membership/membership.hpp"
#include "mesh/node/config.hpp"
#include "mesh/placement/placement.hpp"
#include "mesh/runtime/messages.hpp"
#include "mesh/serving/engine.hpp"
#include "mesh/topology/topology.hpp"

namespace tessera::mesh::runtime {

/// What the core hands the serving engine whenever the plan, the live members or the view
/// change: exactly serving::engine::set_plan's arguments.
struct serving_facts {
  std::shared_ptr<const placement::plan> plan;
  std::vector<member_id> live;         ///< self first, then live (alive or suspect) members
  std::vector<std::string> endpoints;  ///< client endpoints: ours, then the view's live members'
  std::map<member_id, serving::peer_facts> peers;
};

/// The core's view of the world outside it.
class control_port {
 public:
  virtual ~control_port() = default;
  /// A control message to a member. A member whose link is unknown is loss (the protocols
  /// retry); never blocks.
  virtual void send(member_id to, runtime_msg type, std::string body) = 0;
  /// The answer to a message that came over `link` (a pong): the link it came on, which may
  /// belong to a peer not yet learnt as a member.
  virtual void reply(member_id to, std::string_view link, runtime_msg type, std::string body) = 0;
  /// Stores the election's durable bytes. false: they could not be stored; the core then stops
  /// (a vote that is not durable must not be sent).
  virtual bool persist(const std::string& bytes) = 0;
  /// A monotonic clock in ns, for link round trips (finer than the protocols' ms).
  virtual std::int64_t mono_ns() = 0;
  /// Where member `id` listens ("hexid@tcp://host:port" in the node). `first_hand`: the member
  /// said so itself over its own authenticated link.
  virtual void learn(member_id id, const std::string& address, bool first_hand) = 0;
  /// A membership change, after the core applied it.
  virtual void on_member_event(const member_event& ev) = 0;
  /// The plan, the live members or the view changed: the engine's new facts.
  virtual void serving_changed(serving_facts facts) = 0;
  /// The bulk backend a link to a peer with `caps` would use (topology::link_measure::backend).
  virtual std::uint8_t backend_for(const topology::capabilities& caps) = 0;
  /// Called before each row report: the engine's models may have changed (a fetched model makes
  /// this peer a holder).
  virtual void refresh_caps(topology::capabilities& caps) = 0;
};

/// The state machines' settings as the node derives them from its configuration: one function,
/// so that the simulator's nodes are configured as `tessera node` is.
struct control_settings {
  membership_config membership;
  election_config election;
  placement::planner_config planner;
  /// A link with no pong for this long leaves our topology row (pings go every 500 ms).
  std::uint64_t link_down_ms = 5000;
};
[[nodiscard]] control_settings control_settings_for(const node_config& cfg);

struct core_options {
  member_id self = no_member;
  std::string self_address;   ///< what membership gossips about us
  std::string hex;            ///< our node id as text (status, logs)
  control_settings settings;  ///< self, self_address and the rng seeds are filled in by create()
  std::uint64_t membership_seed = 1;
  std::uint64_t election_seed = 1;
  /// Membership incarnation at start: the node's wall clock in ms, so that a restarted node
  /// refutes what the cluster remembers of its previous life at once.
  std::uint64_t incarnation = 0;
  durable_election_state restored;
  topology::capabilities caps;          ///< ours, sent in pings and row reports
  std::shared_ptr<spdlog::logger> log;  ///< null: spdlog's default logger
};

/// Counters the status document shows; `undecodable` must stay 0 between honest nodes.
struct core_counters {
  std::uint64_t undecodable = 0;    ///< malformed, or a sender speaking for another member
  std::uint64_t stale = 0;          ///< views or plans from a node that is not our leader
  std::uint64_t plans_refused = 0;  ///< a plan from our leader failing validation
  std::uint64_t leader_changes = 0;
};

class control_core {
 public:
  [[nodiscard]] static result<std::unique_ptr<control_core>> create(core_options options,
                                                                    control_port& port);

  /// First steps: an election tick, a join of nobody (membership's own timers), our own row.
  void start(std::uint64_t now_ms);
  /// Joins `id` at `address` (a discovery hint or a peer that introduced itself) unless it is a
  /// member already.
  void join(member_id id, const std::string& address, std::uint64_t now_ms);
  /// Joins the given seeds (the simulator's static seed list).
  void join(std::vector<member_update> seeds, std::uint64_t now_ms);
  /// A control message from member `from` over `link`. false: not a core message type (the
  /// caller handles it). Malformed or forged messages are counted and dropped.
  bool on_message(member_id from, std::string_view link, runtime_msg type, std::string_view body,
                  std::uint64_t now_ms);
  /// Timers: membership, election, pings, row reports, the leader's view and plan resends.
  void tick(std::uint64_t now_ms);
  /// When tick() next has work (protocols' ms).
  [[nodiscard]] std::uint64_t next_wake() const;
  /// Graceful leave of membership and election.
  void leave(std::uint64_t now_ms);

  /// A bulk-link measurement of the link to `id` (mbps 0: failed), for our row: streaming
  /// bandwidth and the small-message round trip.
  void set_bandwidth(member_id id, double mbps, std::uint8_t backend, double bulk_rtt_us = 0);

  [[nodiscard]] bool failed() const { return failed_; }
  [[nodiscard]] bool is_member(member_id id) const { return members_->status_of(id).has_value(); }
  [[nodiscard]] std::vector<member_id> live_members() const;
  /// A peer's capabilities from its last ping or pong.
  [[nodiscard]] const topology::capabilities* peer_caps(member_id id) const;
  [[nodiscard]] const mesh::membership& membership() const { return *members_; }
  [[nodiscard]] const mesh::election& election() const { return *elect_; }
  [[nodiscard]] const topology::topology_state& topology() const { return topo_; }
  [[nodiscard]] const std::shared_ptr<const placement::plan>& plan() const { return plan_; }
  [[nodiscard]] const core_counters& counters() const { return counters_; }
  [[nodiscard]] const topology::capabilities& caps() const { return caps_; }
  /// A member's node id as text (from its membership address), for status and logs.
  [[nodiscard]] std::string name_of(member_id id) const;

  /// The control part of the status document (docs/design/011-node-runtime.md): "node" (role,
  /// term, leader; the caller adds the rest), "membership", "view", "plan", "stats".
  void status_into(nlohmann::ordered_json& j, const std::string& self_endpoint) const;

 private:
  [[nodiscard]] nlohmann::ordered_json view_json() const;  // status "view" (null: none yet)
  [[nodiscard]] nlohmann::ordered_json plan_json() const;  // status "plan" (null: none yet)
  control_core(core_options options, control_port& port, mesh::membership m, mesh::election e);
  void apply(membership_output out, std::uint64_t now_ms);
  void apply(election_output out, std::uint64_t now_ms);
  void refresh_topology_members(std::uint64_t now_ms);
  void publish_if_leader(std::uint64_t now_ms);
  void replan(std::uint64_t now_ms);
  void broadcast_view(const topology::view& v, std::uint64_t now_ms);
  void broadcast_plan();
  void adopt_plan(std::shared_ptr<const placement::plan> p);
  void hand_to_engine();
  void probe_round(std::uint64_t now_ms);
  [[nodiscard]] topology::row_report own_row(std::uint64_t now_ms) const;

  struct link_probe {
    std::deque<std::uint64_t> rtt_us;  // last samples (bounded: 5)
    std::optional<topology::capabilities> caps;
    double bandwidth_mbps = 0;
    double bulk_rtt_us = 0;
    std::uint8_t measured_backend = 0;
    std::uint64_t last_pong_ms = 0;  // 0: never heard back
  };

  core_options opt_;
  control_port& port_;
  spdlog::logger& log_;
  topology::capabilities caps_;
  std::optional<mesh::membership> members_;
  std::optional<mesh::election> elect_;
  topology::topology_state topo_;
  std::shared_ptr<const placement::plan> plan_;
  std::optional<std::uint64_t> membership_timer_, election_timer_;
  std::uint64_t next_probe_ms_ = 0, next_report_ms_ = 0, next_view_resend_ms_ = 0;
  std::uint64_t leading_since_ms_ = 0;  // when this node last became leader (ready_to_plan)
  std::uint64_t ping_seq_ = 0;
  std::map<member_id, link_probe> probes_;
  core_counters counters_;
  bool failed_ = false;
};

}  // namespace tessera::mesh::runtime
