// The run-time duplicate-identity check of a starting node (mesh/node/identity_conflict.hpp has
// the rule): another live process announcing our node id from another endpoint — a cloned
// machine, a restored backup — is found by asking the seeds, and whoever their member tables list
// under our id, for their status documents; the later of the two processes refuses to run.
//
// It is an actor on the node's actor system (`identity`), not a thread: 1 s and 5 s after the node
// starts it asks every target at once through one status_client (status_client.hpp: a duplicate
// cannot talk to the mesh itself, the peers' ROUTERs take one connection per routing id), takes
// the answers as messages, and stops its client and itself 1 s after the second round. Reading an
// answer (read_identity_answer) is pure, so it is tested without sockets.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/actor.hpp"
#include "actors/system.hpp"
#include "mesh/node/identity_conflict.hpp"
#include "mesh/runtime/status_client.hpp"

namespace tessera::mesh::runtime {

/// Bounds of one check: seeds asked first, nodes asked in all (seeds and those their tables name).
inline constexpr std::size_t kIdentitySeedsAsked = 8;
inline constexpr std::size_t kIdentityNodesAsked = 16;

/// What one status document says about our identity.
struct identity_reading {
  /// Set when a process that started before us runs under our id: why we must not run.
  std::optional<std::string> refuse;
  /// Endpoints ("host:port") where the document's member table has an alive or suspect member
  /// under our id other than us: asked next.
  std::vector<std::string> more_targets;
};

/// Reads one status document (JSON text) for node `self` (`hex` is its id, `endpoint` its
/// "tcp://host:port", `data_dir` named in the refusal). A document that does not parse, or lacks
/// the fields, says nothing.
[[nodiscard]] identity_reading read_identity_answer(const std::string& document,
                                                    const node_instance& self,
                                                    const std::string& hex,
                                                    const std::string& endpoint,
                                                    const std::string& data_dir);

struct identity_check_options {
  node_instance self;
  std::string hex;       ///< our node id, 32 hex digits
  std::string endpoint;  ///< our advertised control endpoint, tcp://host:port
  std::string data_dir;
  std::vector<std::string> seeds;  ///< "host:port" or "tcp://host:port"
  status_client_options client;
  /// The rounds' times after the actor starts (the second one catches peers that were slow to
  /// list us), and how long answers are waited for after the last round.
  std::vector<std::chrono::milliseconds> rounds = {std::chrono::milliseconds(1000),
                                                   std::chrono::milliseconds(5000)};
  std::chrono::milliseconds answer_wait{1000};
  /// Called once, on the actor's thread, when we must not run (the node then stops with it).
  std::function<void(std::string why)> refuse;
};

/// The check's actor; spawn it on the node's actor system.
[[nodiscard]] std::unique_ptr<actors::actor> make_identity_check(identity_check_options options);

}  // namespace tessera::mesh::runtime
