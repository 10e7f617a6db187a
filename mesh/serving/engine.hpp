// The serving engine of one peer: loads its models, takes the requests that intake assigns to it
// and streams tokens straight to the client (never through the leader).
//
// Threads (each ZeroMQ socket has one owner):
//   io thread      the client port's (client_port.hpp): owns the request SUB, the response XPUB
//                  and an inproc PULL; decodes requests into the engine's bounded inbox and
//                  forwards the engine's messages to the XPUB.
//   engine thread  owns the models, the sessions and an inproc PUSH; decides intake against the
//                  current plan, runs the sessions round-robin (one prefill chunk or one token per
//                  session per round, so a long prompt never stalls the other streams) and
//                  publishes accepted / token / done / error.
// The node's loop thread hands in plans and the live member set (set_plan); nothing else is shared.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/base/result.hpp"
#include "inference/kernels/attention.hpp"
#include "mesh/membership/ids.hpp"
#include "mesh/placement/placement.hpp"
#include "mesh/serving/client_auth.hpp"
#include "transport/bulk/link.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/faults/fault_policy.hpp"

namespace tessera::mesh::serving {

struct engine_options {
  std::string node_hex;  ///< our node id (32 hex digits), in every response
  member_id self = no_member;
  std::vector<std::string> model_paths;  ///< GGUF files; a model's name is the file stem
  std::uint32_t threads = 1;             ///< compute threads per forward pass
  /// Nice value of the engine thread, its compute pool, split-group followers and model loaders
  /// (actors/base/thread.hpp); 0 leaves them at the node's priority.
  int compute_nice = 0;
  std::string bind_address = "0.0.0.0";
  /// The address peers reach us at (mesh/node/advertise.hpp): what bulk links (split groups, model
  /// share) tell the peer. Empty: bind_address, which must then not be the wildcard.
  std::string advertise_address;
  /// The node's bulk port (listen.bulk_port): tcp links share one listener there; 0 = a port
  /// per link.
  std::uint16_t bulk_port = 0;
  [[nodiscard]] transport::bulk::link_addresses link_addresses() const {
    return {bind_address, advertise_address, bulk_port};
  }
  /// Where the client endpoints (request SUB, response XPUB) bind: the node's
  /// listen.client_address, loopback unless configured (docs/design/014-threat-model.md). Empty:
  /// bind_address.
  std::string client_bind_address;
  std::uint16_t request_port = 7402;   ///< SUB; 0 = any free port
  std::uint16_t response_port = 7403;  ///< XPUB; 0 = any free port
  std::uint32_t max_active = 8;        ///< sessions generating at once (each holds a KV cache)
  /// Resumed streams (attempt > 0: their peer died or their group moved) may take up to this many
  /// slots beyond max_active, so that they do not wait behind the survivors' full batches (a
  /// resumed stream waited 12-31 s there); each holds a KV cache too, so this bounds that memory.
  std::uint32_t resume_headroom = 8;
  std::uint32_t max_queued = 64;       ///< accepted requests waiting for a session slot
  /// Open connections per source address on each client endpoint, and on both together; more
  /// are shut down as they arrive (connection_guard.hpp).
  std::uint32_t client_connections_per_address = 256;
  std::uint32_t client_connections_total = 4096;
  std::uint32_t max_inbox = 1024;      ///< requests waiting for intake; beyond: dropped (counted)
  std::uint32_t prefill_chunk = 64;    ///< prompt tokens per round per session
  /// Continuous batching: the local streams of one model advance together, up to this many in one
  /// forward pass (decode tokens and prefill chunks alike). 1: one pass per stream.
  std::uint32_t max_batch_streams = 8;
  std::uint32_t keepalive_ms = 500;    ///< a session silent this long re-sends "accepted"
  std::uint32_t max_context = 4096;    ///< KV positions per session, at most the model's
  /// How sessions' KV caches store keys and values (`--kv-cache`): f16, or q8_0 for half the
  /// memory and half the bytes a long context reads per token (inference/kernels/attention.hpp).
  inference::kv_cache_type kv_cache = inference::kv_cache_type::f16;
  /// Ships a group_link message (msgpack bytes) to a peer's node (hex id) over the control plane;
  /// thread-safe. Needed for groups split over several peers.
  std::function<void(const std::string& node_hex, std::string body)> send_group_link;
  transport::bulk::local_capabilities bulk_caps;  ///< ours, to pick a backend per peer
  /// The node's fault layer (`tessera fault`): wraps the bulk links between the ranks of a split
  /// group, named by node hex ids like the control plane. Empty: no faults.
  std::shared_ptr<transport::faults::fault_injector> faults;
  /// Called while a model's whole weights load (when the plan gives this peer a replica; on the
  /// loader thread): its name, weight bytes read so far, of all (a progress bar in `tessera node`).
  /// Empty: not called.
  std::function<void(const std::string& model, std::uint64_t done, std::uint64_t total)>
      on_load_progress;
  /// Model distribution (model_share.hpp): when set, the plan may give this peer parts of models it
  /// has no file of; their bytes are fetched from holders into `fetch_dir`. Whether or not, this
  /// peer serves its own files' bytes to fetchers.
  bool fetch_models = false;
  std::string fetch_dir;
  /// Ships a share_setup message (msgpack bytes) to a peer's node (hex id); thread-safe.
  std::function<void(const std::string& node_hex, std::string body)> send_share;
  /// Called while a fetch moves bytes (on its worker thread): model, bytes verified, of all needed.
  std::function<void(const std::string& model, std::uint64_t done, std::uint64_t total)>
      on_fetch_progress;
  /// Client authentication (`--client-auth`, docs/PROTOCOL.md "Security"): the request SUB and the
  /// response XPUB become CURVE servers with `client_endpoint`, and a ZAP handler admits only
  /// clients presenting `access.client.public_key` (the cluster's client access key). Empty: the
  /// client endpoints are open (NULL mechanism).
  using client_auth_keys = serving::client_auth_keys;
  std::optional<client_auth_keys> client_auth;
};

/// What the engine knows of another live member (from the view).
struct peer_facts {
  std::string hex;                                ///< control-plane id
  transport::bulk::local_capabilities bulk_caps;  ///< host id, RDMA
  std::vector<std::string> holds;                 ///< its model files, as "name@content"
};

/// One loaded model: what placement needs to know about it.
struct local_model {
  std::string name;
  std::string path;
  placement::model_spec spec;
  std::uint64_t file_bytes = 0;
};

/// Derives the placement spec of a GGUF model (shape and byte sizes from the tensor table; the
/// content id is left empty: the engine sets it from the file's chunk table).
[[nodiscard]] result<placement::model_spec> spec_of_gguf(const std::string& path,
                                                         const std::string& name);

class engine {
 public:
  /// Loads every model (errors name the file), binds the client endpoints, starts both threads.
  [[nodiscard]] static result<std::unique_ptr<engine>> start(engine_options options);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Stops taking requests, ends every in-flight stream with an error ("shutting down"), joins.
  void stop();

  [[nodiscard]] const std::vector<local_model>& models() const;
  /// The models this peer holds every byte of: its own files, and models fetched whole from peers
  /// (it serves those on to other fetchers). Any thread.
  [[nodiscard]] std::vector<placement::model_spec> held_specs() const;
  [[nodiscard]] std::uint16_t request_port() const;
  [[nodiscard]] std::uint16_t response_port() const;

  /// The plan in force, the live members (self included) and their client endpoints
  /// ("host:request_port:response_port", published to clients). Called by the node's loop thread.
  void set_plan(std::shared_ptr<const placement::plan> plan, std::vector<member_id> live,
                std::vector<std::string> client_endpoints,
                std::map<member_id, peer_facts> peers = {});

  /// A group_link message from the member `from` over the control plane (any thread). Only the
  /// member at the message's from_rank of the group may speak for that rank.
  void on_group_link(member_id from, std::string_view body);
  /// A model_share set-up message from the member `from_hex` (any thread).
  void on_share(const std::string& from_hex, std::string_view body);

  /// Counters and the sessions in flight, for `tessera status`.
  [[nodiscard]] nlohmann::ordered_json status() const;

  struct impl;

 private:
  explicit engine(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tessera::mesh::serving
