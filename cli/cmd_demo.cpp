// `tessera demo --actors`: the actor runtime working across threads —
// a supervised pipeline, a crash and its restart, a request that misses its deadline, and a
// request to another node through the remote seam. Self-checking: exit 0 only if all of it held.
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "actors/loopback_router.hpp"
#include "actors/supervisor.hpp"
#include "actors/system.hpp"
#include "cli/command.hpp"
#include "cli/demo.hpp"

namespace tessera::cli {
namespace {
using namespace std::chrono_literals;
using namespace tessera::actors;

struct number {
  TESSERA_MESSAGE("tessera.demo.number");
  std::int64_t value = 0;
  MSGPACK_DEFINE(value);
};
struct total_query {
  TESSERA_MESSAGE("tessera.demo.total_query");
  MSGPACK_DEFINE();
};
struct total {
  TESSERA_MESSAGE("tessera.demo.total");
  std::int64_t value = 0;
  std::uint64_t count = 0;
  MSGPACK_DEFINE(value, count);
};

std::string thread_tag() {
  std::ostringstream out;
  out << std::this_thread::get_id();
  return out.str();
}

/// Squares numbers and forwards them to "summer"; a negative number is a bug that crashes it.
class squarer : public actor {
 public:
  squarer() {
    on<number>([this](number& n) {
      if (n.value < 0) throw std::invalid_argument("negative input " + std::to_string(n.value));
      auto summer = system().lookup("summer");
      if (summer) (void)send(*summer, number{n.value * n.value});
    });
  }
  void on_start() override {
    std::printf("  [thread %s] squarer %s started\n", thread_tag().c_str(),
                fmt::format("{}", self()).c_str());
  }
};

/// Keeps the running total.
class summer : public actor {
 public:
  summer() {
    on<number>([this](number& n) {
      sum_ += n.value;
      ++count_;
    });
    on<total_query>([this](total_query&) { return total{sum_, count_}; });
  }

 private:
  std::int64_t sum_ = 0;
  std::uint64_t count_ = 0;
};

/// Never answers in time.
class sluggard : public actor {
 public:
  sluggard() {
    on<total_query>([this](total_query&) { held_.push_back(defer_reply<total>()); });
  }

