// A simulated mesh node: membership + election wired together the way the real node wires them
// (membership events feed election as peer_status_changed), with every message msgpack-encoded
// on the simulated wire and the election's durable state stored in the node's durable bytes.
// With `serving` on, also the serving layer's control as mesh/runtime runs it: row reports to the
// leader every second (capabilities: one model, memory), the leader's topology view and its plan
// (serving::plan_from_view, sticky), re-sent every 2 s, adopted by serving::should_adopt.
// With `serve_requests`, also the peers' side of the client protocol (see mesh_node_options).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mesh/election/election.hpp"
#include "mesh/membership/membership.hpp"
#include "mesh/placement/placement.hpp"
#include "mesh/serving/ledger.hpp"
#include "mesh/serving/protocol.hpp"
#include "mesh/sim/world.hpp"
#include "mesh/topology/topology.hpp"

namespace tessera::mesh::sim {

/// Wire channels of the bundle.
inline constexpr std::uint8_t membership_channel = 1;
inline constexpr std::uint8_t election_channel = 2;
inline constexpr std::uint8_t report_channel = 3;  ///< topology row reports, to the leader
inline constexpr std::uint8_t view_channel = 4;    ///< the leader's view, to every live member
inline constexpr std::uint8_t plan_channel = 5;    ///< the leader's serving plan
inline constexpr std::uint8_t request_channel = 6;   ///< client -> peer: a serving::request
inline constexpr std::uint8_t response_channel = 7;  ///< peer -> client: a serving::response

struct mesh_node_options {
  membership_config membership;      ///< self and rng_seed are filled in per node
  election_config election;          ///< self and rng_seed are filled in per node
  std::vector<member_update> seeds;  ///< joined at every start (discovery hints)
  /// The serving layer (topology, view, plan). Every node holds `model` with `memory_mb` free.
  bool serving = false;
  placement::model_spec model;
  std::uint64_t memory_mb = 4096;
  /// Serve clients' requests (needs `serving`): what the engine decides, with the engine's own
  /// pure parts — serving::admit for duplicates and resumptions, serving::decide for who takes a
  /// request (over this node's plan and live members) — and a modelled generator: an accepted
  /// stream re-reads prompt + resume (`prefill_ms`), then sends one token every `token_ms`, each
  /// a function of the request, the previous token and the index (sim_token), then "done".
  bool serve_requests = false;
  std::uint32_t prefill_ms = 10;
  std::uint32_t token_ms = 20;
};

/// The modelled generator's token at `index` after `prev` (the last prompt-side token: -1 at the
/// start): deterministic, like greedy decoding, and dependent on the history, so that a stream
/// resumed from wrong tokens goes wrong visibly.
[[nodiscard]] std::int32_t sim_token(const serving::request& r, std::int32_t prev,
                                     std::uint32_t index, std::uint32_t vocab);
/// The whole stream a single peer would produce for `r` (max_tokens tokens).
[[nodiscard]] std::vector<std::int32_t> sim_reference(const serving::request& r,
                                                      std::uint32_t vocab);

/// A node's plan as it changed: when, and the plan (null: none).
struct observed_plan {
  std::uint64_t at_ms = 0;
  std::shared_ptr<const placement::plan> plan;
};

/// One membership event as a node saw it, with the global time (for scenario tests).
struct observed_member_event {
  std::uint64_t at_ms = 0;
  member_event event;
};

class mesh_node : public sim_node {
 public:
  mesh_node(member_id self, const mesh_node_options& options, std::uint64_t seed);

  void on_start(node_context& ctx) override;
  void on_message(node_context& ctx, const envelope& msg) override;
  void on_timer(node_context& ctx) override;

  /// Graceful leave of both state machines (what the node does on SIGTERM).
  void leave(node_context& ctx);

  [[nodiscard]] const mesh::election& election() const { return *election_; }
  [[nodiscard]] const mesh::membership& membership() const { return *membership_; }
  [[nodiscard]] const std::vector<observed_member_event>& member_events() const {
    return member_events_;
  }
  /// Wire messages that failed to decode (must stay 0 between honest nodes).
  [[nodiscard]] std::uint64_t undecodable() const { return undecodable_; }
  /// Serving: the plan in force (null: none yet), and plans refused as invalid (must stay 0).
  [[nodiscard]] const std::shared_ptr<const placement::plan>& plan() const { return plan_; }
  [[nodiscard]] std::uint64_t plans_refused() const { return plans_refused_; }
  [[nodiscard]] const std::optional<topology::topology_state>& topology() const { return topo_; }

 private:
  void apply(node_context& ctx, membership_output out);
  void apply(node_context& ctx, election_output out);
  void rearm(node_context& ctx);
  // serving layer
  void refresh_members(node_context& ctx);
  void report(node_context& ctx);
  void publish_if_leader(node_context& ctx);
  void replan(node_context& ctx);
  void broadcast_view(node_context& ctx);
  void broadcast_plan(node_context& ctx);
  void adopt(std::shared_ptr<const placement::plan> p);
  // requests
  void on_request(node_context& ctx, member_id client, serving::request q);
  void respond(node_context& ctx, member_id client, const serving::response& r);
  void generate(node_context& ctx);
  [[nodiscard]] serving::response base(const serving::request& q, std::string_view kind) const;
  struct stream {
    serving::request req;
    member_id client = no_member;
    std::uint32_t index = 0;  // the next token's index
    std::int32_t prev = -1;   // the token before it
    std::uint64_t next_ms = 0;
  };

  member_id self_;
  mesh_node_options options_;
  std::optional<mesh::membership> membership_;
  std::optional<mesh::election> election_;
  std::optional<std::uint64_t> membership_timer_;
  std::optional<std::uint64_t> election_timer_;
  std::vector<observed_member_event> member_events_;
  std::uint64_t undecodable_ = 0;
  std::optional<topology::topology_state> topo_;
  std::shared_ptr<const placement::plan> plan_;
  std::uint64_t plans_refused_ = 0;
  std::uint64_t next_report_ms_ = 0, next_view_resend_ms_ = 0;
  std::uint64_t leading_since_ms_ = 0;  // when this node last became leader (ready_to_plan)
  std::map<std::string, stream> streams_;  // running, by request id
  serving::finished_ledger finished_;
};

/// Options for a cluster of nodes 1..n with default timeouts, each seeded with all the others
/// (address "sim:<id>").
[[nodiscard]] mesh_node_options cluster_options(std::size_t n);
/// As cluster_options, with the serving layer on and a small model every node can hold.
[[nodiscard]] mesh_node_options serving_cluster_options(std::size_t n);

/// A world with nodes 1..n added (not started) whose factory builds mesh_nodes from `options`.
[[nodiscard]] std::unique_ptr<world> make_mesh_world(std::uint64_t seed, std::size_t n,
                                                     const mesh_node_options& options);

/// Encodes any MSGPACK_DEFINE'd value.
template <class T>
bytes encode(const T& value);
/// Decodes; nullopt when the bytes are not a valid T.
template <class T>
std::optional<T> decode(const bytes& data);

}  // namespace tessera::mesh::sim
