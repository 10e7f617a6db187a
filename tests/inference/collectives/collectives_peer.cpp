// tessera_collectives_peer: one rank of a multi-process collectives test.
//
//   tessera_collectives_peer <tcp|shm> <n> <rank> <reduce|until-error|stall>
//
// Joins the mesh through stdin/stdout (tests/inference/collectives/support.hpp), builds a group
// with max_floats 65536 and then:
//   reduce       4 all-reduces of testing::input(rank, round, len), len 1024 / 40000 alternating,
//                printing "sum <fingerprint>" for each; exit 0.
//   until-error  all-reduces of 1024 floats until one fails; prints "error <errc>"; exit 0.
//   stall        one all-reduce, prints "stalling", then waits to be killed.
// Exit codes: 2 set-up failed, 3 an operation failed unexpectedly.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "inference/collectives/group.hpp"
#include "tests/inference/collectives/support.hpp"

using namespace tessera;
using namespace tessera::inference::collectives;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: tessera_collectives_peer <tcp|shm> <n> <rank> <mode>\n");
    return 2;
  }
  auto kind = transport::bulk::parse_backend(argv[1]);
  if (!kind) return 2;
  const auto n = static_cast<std::uint32_t>(std::stoul(argv[2]));
  const auto rank = static_cast<std::uint32_t>(std::stoul(argv[3]));
  const std::string mode = argv[4];
  auto links = testing::join_mesh(*kind, n, rank);
  if (!links) {
    std::fprintf(stderr, "join: %s\n", links.error().describe().c_str());
    return 2;
  }
  group_options o;
  o.max_floats = 1 << 16;
  o.timeout_ms = std::chrono::milliseconds(30'000);
  auto g = group::create(rank, testing::pointers(*links), o);
  if (!g) {
    std::fprintf(stderr, "group: %s\n", g.error().describe().c_str());
    return 2;
  }
  if (mode == "reduce") {
    for (std::uint32_t round = 0; round < 4; ++round) {
      auto v = testing::input(rank, round, round % 2 == 0 ? 1024 : 40000);
      if (!(*g)->all_reduce(v)) return 3;
      std::cout << "sum " << testing::fingerprint(v) << std::endl;
    }
    return 0;
  }
  if (mode == "until-error") {
    for (std::uint32_t round = 0;; ++round) {
      auto v = testing::input(rank, 0, 1024);
      auto r = (*g)->all_reduce(v);
      if (!r) {
        std::cout << "error " << to_string(r.error().code) << std::endl;
        return 0;
      }
      if (round > 1000) return 3;
    }
  }
  if (mode == "stall") {
    auto v = testing::input(rank, 0, 1024);
    if (!(*g)->all_reduce(v)) return 3;
    std::cout << "stalling" << std::endl;
    for (;;) ::pause();
  }
  return 2;
}
