// node_runtime: the running `tessera node` — identity, control plane, discovery, membership,
// election and topology wired together (docs/design/011-node-runtime.md).
//
// Threads: the control plane's I/O thread and each discovery source's thread only send events
// to the control actor (its bounded mailbox); that actor, on the node's actor system, owns the
// control_core (membership, election, topology, plan: control_core.hpp, the same code the
// simulator runs) and all decisions, so no protocol state is shared between threads. Its one
// timer is set for the core's next deadline.
//
// Message types on the control plane (application range, docs/design/011-node-runtime.md):
//   64 membership  65 election  66 topo.ping  67 topo.pong  68 topo.report  69 topo.view
//   70 status.request  71 status.reply  72 bulk.offer  73 bulk.answer  74 plan
//   75 group.link
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"
#include "actors/system.hpp"
#include "mesh/node/config.hpp"
#include "mesh/runtime/messages.hpp"

namespace tessera::mesh::runtime {

/// Bound on frames waiting for the control actor; beyond it inbound messages are dropped (counted),
/// which the protocols treat as loss. Peer events and hints are never dropped below the bound.
inline constexpr std::size_t kMaxQueuedEvents = 8192;

/// Bound on peers learnt from discovery hints that membership has not confirmed yet plus members
/// (2 x membership's max_members); hints for new ids beyond it are dropped (counted).
inline constexpr std::size_t kMaxKnownPeers = 256;

/// On a graceful leave, how long HTTP API streams still running may take to finish (they are
/// served by other peers by then); beyond it their connections are closed.
inline constexpr std::uint32_t kHttpDrainMs = 5000;

/// Control-plane id prefix of status clients (`tessera status`, `tessera fault`, the dashboard's
/// cluster view): short-lived links, logged at debug level when they go.
inline constexpr std::string_view status_client_prefix = "status-";

/// Bound on actors subscribed to membership changes (node_runtime::subscribe_members).
inline constexpr std::size_t kMaxMemberSubscribers = 64;

/// A membership change (alive, suspect, dead, left), as delivered to subscribing actors. Also a
/// wire message: an actor on another node may subscribe through its ref.
struct member_changed {
  TESSERA_MESSAGE("tessera.mesh.member_changed");
  std::string member;             ///< the member id, 16 hex digits
  std::string node;               ///< its node id (32 hex digits); "" until its address is known
  std::string status;             ///< "alive", "suspect", "dead" or "left"
  std::uint64_t incarnation = 0;  ///< SWIM incarnation: a refuted suspicion raises it
  std::string address;            ///< its control endpoint
  bool initial = false;           ///< part of the snapshot a subscription starts with
  MSGPACK_DEFINE_MAP(member, node, status, incarnation, address, initial);
};

struct runtime_options {
  node_config config;
  std::string version = "0.1.0";
  std::string election_state_file = "election.state";  ///< inside the data directory
  /// Progress of loading a model's whole weights, when the plan gives this peer a replica of it
  /// (serving::engine_options::on_load_progress; called on the engine's loader thread).
  std::function<void(const std::string& model, std::uint64_t done, std::uint64_t total)>
      on_model_load;
  /// Progress of fetching a model's shard from peers (serving::engine_options::on_fetch_progress).
  std::function<void(const std::string& model, std::uint64_t done, std::uint64_t total)>
      on_model_fetch;
};

class node_runtime {
 public:
  /// Opens the data dir (lock, identity), loads the cluster secret (required), restores the
  /// election state, binds the control ROUTER, starts discovery and the control actor.
  [[nodiscard]] static result<std::unique_ptr<node_runtime>> start(runtime_options options);
  ~node_runtime();
  node_runtime(const node_runtime&) = delete;
  node_runtime& operator=(const node_runtime&) = delete;

  /// Graceful leave: announces leave (membership + election), flushes the control queues
  /// (bounded by `flush_ms`), then stops everything. Idempotent.
  void leave_and_stop(std::uint32_t flush_ms = 1000);
  /// True once the runtime stopped on its own (fatal condition); `fatal_error()` says why.
  [[nodiscard]] bool failed() const;
  [[nodiscard]] std::string fatal_error() const;
  /// Delivers every membership change this node learns to `subscriber`, an actor of `system`,
  /// starting with one `initial` message per member it knows (itself included, alive). Messages
  /// come from the runtime's control actor, in the order the changes happened. A subscriber that
  /// stopped is dropped at its next delivery; one whose mailbox refuses a message misses it
  /// (counted in status stats.member_events_dropped). `system` must outlive the subscription
  /// (unsubscribe, or stop this runtime, first). Errors: overloaded (kMaxMemberSubscribers
  /// subscriptions), closed (the runtime stopped).
  result<void> subscribe_members(actors::actor_system& system, const actors::actor_ref& subscriber);
  /// Ends a subscription (no message is delivered after the control actor handles it).
  void unsubscribe_members(const actors::actor_ref& subscriber);

  /// "hexid", the control endpoint actually bound.
  [[nodiscard]] std::string node_id() const;
  [[nodiscard]] std::string endpoint() const;

  struct impl;

 private:
  explicit node_runtime(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Asks the node at `endpoint` ("host:port" or "tcp://host:port") for its status, authenticated
/// with the cluster secret (`key_file`, or $TESSERA_CLUSTER_KEY when empty). Returns the status
/// document (JSON text, fields in docs/design/011-node-runtime.md). errc::timeout when nothing
/// answers within `timeout_ms`.
/// `fault_commands`: fault.set bodies (transport/control/fault_adapter.hpp) sent first over the
/// same link, so the status that comes back already reflects them (`tessera fault`).
[[nodiscard]] result<std::string> query_status(const std::string& endpoint,
                                               const std::string& key_file,
                                               std::uint32_t timeout_ms,
                                               const std::vector<std::string>& fault_commands = {});

/// Renders a status document as an aligned, human-readable table.
[[nodiscard]] result<std::string> format_status(const std::string& json_text);

}  // namespace tessera::mesh::runtime
