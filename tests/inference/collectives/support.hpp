// Test (and benchmark) support for collectives: meshes of real bulk links between ranks, in one
// process (threads) or across processes (a parent as rank 0 and exec'd children), deterministic
// inputs and the reference sums. No gtest here: the benchmark links it too.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "actors/base/result.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::inference::collectives::testing {

namespace bulk = transport::bulk;

/// Link options for group tests: bounds a group needs (2 registrations per link) plus headroom,
/// generous time-outs for a loaded machine.
bulk::link_options link_options_for(bulk::backend_kind kind);

/// links[i][j]: rank i's link to rank j (null on the diagonal). Every pair connected.
using mesh_links = std::vector<std::vector<std::unique_ptr<bulk::link>>>;
result<mesh_links> make_local_mesh(bulk::backend_kind kind, std::uint32_t n);

/// Rank i's raw link pointers (links[i] null), as group::create() takes them.
std::vector<bulk::link*> row(const mesh_links& mesh, std::uint32_t i);

/// A child process of a multi-process mesh; stdin/stdout are pipes to the parent.
struct child {
  pid_t pid = -1;
  int to_child = -1;
  int from_child = -1;
  child() = default;
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  ~child();
  /// Waits for the exit; returns the exit code (128 + signal when killed).
  int reap();
  /// Reads one line from the child's stdout ("" at EOF).
  std::string read_line() const;
};

/// Parent side: starts n-1 children (`argv_for(rank)` gives each one's arguments; argv[0] is the
/// program), wires a full mesh of `kind` links through their stdin/stdout and returns rank 0's
/// links (index 0 null). Children must call join_mesh() first thing.
struct launched_mesh {
  std::vector<std::unique_ptr<child>> children;  // index r-1 for rank r
  std::vector<std::unique_ptr<bulk::link>> links;
};
result<launched_mesh> launch_mesh(bulk::backend_kind kind, std::uint32_t n,
                                  const std::vector<std::vector<std::string>>& argv_for);

/// Child side: rank `rank` of n; talks to the parent over stdin/stdout.
result<std::vector<std::unique_ptr<bulk::link>>> join_mesh(bulk::backend_kind kind,
                                                           std::uint32_t n, std::uint32_t rank);

/// Raw pointers of a link vector.
std::vector<bulk::link*> pointers(const std::vector<std::unique_ptr<bulk::link>>& links);

/// Deterministic input of rank r for round `round`: values of mixed magnitude and sign, so the
/// order of a float sum changes its bits.
std::vector<float> input(std::uint32_t rank, std::uint32_t round, std::size_t len);
/// Sequential sum in rank order 0..n-1 (what the mesh all-reduce computes).
std::vector<float> rank_order_sum(std::uint32_t n, std::uint32_t round, std::size_t len);
/// The ring's order: chunk c summed as x_c + x_(c+1) + ... (mod n), pieces of max_floats.
std::vector<float> ring_order_sum(std::uint32_t n, std::uint32_t round, std::size_t len,
                                  std::size_t max_floats);
/// FNV-1a of the bytes (to compare results across processes).
std::uint64_t fingerprint(std::span<const float> values);

}  // namespace tessera::inference::collectives::testing
