// Safety and liveness checkers over a simulated mesh (the same properties the chaos runner checks
// on real processes).
//
//  - at most one leader per term, over the whole history;
//  - no node becomes leader while a clean partition leaves it without a majority of its config,
//    and a leader cut off in a minority steps down within the CheckQuorum bound;
//  - after healing: one leader, followed by every node, all holding the same committed config
//    that contains every node (converged(), polled by the test within a bound).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mesh/sim/client_node.hpp"
#include "mesh/sim/mesh_node.hpp"
#include "mesh/sim/world.hpp"

namespace tessera::mesh::sim {

class election_checker {
 public:
  /// `step_down_bound_ms`: how long a leader may stay leader on a minority side (CheckQuorum's
  /// election timeout, plus the heartbeat that observes it, plus slack for clock skew).
  election_checker(world& w, std::uint64_t step_down_bound_ms);

  /// Inspects every node; call after each event (world::set_observer).
  void observe();

  [[nodiscard]] const std::vector<std::string>& violations() const { return violations_; }
  /// term -> leader, over the whole run.
  [[nodiscard]] const std::map<std::uint64_t, member_id>& leaders() const { return leaders_; }

 private:
  [[nodiscard]] bool side_has_majority(member_id id, const member_config& cfg) const;

  world& world_;
  std::uint64_t step_down_bound_ms_;
  std::map<std::uint64_t, member_id> leaders_;
  std::map<member_id, std::uint64_t> leader_term_;        // node -> term it leads (0 = not leader)
  std::map<member_id, std::uint64_t> minority_since_ms_;  // leader -> since when on a minority side
  std::vector<std::vector<member_id>> partition_;
  std::vector<std::string> violations_;
};

/// Serving-layer safety over the whole run (nodes with the serving layer on):
///  - a plan epoch names one content: two nodes never hold different plans with the same epoch
///    (epochs are (term, version) and one term has one leader);
///  - a node's plan epoch never goes back (until it restarts: plans are not durable);
///  - no node refuses a plan as invalid (honest leaders only publish valid plans).
class plan_checker {
 public:
  explicit plan_checker(world& w) : world_(w) {}
  void observe();
  [[nodiscard]] const std::vector<std::string>& violations() const { return violations_; }
  /// Distinct plan epochs seen.
  [[nodiscard]] std::size_t epochs() const { return contents_.size(); }

 private:
  world& world_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> contents_;  // epoch -> hash
  // What observe() last saw of a node that held a plan.
  struct node_seen {
    const mesh_node* node = nullptr;  // which incarnation: a restarted node may start over
    std::pair<std::uint64_t, std::uint64_t> epoch{};
    // The plan as last hashed, and its hash. A plan is immutable (shared_ptr<const plan>) and held
    // here, so the same pointer is the same content: hashing (msgpack of every model's groups) is
    // then skipped. Without this, hashing every node's plan after every event was a fifth of the
    // many-seed simulations' time.
    std::shared_ptr<const placement::plan> hashed;
    std::uint64_t hash = 0;
  };
  std::map<member_id, node_seen> seen_;
  std::vector<std::string> violations_;
};

/// Nullopt when every up node holds the leader's plan (same epoch), that plan serves the model
/// and every rank of it is an up node, and every up node serves (every node can hold the model);
/// otherwise what differs. Call once converged() holds.
[[nodiscard]] std::optional<std::string> plans_converged(const world& w);

/// Requests of the world's client_nodes, once they are all done (client_node::all_done):
///  - every published request ended in exactly one outcome, and it is a completed stream (in
///    these runs the cluster always heals and every peer can hold the model, so an error — no
///    capacity, a timeout, attempts exhausted — is a failure too);
///  - the indices handed to the caller are 0..k-1, each once, in order;
///  - the tokens equal the single-peer reference (sim_reference), across every resumption.
struct request_report {
  std::uint64_t requests = 0, completed = 0, resumed = 0, tokens = 0, publications = 0;
  std::uint32_t max_attempts = 0;
  std::vector<std::uint64_t> latency_ms;  ///< publish -> outcome, per request
  std::vector<std::string> violations;
};
[[nodiscard]] request_report check_requests(const world& w, std::uint32_t vocab);

/// The client_node of `id`, or nullptr (down, or a mesh node).
[[nodiscard]] const client_node* client_node_of(const world& w, member_id id);

/// The mesh_node of `id`, or nullptr while down.
[[nodiscard]] const mesh_node* mesh_node_of(const world& w, member_id id);

/// Nullopt when every up, unpaused node follows the same leader in the same term, and all hold
/// the same committed config whose members are exactly the up nodes; otherwise what differs.
[[nodiscard]] std::optional<std::string> converged(const world& w);

/// Runs until converged() or `bound_ms` passes; returns the time taken (nullopt: not converged).
[[nodiscard]] std::optional<std::uint64_t> run_until_converged(world& w, std::uint64_t bound_ms,
                                                               std::uint64_t poll_ms = 10);

/// A one-line description of every node (role, term, leader, config) for failure messages.
[[nodiscard]] std::string describe(const world& w);

}  // namespace tessera::mesh::sim
