// Randomized deterministic simulation of the mesh protocols (membership + election) under faults.
//
// Each seed builds a cluster, lets it converge, then runs a schedule of fault episodes (clean
// partitions, one-way links, bridges, swizzle-clog, crash/restart, pause, lossy/duplicating/slow
// links, leader isolation, clock faults: a node 0.5x/2x/3x as fast with a forward jump) with clock skew throughout, healing after each; the checkers watch every event.
// A failure prints its seed; replay exactly with TESSERA_SIM_SEED=<seed>.
//
//   TESSERA_SIM_SEEDS=5000 TESSERA_SIM_FIRST_SEED=1 ./tessera_mesh_sim_tests
//       --gtest_filter='SimRandom.*'        (one line; many seeds, default 500)
//   TESSERA_SIM_SEED=1234 TESSERA_SIM_VERBOSE=1 ./tessera_mesh_sim_tests
//   --gtest_filter='SimRandom.*'
//   scripts/sim-overnight 100000      (all three layers, both cores: the overnight run)
//
// The nodes are the node's own control code (runtime::control_core, mesh/sim/mesh_node.hpp); CI
// runs 1,000 seeds (500 mesh, 200 plans, 300 requests).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "mesh/sim/checkers.hpp"
#include "mesh/sim/mesh_node.hpp"

