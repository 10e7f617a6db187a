// A control node in its own process, for the two-process tests: echoes every message back to its
// sender (type 65), prints "endpoint EP" once bound, "received N" per message, and on stdin EOF
// prints "final received=N zap_denied=N handshake_failed_outbound=N" and exits.
//
//   tessera_control_peer --id ID [--key FILE] [--bind EP] [--peer ID=EP]...
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "transport/control/control_node.hpp"

using namespace tessera::transport::control;

int main(int argc, char** argv) {
  std::string id = "peer";
  std::optional<std::string> key;
  std::string bind = "tcp://127.0.0.1:*";
  std::vector<std::pair<std::string, std::string>> peers;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    std::string v = argv[i + 1];
    if (a == "--id") {
      id = v;
    } else if (a == "--key") {
      key = v;
    } else if (a == "--bind") {
      bind = v;
    } else if (a == "--peer") {
      auto eq = v.find('=');
      if (eq == std::string::npos) return 2;
      peers.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  node_config cfg;
  cfg.node_id = id;
  cfg.bind_endpoint = bind;
  cfg.timing.heartbeat_interval_ms = 50;
  cfg.timing.dead_after_ms = 800;
  cfg.timing.backoff_min_ms = 20;
  cfg.timing.backoff_max_ms = 200;
  if (key) {
    auto secret = read_cluster_secret_file(*key);
    if (!secret) {
      std::fprintf(stderr, "%s\n", secret.error().describe().c_str());
      return 1;
    }
    auto keys = derive_cluster_keys(*secret);
    if (!keys) return 1;
    cfg.keys = *keys;
  }
  std::atomic<std::uint64_t> received{0};
  control_node* self = nullptr;
  node_handlers h;
  h.on_message = [&](inbound_message&& m) {
    ++received;
    std::printf("received %llu\n", static_cast<unsigned long long>(received.load()));
    std::fflush(stdout);
    (void)self->send(m.sender, 65, as_bytes(m.body));
  };
  auto node = control_node::start(cfg, h);
  if (!node) {
    std::fprintf(stderr, "%s\n", node.error().describe().c_str());
    return 1;
  }
  self = node->get();
  for (auto& [pid, ep] : peers) {
    if (!(*node)->add_peer(pid, ep)) return 1;
  }
  std::printf("endpoint %s\n", (*node)->endpoint().c_str());
  std::fflush(stdout);
  char buf[64];
  while (::read(0, buf, sizeof buf) > 0) {
  }
  auto s = (*node)->stats();
  (*node)->stop();
  std::printf("final received=%llu zap_denied=%llu handshake_failed_outbound=%llu\n",
              static_cast<unsigned long long>(received.load()),
              static_cast<unsigned long long>(s.zap_denied),
              static_cast<unsigned long long>(s.handshake_failed_outbound));
  std::fflush(stdout);
  return 0;
}