 private:
  std::vector<reply_promise<total>> held_;
};

bool check(bool ok, const char* what) {
  std::printf("  %s %s\n", ok ? "ok  " : "FAIL", what);
  return ok;
}

/// Waits (generously) until `pred` holds.
bool wait_for(const std::function<bool()>& pred) {
  for (int i = 0; i < 10'000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

}  // namespace

int run_actor_demo() {
  bool all = true;
  config cfg;
  cfg.workers = 2;
  actor_system node1(cfg);
  std::printf("actor system: node %llu, 2 worker threads\n",
              static_cast<unsigned long long>(node1.node()));

  std::printf("\n1. a supervised pipeline: squarer -> summer (one_for_one, 3 restarts / 5 s)\n");
  auto sup = node1.spawn<supervisor>(
      supervisor_spec{.strategy = restart_strategy::one_for_one, .max_restarts = 3},
      std::vector<child_spec>{
          {"summer", [] { return std::make_unique<summer>(); }, {}},
          {"squarer", [] { return std::make_unique<squarer>(); }, {}},
      });
  all &= check(sup.has_value(), "supervisor started");
  all &= check(wait_for([&] { return node1.lookup("squarer") && node1.lookup("summer"); }),
               "children registered by name");
  actor_ref sq = *node1.lookup("squarer");
  for (int i = 1; i <= 10; ++i) (void)node1.send(sq, number{i});
  all &= check(wait_for([&] {
                 auto t = node1.ask<total>(*node1.lookup("summer"), total_query{}, 5s);
                 return t && t->count == 10;
               }),
               "10 numbers went through the pipeline");
  auto t1 = node1.ask<total>(*node1.lookup("summer"), total_query{}, 5s);
  std::printf("  sum of squares 1..10 = %lld\n", static_cast<long long>(t1 ? t1->value : -1));
  all &= check(t1 && t1->value == 385, "sum is 385");

  std::printf("\n2. a crash: squarer gets -1 and throws; the supervisor restarts it\n");
  (void)node1.send(sq, number{-1});
  all &= check(wait_for([&] {
                 auto now = node1.lookup("squarer");
                 return now && !(*now == sq);
               }),
               "squarer restarted under a new id, same name");
  (void)node1.send(*node1.lookup("squarer"), number{5});
  all &= check(wait_for([&] {
                 auto t = node1.ask<total>(*node1.lookup("summer"), total_query{}, 5s);
                 return t && t->value == 410;
               }),
               "the restarted squarer works; summer kept its state (385 + 25 = 410)");
  auto stale = node1.send(sq, number{1});
  std::printf("  sending to the dead instance: %s\n",
              stale ? "accepted?!" : stale.error().describe().c_str());
  all &= check(!stale && stale.error().code == errc::closed, "the sender learns it is gone");

  std::printf("\n3. a request with a deadline that passes\n");
  auto slow = node1.spawn<sluggard>();
  auto late = node1.ask<total>(*slow, total_query{}, 100ms);
  std::printf("  ask(sluggard, 100 ms): %s\n",
              late ? "answered?!" : late.error().describe().c_str());
  all &= check(!late && late.error().code == errc::timeout, "errc::timeout");
  all &= check(wait_for([&] { return node1.pending_requests() == 0; }),
               "no pending request left behind");

  std::printf("\n4. the remote seam: node 1 asks an actor on node 2 through envelopes\n");
  config cfg2 = cfg;
  cfg2.node = 2;
  actor_system node2(cfg2);
  auto router = std::make_shared<loopback_router>();
  router->attach(node1);
  router->attach(node2);
  node1.set_router(router);
  node2.set_router(router);
  auto remote_summer = node2.spawn<summer>();
  actor_ref wire_ref(2, remote_summer->id());
  (void)node1.send(wire_ref, number{7});
  auto remote_total = node1.ask<total>(wire_ref, total_query{}, 5s);
  all &= check(remote_total && remote_total->value == 7,
               "one-way message and request crossed to node 2 and back");
  std::printf("  envelopes routed: %llu\n", static_cast<unsigned long long>(router->routed()));

  auto stats = node1.stats();
  std::printf("\nnode 1 counters: handler failures %llu, late replies %llu, rejected %llu\n",
              static_cast<unsigned long long>(stats.handler_failures),
              static_cast<unsigned long long>(stats.late_replies),
              static_cast<unsigned long long>(stats.rejected_envelopes));
  node2.shutdown();
  node1.shutdown();
  std::printf("%s\n", all ? "demo: all checks passed" : "demo: SOME CHECKS FAILED");
  return all ? 0 : 1;
}

void register_demo(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand(
      "demo", "start several identical peers on this machine and serve requests through them");
  auto o = std::make_shared<demo_options>();
  auto actors = std::make_shared<bool>(false);
  cmd->add_option("--peers", o->peers, "how many peers (default 3)")->check(CLI::Range(1u, 8u));
  cmd->add_option("--base-port", o->base_port,
                  "peer i listens on base + 10 i .. base + 10 i + 4 (default 17600)")
      ->check(CLI::Range(1024, 65000));
  cmd->add_option("--wait", o->wait_s, "seconds the mesh may take to form (default 60)")
      ->check(CLI::Range(1u, 600u));
  cmd->add_flag("--keep", o->keep, "keep the working directory (model, logs)");
  cmd->add_flag("--serve", o->serve,
                "after the checks, keep the peers serving (HTTP API, dashboard, tessera ask) "
                "until Ctrl-C");
  cmd->add_option("--model", o->model,
                  "GGUF model to serve (default: the trained demo model, examples/demo-model/"
                  "kjv.gguf, else a synthesised one)");
  cmd->add_flag("--actors", *actors, "show the actor runtime across threads and nodes instead");
  cmd->callback([&exit_code, o, actors] {
    exit_code = *actors ? run_actor_demo() : run_serving_demo(*o);
  });
}

}  // namespace tessera::cli
