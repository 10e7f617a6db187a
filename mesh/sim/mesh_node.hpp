// A simulated mesh node: the node's own control code (runtime::control_core — membership,
// election, topology pings and rows, views, the leader's plan, configured by the same
// control_settings_for as `tessera node`) behind a port onto the simulated world: messages are
// msgpack-encoded on the simulated wire under their control-plane types, the election's durable
// state is the node's durable bytes, the clock is the node's simulated local clock.
// With `serve_requests`, also the peers' side of the client protocol: the engine's pure parts
// (serving::admit, serving::decide over the facts the core hands the engine,
// serving::cancel_applies, peer lists from serving::peer_list_nodes) in front of a modelled token
// generator — the one part of the node the simulator replaces.
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
#include "mesh/runtime/control_core.hpp"
#include "mesh/serving/ledger.hpp"
#include "mesh/serving/protocol.hpp"
#include "mesh/sim/world.hpp"

namespace tessera::mesh::sim {

/// Wire channels of the client protocol (control messages travel under their runtime_msg type).
inline constexpr std::uint8_t request_channel = 6;   ///< client -> peer: a serving::request
inline constexpr std::uint8_t response_channel = 7;  ///< peer -> client: a serving::response

struct mesh_node_options {
  /// The control settings, as `tessera node` derives them from its defaults
  /// (runtime::control_settings_for); self, addresses and seeds are filled in per node.
  runtime::control_settings control;
  std::vector<member_update> seeds;  ///< joined at every start (discovery hints)
  /// Every node holds `model` with `memory_mb` free (the topology and plan run either way: they
  /// are part of the node; without it no node offers a model and plans stay empty).
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
  /// The node's behaviour before issue 31, for the scenarios that show what each part fixed:
  /// peer lists naming the live members (a client learns its serving peer is gone without waiting
  /// for its silence timer), and cancels (a client cuts a second peer's copy of its attempt).
  bool peer_lists = true;
  bool cancels = true;
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

class mesh_node : public sim_node, private runtime::control_port {
 public:
  mesh_node(member_id self, const mesh_node_options& options, std::uint64_t seed);

  void on_start(node_context& ctx) override;
  void on_message(node_context& ctx, const envelope& msg) override;
  void on_timer(node_context& ctx) override;

  /// Graceful leave of both state machines (what the node does on SIGTERM).
  void leave(node_context& ctx);

  [[nodiscard]] const runtime::control_core& core() const { return *core_; }
  [[nodiscard]] const mesh::election& election() const { return core_->election(); }
  [[nodiscard]] const mesh::membership& membership() const { return core_->membership(); }
  [[nodiscard]] const std::vector<observed_member_event>& member_events() const {
    return member_events_;
  }
  /// Wire messages that failed to decode (must stay 0 between honest nodes).
  [[nodiscard]] std::uint64_t undecodable() const {
    return undecodable_ + core_->counters().undecodable;
  }
  /// Serving: the plan in force (null: none yet), and plans refused as invalid (must stay 0).
  [[nodiscard]] const std::shared_ptr<const placement::plan>& plan() const { return core_->plan(); }
  [[nodiscard]] std::uint64_t plans_refused() const { return core_->counters().plans_refused; }
  /// Requests: whether this node runs a stream of `id` now; the tokens it has sent for `id` over
  /// its life (every attempt; a duplicate copy's too); cancels that ended a stream here.
  [[nodiscard]] bool serves(const std::string& id) const { return streams_.contains(id); }
  [[nodiscard]] std::uint64_t tokens_sent(const std::string& id) const {
    auto it = tokens_sent_.find(id);
    return it == tokens_sent_.end() ? 0 : it->second;
  }
  [[nodiscard]] std::uint64_t cancelled() const { return cancelled_; }
  /// The node id its responses carry (the control plane's, as in the node).
  [[nodiscard]] static std::string hex_of(member_id id);

 private:
  // control_port: the simulated world (valid during a callback: ctx_ is set by each).
  void send(member_id to, runtime::runtime_msg type, std::string body) override;
  void reply(member_id to, std::string_view link, runtime::runtime_msg type,
             std::string body) override;
  bool persist(const std::string& bytes) override;
  std::int64_t mono_ns() override;
  void learn(member_id, const std::string&, bool) override {}  // the world routes by id
  void on_member_event(const member_event& ev) override;
  void serving_changed(runtime::serving_facts facts) override;
  std::uint8_t backend_for(const topology::capabilities&) override { return 1; }  // tcp
  void refresh_caps(topology::capabilities&) override {}

  void rearm(node_context& ctx);
  // requests: the modelled engine
  void on_request(node_context& ctx, member_id client, serving::request q);
  void respond(node_context& ctx, member_id client, const serving::response& r);
  void generate(node_context& ctx);
  void publish_peers(node_context& ctx, member_id client);
  [[nodiscard]] serving::response base(const serving::request& q, std::string_view kind) const;
  struct stream {
    serving::request req;
    member_id client = no_member;
    std::uint32_t index = 0;  // the next token's index
    std::int32_t prev = -1;   // the token before it
    std::uint64_t next_ms = 0;
  };

  member_id self_;
  std::uint64_t seed_;
  mesh_node_options options_;
  node_context* ctx_ = nullptr;
  std::unique_ptr<runtime::control_core> core_;
  runtime::serving_facts facts_;  // what the core last handed the engine
  std::vector<observed_member_event> member_events_;
  std::uint64_t undecodable_ = 0;          // client-protocol bytes and unknown types
  std::map<std::string, stream> streams_;  // running, by request id
  serving::finished_ledger finished_;
  // The clients that sent requests here: the subscribers of its peer list (a client subscribes to
  // the peers' lists when it connects to publish).
  std::vector<member_id> clients_;
  std::vector<std::string> peer_list_;  // the `nodes` last published
  std::map<std::string, std::uint64_t> tokens_sent_;
  std::uint64_t cancelled_ = 0;
};

/// Options for a cluster of nodes 1..n with default timeouts, each seeded with all the others
/// (address "sim:<id>").
[[nodiscard]] mesh_node_options cluster_options(std::size_t n);
/// As cluster_options, with the serving layer on and a small model every node can hold.
[[nodiscard]] mesh_node_options serving_cluster_options(std::size_t n);

/// A world with nodes 1..n added (not started) whose factory builds mesh_nodes from `options`.
[[nodiscard]] std::unique_ptr<world> make_mesh_world(std::uint64_t seed, std::size_t n,
                                                     const mesh_node_options& options);

/// Encodes a value as the node does (instantiated for durable_election_state: tests edit a
/// node's durable bytes).
template <class T>
bytes encode(const T& value);
/// Decodes; nullopt when the bytes are not a valid T.
template <class T>
std::optional<T> decode(const bytes& data);

}  // namespace tessera::mesh::sim
