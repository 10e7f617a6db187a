// Actors on two nodes: two actor systems, each with its own control node on real tcp (loopback)
// and CURVE keys from a freshly generated cluster secret. A client on node 1 talks to a word
// counter on node 2 with one-way messages and requests, watches it, and hears `down` when it stops.
// Exits 0 when every answer is what it should be.
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>

#include "actors/system.hpp"
#include "actors/system_messages.hpp"
#include "transport/remote/control_router.hpp"

namespace words {
using namespace tessera::actors;

struct add {
  TESSERA_MESSAGE("example.words.add");
  std::string word;
  MSGPACK_DEFINE(word);
};
struct how_many {
  TESSERA_MESSAGE("example.words.how_many");
  int unused = 0;
  MSGPACK_DEFINE(unused);
};
struct total {
  TESSERA_MESSAGE("example.words.total");
  std::size_t words = 0;
  MSGPACK_DEFINE(words);
};
struct retire {
  TESSERA_MESSAGE("example.words.retire");
  int unused = 0;
  MSGPACK_DEFINE(unused);
};

/// Node 2's service: counts words; `retire` stops it (reason normal, "retired").
class counter : public actor {
 public:
  counter() {
    on<add>([this](add&) { ++words_; });
    on<how_many>([this](how_many&) { return total{words_}; });
    on<retire>([this](retire&) { quit(exit_reason{exit_kind::normal, "retired"}); });
  }

 private:
  std::size_t words_ = 0;
};

/// Node 1's observer: reports the first `down` it hears.
class observer : public actor {
 public:
  explicit observer(std::promise<down>* heard) {
    on<down>([heard](down& d) { heard->set_value(d); });
  }
};
}  // namespace words

namespace {
tessera::transport::control::node_config control_config(
    const std::string& id, const tessera::transport::control::cluster_keys& keys) {
  tessera::transport::control::node_config c;
  c.node_id = id;
  c.keys = keys;  // CURVE: only holders of the cluster secret get in
  return c;
}
}  // namespace

int main() {
  using namespace std::chrono_literals;
  using namespace tessera;
  using namespace tessera::actors;
  using tessera::transport::remote::remote_node;
  namespace control = tessera::transport::control;

  auto secret = control::generate_cluster_secret();
  auto keys = secret ? control::derive_cluster_keys(*secret) : result<control::cluster_keys>(secret.error());
  if (!keys) {
    std::fprintf(stderr, "keys: %s\n", keys.error().describe().c_str());
    return 1;
  }
  actor_system one(config{.workers = 1, .node = 1});
  actor_system two(config{.workers = 1, .node = 2});
  auto n1 = remote_node::start(one, control_config("node-1", *keys));
  auto n2 = remote_node::start(two, control_config("node-2", *keys));
  if (!n1 || !n2) {
    std::fprintf(stderr, "control plane: %s\n", (!n1 ? n1.error() : n2.error()).describe().c_str());
    return 1;
  }
  // Actor node 2 is control peer "node-2" at its bound endpoint, and back.
  if (!(*n1)->add_node(2, "node-2", (*n2)->endpoint()) ||
      !(*n2)->add_node(1, "node-1", (*n1)->endpoint())) {
    return 1;
  }
  auto service = two.spawn<words::counter>();
  if (!service) return 1;
  // Node 1 knows the service only by (node, id), as it would from a name service or a message.
  const actor_ref remote_counter(2, service->id());

  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += ok ? 0 : 1;
  };
  for (const char* w : {"pool", "several", "machines"}) {
    expect(one.send(remote_counter, words::add{w}).has_value(), "send add across nodes");
  }
  auto t = one.ask<words::total>(remote_counter, words::how_many{}, 30s);
  expect(t && t->words == 3, "ask how_many across nodes -> 3 (messages from one sender stay in order)");

  std::promise<down> heard;
  auto heard_future = heard.get_future();
  auto obs = one.spawn<words::observer>(&heard);
  expect(obs && one.monitor(remote_counter, *obs).has_value(), "monitor the remote counter");
  expect(one.send(remote_counter, words::retire{}).has_value(), "send retire");
  bool got_down = heard_future.wait_for(30s) == std::future_status::ready;
  expect(got_down, "down arrives from node 2");
  if (got_down) {
    auto d = heard_future.get();
    std::printf("     down: %s\n", d.reason.describe().c_str());
    expect(d.who == remote_counter && d.reason.detail == "retired", "down carries the real reason");
  }
  auto gone = one.ask<words::total>(remote_counter, words::how_many{}, 30s);
  // The down may overtake the removal of the stopped actor on node 2: a request arriving in
  // between meets its closed mailbox (closed), one arriving after finds no actor (not_found).
  if (!gone) std::printf("     request: %s\n", gone.error().describe().c_str());
  expect(!gone && (gone.error().code == errc::not_found || gone.error().code == errc::closed),
         "a request to the stopped actor fails: not_found (or closed while it is being removed)");

  one.shutdown();
  two.shutdown();
  (*n1)->stop();
  (*n2)->stop();
  std::printf("%s\n", failures == 0 ? "all good" : "FAILED");
  return failures == 0 ? 0 : 1;
}
