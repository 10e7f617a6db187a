// What the node reads from and writes to its host: the wall clock, durable files (the election
// state), its capabilities, the descriptor limit and how it is shared, the warnings a node on
// this host gives, and the API key file. Free functions with no state of their own, used by
// node_runtime (runtime.cpp) at start and by the control actor.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "actors/base/result.hpp"
#include "mesh/election/election.hpp"
#include "mesh/node/config.hpp"
#include "mesh/topology/topology.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::mesh::runtime {

/// Wall-clock milliseconds since the epoch (membership incarnations, the instance's start).
std::int64_t unix_ms();

/// The election's durable state in `file`: the initial state when there is no file; an error
/// naming the file when it does not decode.
result<durable_election_state> read_election_state(const std::filesystem::path& file);

/// Whether two control endpoints ("tcp://host:port") reach the same listener: the same text, or
/// the same port on two addresses of this machine (a seed given as 127.0.0.1 for a node on this
/// host that advertises its LAN address). A seed placeholder for it must then go: the peer's
/// ROUTER takes one connection per routing id (ours), and two would take it from each other.
bool same_listener(const std::string& a, const std::string& b);

/// Writes `data` to dir/name atomically and durably: temp file, fsync, rename, fsync dir.
result<void> write_durable(const std::filesystem::path& dir, const std::string& name,
                           const std::string& data);

topology::capabilities local_caps(const node_config& cfg, const std::string& hex,
                                  const std::string& version,
                                  const transport::bulk::local_capabilities& bulk);

std::int64_t steady_ns();

/// What a node whose client endpoints other hosts reach without authentication
/// (--insecure-clients) says in its log and status; nullopt when they are on loopback or guarded.
std::optional<std::string> insecure_clients_warning(const node_config& cfg);

/// Descriptors below this leave too little room: every client, HTTP connection, peer link and
/// model file holds one, and a stranger holding connections must not starve the control plane.
constexpr rlim_t kWantedDescriptors = 65536;

constexpr rlim_t kFewDescriptors = 4096;

/// Raises the soft descriptor limit toward the hard one (at most kWantedDescriptors): Debian's
/// default soft limit of 1024 let 300 idle connections make the control plane unreachable
/// (issue 32). Returns the limit in force.
rlim_t raise_descriptor_limit();

/// How the node's `limit` descriptors are shared among what strangers can open (issue 32: 300
/// idle client connections once left a node of 256 descriptors none for its control plane). Half
/// of them, up to 4096, are reserved: a quarter of the reserve for HTTP handler threads and as
/// many for accepted HTTP connections waiting for one (beyond, connections wait in the kernel's
/// backlog), the rest for the control plane, peer links and model files. The client endpoints'
/// connections may use what is not reserved.
struct descriptor_budget {
  std::uint32_t client_connections = 1u << 20;
  std::uint32_t http_threads = 1024;
};

descriptor_budget budget_of(rlim_t limit);

/// The warning a node with few descriptors gives in its log and status, if any.
std::optional<std::string> descriptor_warning(rlim_t limit);

/// Descriptors this process has open now (entries of /proc/self/fd), -1 when unreadable.
long open_descriptors();

/// The host part of the client endpoint this node tells clients (in peer lists): the advertised
/// address when the endpoints are bound where other hosts reach them, 127.0.0.1 when they are on
/// loopback (only clients on this host can reach them; peers on other hosts leave them out of
/// the lists they send, control_core::hand_to_engine).
std::string client_host_for_peers(const node_config& cfg, const std::string& adv_host);

/// The bearer token in `path`: its first line, surrounding white space trimmed. The error names
/// the file. Read like the cluster secret: a key others may read is refused (anyone on the host
/// could then use the API).
result<std::string> read_api_key(const std::string& path);

}  // namespace tessera::mesh::runtime
