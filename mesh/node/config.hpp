// node_config: everything `tessera node` can be told, and how the layers merge.
//
// Precedence, highest first:  flags  >  environment (TESSERA_*)  >  TOML file  >  defaults.
// Every setting has one key; the key names it in all three layers:
//     key  listen.control_port   file  [listen] control_port = 7400
//                                env   TESSERA_LISTEN_CONTROL_PORT=7400
//                                flag  --control-port 7400
// The file is named by --config or TESSERA_CONFIG. Unknown keys in the file, unknown TESSERA_*
// variables and bad values are errors naming the key and where the value came from
// ("tessera.toml:7:16", "env TESSERA_...", "flag --..."). The table of keys lives in config.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/base/result.hpp"

namespace tessera::mesh {

struct listen_config {
  std::string address = "0.0.0.0";
  /// The address peers reach this node at (control, bulk, client endpoints). Empty: chosen at
  /// start (mesh/node/advertise.hpp says how); `tessera status` shows the choice.
  std::string advertise;
  std::uint16_t control_port = 7400;          ///< ZeroMQ ROUTER (0 = any free port)
  /// Bulk plane: every tcp bulk link (split groups, model shares, bandwidth probes) listens
  /// on this one port; 0 = an ephemeral port per link. RDMA and shared memory use no port.
  std::uint16_t bulk_port = 7401;
  std::uint16_t client_request_port = 7402;   ///< clients publish requests here
  std::uint16_t client_response_port = 7403;  ///< clients subscribe to tokens here
  /// Where the client endpoints bind. Empty: 127.0.0.1, unless listen.address was set (then that
  /// address). Reachable from other hosts only with client_auth or insecure_clients: whoever
  /// reaches an open client port may submit requests and cancel or read anyone's
  /// (docs/design/014-threat-model.md). resolve_config fills it in.
  std::string client_address;
  std::uint16_t http_port = 7480;             ///< HTTP API, metrics, dashboard (0 = any free)
  /// The HTTP API answers anyone who reaches it (with the key, when one is set): loopback only
  /// unless the operator opens it on purpose.
  std::string http_address = "127.0.0.1";
};

struct http_config {
  bool enabled = true;
  std::string api_key_file;  ///< the bearer token, one line; empty: no API key
  std::vector<std::string> cors_origins;  ///< origins browsers may call the API from ("*": any)
};

struct discovery_config {
  bool mdns = true;                              ///< publish and browse _tessera._tcp through avahi
  bool beacon = true;                            ///< UDP beacons
  std::string beacon_interface;                  ///< empty: the kernel's default route picks it
  std::string beacon_address = "239.255.74.74";  ///< multicast group or broadcast address
  std::uint16_t beacon_port = 7479;
  std::uint32_t beacon_interval_ms = 1000;
  std::vector<std::string> seeds;  ///< host:port of control endpoints (routed networks)
};

struct timeout_config {
  std::uint32_t heartbeat_interval_ms = 100;
  /// A peer that misses its probe (heartbeat interval x 2/5, then indirect probes) is suspected; it
  /// has this long to refute (a higher incarnation) before it is declared dead.
  std::uint32_t suspect_timeout_ms = 500;
  /// A dead peer stays in the election's committed member set this long before it is removed.
  std::uint32_t dead_timeout_ms = 2000;
  std::uint32_t election_timeout_min_ms = 300;
  std::uint32_t election_timeout_max_ms = 600;
};

/// Where a node keeps its identity and state unless told: /var/lib/tessera for root (the
/// systemd unit's StateDirectory), else $XDG_DATA_HOME/tessera (~/.local/share/tessera), which a
/// user can create.
[[nodiscard]] std::string default_data_dir();

struct node_config {
  std::string data_dir = default_data_dir();
  std::string cluster_key_file;          ///< empty: no authentication (development only)
  std::string cluster_name = "default";  ///< discovery ignores peers of other clusters
  bool reset_identity = false;           ///< discard node.id and create a new identity
  listen_config listen;
  http_config http;
  discovery_config discovery;
  timeout_config timeouts;
  std::vector<std::string> model_paths;
  std::uint32_t threads = 0;  ///< compute threads; 0 = one per core
  /// Nice value of the threads that compute (forward passes, split-group followers, model loads):
  /// protocol threads (nice 0) then preempt them, so a busy peer still answers probes in time
  /// (actors/base/thread.hpp). 0: compute at the protocol threads' priority.
  std::uint32_t compute_nice = 10;
  /// Continuous batching: most local streams of one model sharing a forward pass (1 = none).
  std::uint32_t max_batch_streams = 8;
  /// How the KV caches of the streams this peer serves store keys and values: "f16", or "q8_0"
  /// for half the memory and half the bytes a long context reads per token.
  std::string kv_cache = "f16";
  /// Memory (MiB) the planner may give this peer's shards; 0 = what the machine has free.
  std::uint32_t memory_limit_mb = 0;
  /// Most tensor-parallel ranks in one pipeline stage of a plan (1 = pipeline parallelism only).
  /// A cluster setting: every peer that may lead must use the same value.
  std::uint32_t max_tp_ranks = 8;
  /// A tcp link whose measured round trip is at most this may carry tensor parallelism (an
  /// all-reduce per layer); shm and rdma links always may. Raise it on a fast LAN. Cluster-wide.
  std::uint32_t tp_max_rtt_us = 100;
  /// Model distribution: this peer may be planned for models it has no file of, and then fetches
  /// the bytes of its shard from peers that hold the file (kept under <data_dir>/models).
  bool fetch_models = false;
  /// The client endpoints admit only clients holding the cluster's client access key (CURVE +
  /// ZAP; `tessera keygen --client-key`). Off: they are open to anyone who can reach the ports.
  bool client_auth = false;
  /// Serve the client endpoints to other hosts without client_auth, on purpose (a trusted
  /// network); the node warns in its log and status.
  bool insecure_clients = false;
  /// Open connections one source address may hold on each client endpoint (more are shut down
  /// as they arrive, counted in status): a stranger holding idle connections cannot take the
  /// node's descriptors (all client connections together are bounded by half the descriptors
  /// as well). Clients behind one NAT or on one host share an address, and every peer's HTTP
  /// gateway holds a connection per API request in flight: raise it for many such clients.
  std::uint32_t client_connections_per_address = 256;
  std::string log_level = "info";
  std::string log_format = "text";
};

/// The layers below the defaults. `environment` is a list of NAME=VALUE strings (like environ);
/// only TESSERA_* entries are read. `flags` are (key, value-as-text) pairs, applied in order.
struct config_layers {
  std::optional<std::string> file;  ///< TOML file; overrides TESSERA_CONFIG when set
  std::vector<std::string> environment;
  std::vector<std::pair<std::string, std::string>> flags;
};

/// The merged configuration and, per key, the layer that set it ("default", "file x.toml:3:1",
/// "env TESSERA_...", "flag --...").
struct resolved_config {
  node_config config;
  std::map<std::string, std::string> origin;
  std::string config_file;  ///< the file that was read, empty if none
};

/// Merges defaults < file < env < flags and validates the result (ranges, cross-key rules such
/// as election_timeout_min_ms < election_timeout_max_ms, seed syntax, distinct ports).
[[nodiscard]] result<resolved_config> resolve_config(const config_layers& layers);

/// The configuration as JSON, nested by key ({"listen": {"control_port": 7400}, ...}).
[[nodiscard]] nlohmann::ordered_json to_json(const node_config& config);
/// The same as a config file takes it (TOML), each key with its help and flag as a comment:
/// `tessera node --print-config > tessera.toml` starts a file that reads back to this config.
[[nodiscard]] std::string to_toml(const node_config& config);

/// The environment variable that sets `key`: "listen.control_port" -> TESSERA_LISTEN_CONTROL_PORT.
[[nodiscard]] std::string env_name_of(std::string_view key);

/// Reserved variable naming the config file.
inline constexpr const char* config_file_env = "TESSERA_CONFIG";

}  // namespace tessera::mesh