namespace tessera::mesh::sim {
namespace {

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

member_id leader_of(const world& w) {
  for (member_id id : w.ids()) {
    const mesh_node* n = mesh_node_of(w, id);
    if (n && n->election().role() == election_role::leader) return id;
  }
  return no_member;
}

// What runs on the nodes: membership + election; + the serving layer's control (plans); + clients
// publishing requests that the peers route and serve, with failover (requests).
enum class layer { mesh, plans, requests };

struct seed_result {
  std::string failure;  // empty = passed
  request_report requests;
  std::uint64_t cold_start_ms = 0;
  std::vector<std::uint64_t> heal_ms;
  std::vector<std::uint64_t> plan_ms;  // serving: election converged -> every node on one plan
  std::uint64_t faults = 0;
  std::size_t plan_epochs = 0;
};

constexpr std::uint64_t converge_bound_ms = 15'000;

// One seeded run. Everything random comes from `rng` (schedule) and the world's seed (network).
// With `serving`, every node also runs the serving layer's control (topology reports, the leader's
// view and plan): the plan checker watches every event, and after each convergence every node must
// hold the leader's plan, serving from exactly the up nodes.
seed_result run_seed(std::uint64_t seed, bool verbose, layer what_runs = layer::mesh) {
  seed_result r;
  const bool serving = what_runs != layer::mesh;
  det_rng rng(seed * 0x2545f4914f6cdd1dULL + 7);
  const std::size_t n = 3 + rng.uniform(0, 3);  // 3, 4 or 5 nodes
  std::vector<member_id> nodes;  // the cluster (clients come after it)
  for (member_id i = 1; i <= n; ++i)
    nodes.push_back(i);
  std::unique_ptr<world> w;
  if (what_runs == layer::requests) {
    // Two clients publishing 6-12 greedy requests each over the first 20 s (while the faults
    // run), 5-40 tokens each, with the C++ client's own rules and timeouts.
    auto o = serving_cluster_options(n);
    o.serve_requests = true;
    std::vector<std::vector<scheduled_request>> schedules(2);
    for (std::size_t c = 0; c < schedules.size(); ++c) {
      const std::uint64_t k = 6 + rng.uniform(0, 7);
      for (std::uint64_t i = 0; i < k; ++i) {
        scheduled_request q;
        q.at_ms = rng.uniform(200, 20'000);
        q.req.id = fmt::format("c{}-r{}", c, i);
        q.req.model = o.model.name;
        q.req.prompt = fmt::format("prompt {} {} {}", seed, c, i);
        q.req.max_tokens = static_cast<std::uint32_t>(rng.uniform(5, 41));
        q.req.temperature = 0;
        q.req.seed = rng.uniform(0, 1000);
        schedules[c].push_back(std::move(q));
      }
      std::sort(schedules[c].begin(), schedules[c].end(),
                [](const auto& a, const auto& b) { return a.at_ms < b.at_ms; });
    }
    w = make_request_world(seed, n, o, std::move(schedules), serving::follower_options{});
  } else {
    w = make_mesh_world(seed, n, serving ? serving_cluster_options(n) : cluster_options(n));
  }
  const auto eopt = cluster_options(n).control.election;
  // CheckQuorum bound: one election timeout after the last ack, checked at the next heartbeat,
  // stretched by clock skew (2%) and delivery delay.
  election_checker check(*w, eopt.election_timeout_ms * 2 + 200);
  plan_checker plans(*w);
  std::map<member_id, std::string> last;
  w->set_observer([&] {
    check.observe();
    if (serving) plans.observe();
    if (!verbose) return;
    for (member_id id : w->ids()) {
      const mesh_node* nd = mesh_node_of(*w, id);
      std::string s =
          nd ? fmt::format("{} t{} leader {} cfg v{}/t{} {} commit {}",
                           to_string(nd->election().role()), nd->election().term(),
                           nd->election().leader(), nd->election().config().version,
                           nd->election().config().term, nd->election().config().members,
                           nd->election().commit_version())
             : "down";
      if (nd && serving && nd->plan())
        s += fmt::format(" plan {}.{} ({} groups)", nd->plan()->epoch.term, nd->plan()->epoch.version,
                         nd->plan()->models.empty() ? 0 : nd->plan()->models[0].groups.size());
      if (nd && serving) {
        const auto& c = nd->core().counters();
        const auto& v = nd->core().topology().current();
        s += fmt::format(" view {}.{} stale {} refused {} undecodable {}", v ? v->at.term : 0,
                         v ? v->at.version : 0, c.stale, c.plans_refused, nd->undecodable());
      }
      if (last[id] != s)
        std::printf("  t=%llu node %llu: %s\n", static_cast<unsigned long long>(w->now_ms()),
                    static_cast<unsigned long long>(id), s.c_str());
      last[id] = s;
    }
  });
  auto fail = [&](const std::string& what) {
    r.failure =
        fmt::format("seed {}: n={} t={}: {} | {}", seed, n, w->now_ms(), what, describe(*w));
  };
  // Serving: after the election converged, every node on the leader's plan within the bound (the
  // leader re-sends view and plan every 2 s; reports come every second).
  auto plans_settle = [&](const std::string& after) -> bool {
    if (!serving) return true;
    const std::uint64_t start = w->now_ms();
    while (plans_converged(*w)) {
      if (w->now_ms() - start > converge_bound_ms) {
        fail("plans did not converge after " + after + ": " + plans_converged(*w).value_or(""));
        return false;
      }
      w->run_for(10);
    }
    r.plan_ms.push_back(w->now_ms() - start);
    if (!plans.violations().empty()) {
      fail(plans.violations().front() + " (after " + after + ")");
      return false;
    }
    return true;
  };
  // Per-seed base network: some seeds run on a slow, jittery LAN, which makes concurrent
  // candidacies (the interesting case for vote safety) frequent.
  link_faults base;
  base.delay_min_ms = 1;
  base.delay_max_ms = static_cast<std::uint32_t>(rng.uniform(0, 2) == 0 ? 3 : rng.uniform(10, 40));
  w->set_link_faults(base);
  std::map<member_id, std::int32_t> base_rate;
  for (member_id id : nodes) {
    base_rate[id] = static_cast<std::int32_t>(rng.uniform(0, 40'001)) - 20'000;
    w->set_clock(id, rng.uniform(0, 10'000), base_rate[id]);
  }
  for (member_id id : w->ids())
    if (id > n) w->start(id);  // clients: on the global clock, their schedule from t=0
  for (member_id id : nodes) {
    w->run_for(rng.uniform(0, 200));
    w->start(id);
  }
  auto cold = run_until_converged(*w, converge_bound_ms);
  if (!cold) {
    fail("cold start did not converge: " + converged(*w).value_or(""));
    return r;
  }
  r.cold_start_ms = *cold;
  if (!plans_settle("cold start")) return r;
  const std::uint64_t episodes = 4 + rng.uniform(0, 4);
  for (std::uint64_t ep = 0; ep < episodes; ++ep) {
    std::vector<member_id> ids = nodes;
    for (std::size_t i = ids.size(); i > 1; --i)
      std::swap(ids[i - 1], ids[rng.uniform(0, i)]);
    const member_id current = leader_of(*w);
    const member_id leader = current == no_member ? ids[0] : current;
    std::vector<member_id> crashed, paused;
    std::string what;
    const std::uint64_t duration = rng.uniform(100, 3'500);
    bool ran = false;  // the episode ran its own course (swizzle-clog)
    std::vector<member_id> skewed;
    switch (rng.uniform(0, 10)) {
      case 0: {
        const std::size_t k = rng.uniform(1, n);
        std::vector<member_id> a(ids.begin(), ids.begin() + static_cast<long>(k));
        std::vector<member_id> b(ids.begin() + static_cast<long>(k), ids.end());
        w->partition({a, b});
        what = fmt::format("partition {} | {}", a, b);
        break;
      }
      case 1: {
        std::vector<member_id> rest;
        for (member_id id : ids)
          if (id != leader) rest.push_back(id);
        w->partition({{leader}, rest});
        what = fmt::format("isolate leader {}", leader);
        break;
      }
      case 2: {
        const std::size_t links = 1 + rng.uniform(0, n);
        for (std::size_t i = 0; i < links; ++i) {
          member_id a = ids[rng.uniform(0, n)], b = ids[rng.uniform(0, n)];
          if (a != b) w->block(a, b);
        }
        what = "one-way blocks";
        break;
      }
      case 3: {
        const std::size_t k = rng.uniform(1, n - 1);
        std::vector<member_id> a(ids.begin(), ids.begin() + static_cast<long>(k));
        std::vector<member_id> b(ids.begin() + static_cast<long>(k) + 1, ids.end());
        w->bridge(a, ids[k], b);
        what = fmt::format("bridge {} <{}> {}", a, ids[k], b);
        break;
      }
      case 4: {
        const member_id victim = rng.uniform(0, 2) == 0 ? leader : ids[0];
        w->crash(victim);
        crashed.push_back(victim);
        what = fmt::format("crash {}", victim);
        break;
      }
      case 5: {
        const member_id victim = rng.uniform(0, 2) == 0 ? leader : ids[0];
        w->pause(victim);
        paused.push_back(victim);
        what = fmt::format("pause {}", victim);
        break;
      }
      case 6: {
        link_faults f;
        f.drop_ppm = static_cast<std::uint32_t>(rng.uniform(50'000, 300'000));
        f.duplicate_ppm = static_cast<std::uint32_t>(rng.uniform(0, 100'000));
        f.delay_min_ms = 1;
        f.delay_max_ms = static_cast<std::uint32_t>(rng.uniform(base.delay_max_ms, 100));
        w->set_link_faults(f);
        what = fmt::format("lossy links drop {}ppm dup {}ppm delay<= {}ms", f.drop_ppm,
                           f.duplicate_ppm, f.delay_max_ms);
        break;
      }
      case 8: {
        // Swizzle-clog: clog a random subset one node at a time, then unclog them in another
        // random order; messages are held, not lost, and arrive in a burst.
        const std::size_t k = 1 + rng.uniform(0, n);
        std::vector<member_id> set(ids.begin(), ids.begin() + static_cast<long>(k));
        for (member_id id : set) {
          w->clog(id);
          w->run_for(rng.uniform(0, duration / k + 1));
        }
        std::vector<member_id> order = set;
        for (std::size_t i = order.size(); i > 1; --i)
          std::swap(order[i - 1], order[rng.uniform(0, i)]);
        for (member_id id : order) {
          w->unclog(id);
          w->run_for(rng.uniform(0, duration / k + 1));
        }
        what = fmt::format("swizzle-clog {} unclogged as {}", set, order);
        ran = true;
        break;
      }
      case 9: {
        // A clock fault (as `tessera fault clock`): one node's clock runs 0.5x, 2x or 3x as fast
        // for the episode and jumps up to 10 s forward.
        const member_id victim = rng.uniform(0, 2) == 0 ? leader : ids[0];
        const std::int32_t rates[] = {-500'000 + 1, 1'000'000, 2'000'000};
        const std::int32_t rate = rates[rng.uniform(0, 3)];
        const std::uint64_t bump = rng.uniform(0, 10'001);
        w->skew_clock(victim, rate, bump);
        skewed.push_back(victim);
        what = fmt::format("clock of {} at {:+} ppm, +{} ms", victim, rate, bump);
        break;
      }
      default: {  // crash a minority and partition the rest
        const member_id victim = ids[0];
        w->crash(victim);
        crashed.push_back(victim);
        if (n >= 4) w->partition({{ids[1]}, std::vector<member_id>(ids.begin() + 2, ids.end())});
        what = fmt::format("crash {} + partition", victim);
        break;
      }
    }
    ++r.faults;
    if (verbose)
      std::printf("seed %llu t=%llu %s for %llu ms\n", static_cast<unsigned long long>(seed),
                  static_cast<unsigned long long>(w->now_ms()), what.c_str(),
                  static_cast<unsigned long long>(duration));
    if (!ran) w->run_for(duration);
    w->heal();
    w->set_link_faults(base);
    for (member_id id : skewed)
      w->skew_clock(id, base_rate[id], 0);  // back to its own rate; the time it reached stays
    for (member_id id : crashed)
      w->restart(id);
    for (member_id id : paused)
      w->resume(id);
    auto healed = run_until_converged(*w, converge_bound_ms);
    if (!check.violations().empty()) {
      fail(check.violations().front() + " (after " + what + ")");
      return r;
    }
    if (!healed) {
      fail("did not converge after healing " + what + ": " + converged(*w).value_or(""));
      return r;
    }
    r.heal_ms.push_back(*healed);
    if (!plans_settle(what)) return r;
    w->run_for(rng.uniform(0, 500));
  }
  for (member_id id : nodes)
    if (mesh_node_of(*w, id)->undecodable() != 0)
      fail(fmt::format("node {} got undecodable bytes", id));
  r.plan_epochs = plans.epochs();
  if (what_runs == layer::requests && r.failure.empty()) {
    // Every request ends: within the clients' own deadline (120 s) at the latest.
    const auto all_done = [&] {
      return std::all_of(w->ids().begin(), w->ids().end(), [&](member_id id) {
        const client_node* c = client_node_of(*w, id);
        return c == nullptr || c->all_done();
      });
    };
    const std::uint64_t start = w->now_ms();
    while (!all_done() && w->now_ms() - start < 130'000)
      w->run_for(50);
    r.requests = check_requests(*w, serving_cluster_options(n).model.n_vocab);
    if (!r.requests.violations.empty()) fail(r.requests.violations.front());
  }
  return r;
}

// The same seed replays the same run, event for event: compare the full traces of two runs.
TEST(SimRandom, SameSeedReplaysExactly) {
  auto trace = [](std::uint64_t seed) {
    std::string t;
    auto w = make_mesh_world(seed, 5, cluster_options(5));
    w->set_link_faults(link_faults{1, 20, 50'000, 50'000});
    w->set_observer([&] { t += describe(*w) + "\n"; });
    for (member_id id : w->ids())
      w->start(id);
    w->run_for(1500);
    w->crash(1);
    w->partition({{2, 3}, {4, 5}});
    w->run_for(1500);
    w->heal();
    w->restart(1);
    w->run_for(3000);
    const auto& c = w->counters();
    return t + fmt::format("{} {} {} {}", c.events, c.delivered, c.dropped_random, c.duplicated);
  };
  for (std::uint64_t seed : {1, 2, 3}) {
    const std::string a = trace(seed);
    EXPECT_EQ(a, trace(seed)) << "seed " << seed;
    EXPECT_NE(a, trace(seed + 100)) << "different seeds should differ";
  }
}

// The seeds the environment names (TESSERA_SIM_SEED: that one; else TESSERA_SIM_FIRST_SEED and
// `count_var`, default `count`) through run_seed; a failure is reported with the line that replays
// it (at most 5), every passing seed's result goes to `passed`.
struct seed_span {
  std::uint64_t first = 0, last = 0, faults = 0;
};
seed_span run_seeds(const char* count_var, std::uint64_t count, layer what_runs, const char* filter,
                    const std::function<void(const seed_result&)>& passed) {
  const std::uint64_t single = env_u64("TESSERA_SIM_SEED", 0);
  const std::uint64_t first = single ? single : env_u64("TESSERA_SIM_FIRST_SEED", 1);
  const std::uint64_t n = single ? 1 : env_u64(count_var, count);
  const bool verbose = env_u64("TESSERA_SIM_VERBOSE", 0) != 0;
  seed_span span{first, first + n - 1, 0};
  std::uint64_t failures = 0;
  for (std::uint64_t seed = first; seed < first + n; ++seed) {
    seed_result r = run_seed(seed, verbose, what_runs);
    span.faults += r.faults;
    if (!r.failure.empty()) {
      ++failures;
      ADD_FAILURE() << r.failure << "\n  replay: TESSERA_SIM_SEED=" << seed
                    << " TESSERA_SIM_VERBOSE=1 "
                    << "tessera_mesh_sim_tests --gtest_filter='" << filter << "'";
      if (failures >= 5) break;
      continue;
    }
    passed(r);
  }
  return span;
}

TEST(SimRandom, ManySeedsKeepSafetyAndConverge) {
  std::vector<std::uint64_t> cold, heal;
  const auto s = run_seeds("TESSERA_SIM_SEEDS", 500, layer::mesh, "SimRandom.*", [&](const seed_result& r) {
    cold.push_back(r.cold_start_ms);
    heal.insert(heal.end(), r.heal_ms.begin(), r.heal_ms.end());
  });
  std::sort(cold.begin(), cold.end());
  std::sort(heal.begin(), heal.end());
  if (!cold.empty())
    std::printf(
        "seeds %llu..%llu: %llu fault episodes; cold start -> converged median %llu ms max "
        "%llu ms; heal -> converged median %llu ms max %llu ms (simulated)\n",
        static_cast<unsigned long long>(s.first), static_cast<unsigned long long>(s.last),
        static_cast<unsigned long long>(s.faults),
        static_cast<unsigned long long>(cold[cold.size() / 2]),
        static_cast<unsigned long long>(cold.back()),
        static_cast<unsigned long long>(heal.empty() ? 0 : heal[heal.size() / 2]),
        static_cast<unsigned long long>(heal.empty() ? 0 : heal.back()));
}

// The same schedules with the serving layer's control on every node (topology reports, the
// leader's view and sticky plan, adoption by epoch): plan epochs name one content, never go back,
// and after every heal all nodes hold the leader's plan, serving from exactly the up nodes.
// TESSERA_SIM_SERVING_SEEDS (default 100: SimRequests runs these checks too, on 200 more);
// replay one with TESSERA_SIM_SEED as above.
TEST(SimServing, ManySeedsAgreeOnOnePlan) {
  std::vector<std::uint64_t> settle;
  std::uint64_t epochs = 0;
  const auto s = run_seeds("TESSERA_SIM_SERVING_SEEDS", 200, layer::plans, "SimServing.ManySeeds*",
                           [&](const seed_result& r) {
                             EXPECT_GE(r.plan_ms.size(), 1u);
                             settle.insert(settle.end(), r.plan_ms.begin(), r.plan_ms.end());
                             epochs += r.plan_epochs;
                           });
  std::sort(settle.begin(), settle.end());
  if (!settle.empty())
    std::printf(
        "seeds %llu..%llu: %llu fault episodes, %llu plan epochs; election converged -> every node "
        "on the leader's plan: median %llu ms, p99 %llu ms, max %llu ms (simulated)\n",
        static_cast<unsigned long long>(s.first), static_cast<unsigned long long>(s.last),
        static_cast<unsigned long long>(s.faults), static_cast<unsigned long long>(epochs),
        static_cast<unsigned long long>(settle[settle.size() / 2]),
        static_cast<unsigned long long>(settle[settle.size() * 99 / 100]),
        static_cast<unsigned long long>(settle.back()));
}

// The same schedules with clients publishing requests while the faults run: the peers route them
// (serving::decide over each one's own plan and members), admit duplicates and resumptions
// (serving::admit) and generate modelled streams; the clients follow them with the C++ client's
// stream_follower. Every request must end in exactly one outcome — a completed stream whose
// indices arrived once each and whose tokens equal the single-peer reference — across crashes,
// pauses, partitions and swizzle-clogs of the serving peers.
// TESSERA_SIM_REQUEST_SEEDS (default 200); replay one with TESSERA_SIM_SEED as above.
TEST(SimRequests, ManySeedsServeEveryRequestOnceAndRight) {
  request_report all;
  const auto s = run_seeds("TESSERA_SIM_REQUEST_SEEDS", 300, layer::requests, "SimRequests.*",
                           [&](const seed_result& r) {
                             all.requests += r.requests.requests;
                             all.completed += r.requests.completed;
                             all.resumed += r.requests.resumed;
                             all.tokens += r.requests.tokens;
                             all.publications += r.requests.publications;
                             all.max_attempts = std::max(all.max_attempts, r.requests.max_attempts);
                             all.latency_ms.insert(all.latency_ms.end(),
                                                   r.requests.latency_ms.begin(),
                                                   r.requests.latency_ms.end());
                           });
  EXPECT_GT(all.requests, 0u);
  EXPECT_EQ(all.completed, all.requests);
  std::sort(all.latency_ms.begin(), all.latency_ms.end());
  if (!all.latency_ms.empty())
    std::printf(
        "seeds %llu..%llu: %llu fault episodes; %llu requests, %llu completed (%llu tokens), %llu "
        "resumed at least once (most attempts %u), %llu publications; publish -> done: median "
        "%llu ms, p99 %llu ms, max %llu ms (simulated)\n",
        static_cast<unsigned long long>(s.first), static_cast<unsigned long long>(s.last),
        static_cast<unsigned long long>(s.faults), static_cast<unsigned long long>(all.requests),
        static_cast<unsigned long long>(all.completed), static_cast<unsigned long long>(all.tokens),
        static_cast<unsigned long long>(all.resumed), all.max_attempts,
        static_cast<unsigned long long>(all.publications),
        static_cast<unsigned long long>(all.latency_ms[all.latency_ms.size() / 2]),
        static_cast<unsigned long long>(all.latency_ms[all.latency_ms.size() * 99 / 100]),
        static_cast<unsigned long long>(all.latency_ms.back()));
}

// Simulated failover and cold-start times with default timeouts on a LAN-like link (1-3 ms).
// Prints the distribution (reported in bench/RESULTS.md); asserts only liveness (a new leader
// within a generous bound), never a time.
TEST(SimTiming, LeaderKillAndColdStart) {
  const std::uint64_t seeds = env_u64("TESSERA_SIM_TIMING_SEEDS", 100);
  for (std::size_t n : {3, 5}) {
    std::vector<std::uint64_t> elected, agreed, cold_leader, cold_all, detected;
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
      auto w = make_mesh_world(seed, n, cluster_options(n));
      for (member_id id : w->ids())
        w->start(id);
      std::uint64_t first_leader = 0;
      while (leader_of(*w) == no_member && w->now_ms() < 10'000)
        w->run_for(1);
      first_leader = w->now_ms();
      auto all = run_until_converged(*w, 10'000, 1);
      ASSERT_TRUE(all.has_value()) << "seed " << seed << " " << describe(*w);
      cold_leader.push_back(first_leader);
      cold_all.push_back(w->now_ms());
      det_rng rng(seed);
      w->run_for(rng.uniform(0, 1000));
      const member_id old = leader_of(*w);
      ASSERT_NE(old, no_member);
      w->crash(old);
      const std::uint64_t t0 = w->now_ms();
      member_id next = no_member;
      while ((next = leader_of(*w)) == no_member && w->now_ms() < t0 + 10'000)
        w->run_for(1);
      ASSERT_NE(next, no_member) << "seed " << seed << ": no new leader within 10 s";
      elected.push_back(w->now_ms() - t0);
      auto follows = [&] {
        for (member_id id : w->ids()) {
          const mesh_node* nd = mesh_node_of(*w, id);
          if (nd && (nd->election().leader() != next ||
                     nd->election().term() != mesh_node_of(*w, next)->election().term()))
            return false;
        }
        return true;
      };
      while (!follows() && w->now_ms() < t0 + 10'000)
        w->run_for(1);
      ASSERT_TRUE(follows()) << "seed " << seed << " " << describe(*w);
      agreed.push_back(w->now_ms() - t0);
      auto all_see_dead = [&] {
        for (member_id id : w->ids()) {
          const mesh_node* nd = mesh_node_of(*w, id);
          if (nd && nd->membership().status_of(old) != member_status::dead) return false;
        }
        return true;
      };
      while (!all_see_dead() && w->now_ms() < t0 + 10'000) w->run_for(1);
      ASSERT_TRUE(all_see_dead()) << "seed " << seed << ": membership never declared " << old;
      detected.push_back(w->now_ms() - t0);
    }
    auto stat = [](std::vector<std::uint64_t> v) {
      std::sort(v.begin(), v.end());
      return fmt::format("median {} p90 {} max {}", v[v.size() / 2], v[v.size() * 9 / 10],
                         v.back());
    };
    std::printf(
        "n=%zu over %llu seeds (simulated ms): cold start -> first leader %s; -> all members "
        "committed %s; leader kill -> new leader %s; -> all survivors follow it %s; -> "
        "membership dead at all survivors %s\n",
        n, static_cast<unsigned long long>(seeds), stat(cold_leader).c_str(),
        stat(cold_all).c_str(), stat(elected).c_str(), stat(agreed).c_str(),
        stat(detected).c_str());
  }
}

}  // namespace
}  // namespace tessera::mesh::sim
