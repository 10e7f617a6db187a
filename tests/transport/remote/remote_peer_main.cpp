// A real second process for the remote-actor tests: actor node 2 with a control node, an echo
// actor and a silent one. Prints "ready <endpoint> <echo id> <silent id>" and serves until its
// stdin closes (or it is killed).
//   tessera_remote_peer <cluster secret hex> <endpoint of node 1>
#include <cstdio>
#include <string>

#include "tests/transport/remote/test_support.hpp"
#include "transport/remote/control_router.hpp"

int main(int argc, char** argv) {
  using namespace tessera::transport::remote;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <cluster secret hex> <endpoint of node 1>\n", argv[0]);
    return 2;
  }
  tessera::actors::config cfg;
  cfg.node = 2;
  cfg.workers = 1;
  tessera::actors::actor_system sys(cfg);
  auto node = remote_node::start(sys, test::control_config("node-2", argv[1]));
  if (!node) {
    std::fprintf(stderr, "remote peer: %s\n", node.error().describe().c_str());
    return 1;
  }
  if (auto r = (*node)->add_node(1, "node-1", argv[2]); !r) {
    std::fprintf(stderr, "remote peer: %s\n", r.error().describe().c_str());
    return 1;
  }
  auto echo = sys.spawn<test::echo>();
  auto silent = sys.spawn<test::silent>();
  if (!echo || !silent) return 1;
  std::printf("ready %s %llu %llu\n", (*node)->endpoint().c_str(),
              static_cast<unsigned long long>(echo->id()),
              static_cast<unsigned long long>(silent->id()));
  std::fflush(stdout);
  char buf[64];
  while (std::fgets(buf, sizeof buf, stdin) != nullptr) {
  }
  sys.shutdown();
  (*node)->stop();
  return 0;
}
