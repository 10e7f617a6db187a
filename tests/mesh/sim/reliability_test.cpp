// Issue 31's findings as simulator scenarios, on the node's own control code (runtime::control_core
// in mesh/sim/mesh_node) with the engine's pure intake rules and the C++ client's stream_follower.
// Each scenario runs over several seeds (each seed its own interleavings and network jitter) and,
// where a part of the fix can be switched off in the simulator (peer lists, cancels, Lifeguard's
// stall awareness), also without it, to show that the scenario sees the finding:
//
//   - the serving peer dies: the client resumes within a second (peer lists), not after its 3 s
//     silence timer;
//   - two of three peers die: the survivor, with no quorum and no leader, serves the running
//     stream and new requests;
//   - the serving peer is partitioned from the other two (clients reach all three): both sides
//     accept new requests, the client cuts the later acceptance; duplicated tokens per request
//     stay within one round;
//   - a peer that the host stops running now and then (SIGSTOP-like pauses) accuses nobody, and no
//     one is declared dead.
//
// Times are simulated (deterministic per seed), so bounds on them are not timing tests.
//   build/release/tests/mesh/sim/tessera_mesh_sim_tests --gtest_filter='SimReliability.*'
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "mesh/sim/checkers.hpp"
#include "mesh/sim/client_node.hpp"
#include "mesh/sim/mesh_node.hpp"

namespace tessera::mesh::sim {
namespace {

constexpr std::size_t kPeers = 3;
constexpr member_id kClient = kPeers + 1;
// Requests start after the cluster converged (cold start takes ~1-2 s of simulated time).
constexpr std::uint64_t kFirstRequestMs = 8'000;

serving::request make_request(const std::string& id, std::uint32_t tokens, std::uint64_t seed) {
  serving::request q;
  q.id = id;
  q.model = "sim";
  q.prompt = fmt::format("prompt {} {}", id, seed);
  q.max_tokens = tokens;
  q.temperature = 0;
  q.seed = seed;
  return q;
}

// A cluster of kPeers peers on a LAN (1-3 ms) and one client with `schedule`, converged (election
// and plans) before the first request.
std::unique_ptr<world> converged_cluster(std::uint64_t seed,
                                         std::vector<scheduled_request> schedule,
                                         const mesh_node_options& o) {
  std::vector<std::vector<scheduled_request>> schedules{std::move(schedule)};
  auto w = make_request_world(seed, kPeers, o, std::move(schedules), serving::follower_options{});
  w->set_link_faults(link_faults{1, 3, 0, 0});
  w->start(kClient);
  for (member_id id = 1; id <= kPeers; ++id)
    w->start(id);
  EXPECT_TRUE(run_until_converged(*w, 6'000).has_value()) << describe(*w);
  while (plans_converged(*w) && w->now_ms() < kFirstRequestMs - 500)
    w->run_for(10);
  EXPECT_FALSE(plans_converged(*w).has_value()) << "seed " << seed << ": no plan before requests";
  w->run_until(kFirstRequestMs - 1);
  return w;
}

mesh_node_options request_options() {
  auto o = serving_cluster_options(kPeers);
  o.serve_requests = true;
  return o;
}

const request_record& record_of(const world& w, const std::string& id) {
  return client_node_of(w, kClient)->records().at(id);
}

std::size_t tokens_of(const world& w, const std::string& id) {
  const auto& records = client_node_of(w, kClient)->records();
  auto it = records.find(id);
  return it == records.end() ? 0 : it->second.tokens.size();
}

member_id serving_peer(const world& w, const std::string& id) {
  for (member_id p = 1; p <= kPeers; ++p)
    if (const mesh_node* n = mesh_node_of(w, p); n && n->serves(id)) return p;
  return no_member;
}

// Runs until the client has every outcome (bounded); every request must have completed with the
// single-peer tokens, each index once.
void finish_and_check(world& w, std::uint64_t seed, std::uint64_t bound_ms = 60'000) {
  const std::uint64_t until = w.now_ms() + bound_ms;
  while (!client_node_of(w, kClient)->all_done() && w.now_ms() < until)
    w.run_for(50);
  const auto report = check_requests(w, request_options().model.n_vocab);
  EXPECT_TRUE(report.violations.empty())
      << "seed " << seed << ": " << (report.violations.empty() ? "" : report.violations.front());
}

// When the first token that `dead` did not send arrived at or after `t` (0: none did).
std::uint64_t first_token_after(const request_record& r, std::uint64_t t, member_id dead) {
  for (std::size_t i = 0; i < r.token_ms.size(); ++i)
    if (r.token_ms[i] >= t && r.token_nodes[i] != mesh_node::hex_of(dead)) return r.token_ms[i];
  return 0;
}

std::string spread(std::vector<std::uint64_t> v) {
  std::sort(v.begin(), v.end());
  return fmt::format("median {} ms, max {} ms", v[v.size() / 2], v.back());
}

constexpr std::uint64_t kSeeds = 12;

// Finding 2: kill -9 of the serving peer mid-stream. The others declare it dead (~0.5-0.7 s),
// their peer lists leave it out, and the client resumes once it has been silent 700 ms — instead
// of waiting for its 3 s silence timer.
std::vector<std::uint64_t> resume_gaps(bool peer_lists) {
  std::vector<std::uint64_t> gaps;
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    auto o = request_options();
    o.peer_lists = peer_lists;
    // Ids differ per seed: a request's group follows from its id.
    const std::string id = fmt::format("long-{}", seed);
    auto w = converged_cluster(seed, {{kFirstRequestMs, make_request(id, 200, seed)}}, o);
    while (tokens_of(*w, id) < 20 && w->now_ms() < kFirstRequestMs + 5'000)
      w->run_for(1);
    const member_id victim = serving_peer(*w, id);
    EXPECT_NE(victim, no_member) << "seed " << seed;
    if (victim == no_member) continue;
    const std::uint64_t kill = w->now_ms();
    w->crash(victim);
    finish_and_check(*w, seed);
    const std::uint64_t next = first_token_after(record_of(*w, id), kill, victim);
    EXPECT_NE(next, 0u) << "seed " << seed;
    gaps.push_back(next - kill);
  }
  return gaps;
}

TEST(SimReliability, TheServingPeersDeathIsHeardWithinASecond) {
  const auto with = resume_gaps(true);
  const auto without = resume_gaps(false);
  std::printf(
      "kill of the serving peer -> next token over %llu seeds (simulated): with peer lists "
      "%s; without %s\n",
      static_cast<unsigned long long>(kSeeds), spread(with).c_str(), spread(without).c_str());
  for (std::uint64_t g : with)
    EXPECT_LE(g, 1'200u);
  // Without the lists the client waits for its stall timer (3 s): the scenario sees the finding.
  for (std::uint64_t g : without)
    EXPECT_GE(g, serving::follower_options{}.stall_ms);
}

// Finding 4, second half: two of three peers die (the serving one among them). The survivor has no
// quorum, so no leader and no new plan; it holds the weights, so it serves the running stream and a
// request published right after the kills.
TEST(SimReliability, TheLoneSurvivorServesWithoutALeader) {
  std::vector<std::uint64_t> resumed, fresh;
  constexpr std::uint64_t kKillAt = kFirstRequestMs + 600;  // ~25 tokens into the stream
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    const std::string id = fmt::format("long-{}", seed), id2 = fmt::format("after-{}", seed);
    auto w = converged_cluster(seed,
                               {{kFirstRequestMs, make_request(id, 200, seed)},
                                {kKillAt + 50, make_request(id2, 40, seed)}},
                               request_options());
    w->run_until(kKillAt);
    const member_id victim = serving_peer(*w, id);
    ASSERT_NE(victim, no_member) << "seed " << seed;
    const member_id other = victim % kPeers + 1;
    w->crash(victim);
    w->crash(other);
    finish_and_check(*w, seed);
    const member_id survivor = kPeers * (kPeers + 1) / 2 - victim - other;
    const mesh_node* s = mesh_node_of(*w, survivor);
    ASSERT_NE(s, nullptr);
    EXPECT_NE(s->election().role(), election_role::leader) << "seed " << seed << ": no quorum";
    EXPECT_EQ(s->election().leader(), no_member) << "seed " << seed;
    resumed.push_back(first_token_after(record_of(*w, id), kKillAt, victim) - kKillAt);
    const auto& after = record_of(*w, id2);
    ASSERT_FALSE(after.token_ms.empty()) << "seed " << seed;
    fresh.push_back(after.token_ms.front() - (kKillAt + 50));
  }
  std::printf(
      "two of three peers killed, over %llu seeds (simulated): the running stream's next "
      "token after %s; a request published 50 ms after the kills: first token after %s\n",
      static_cast<unsigned long long>(kSeeds), spread(resumed).c_str(), spread(fresh).c_str());
  for (std::uint64_t t : resumed)
    EXPECT_LE(t, 2'000u);
  for (std::uint64_t t : fresh)
    EXPECT_LE(t, 2'000u);
}

// Finding 4, first half: the serving peer is cut off from the other two; clients still reach all
// three. Each side has declared the other dead, so both take new requests (availability wins); the
// client keeps the first acceptance and cancels the later by node id. Duplicated tokens per
// request: tokens the peers sent minus the stream's length.
struct duplicates {
  std::uint64_t requests = 0, most = 0, total = 0, cut = 0;
};

duplicates partition_duplicates(bool cancels) {
  duplicates d;
  constexpr std::uint64_t kCutAt = kFirstRequestMs + 600;
  constexpr std::uint64_t kHealAt = kCutAt + 8'000;
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    auto o = request_options();
    o.cancels = cancels;
    const std::string id = fmt::format("long-{}", seed);
    std::vector<scheduled_request> schedule{{kFirstRequestMs, make_request(id, 200, seed)}};
    // Published once both sides have declared the other dead (~1-2 s after the cut).
    for (int i = 0; i < 4; ++i)
      schedule.push_back({kCutAt + 2'500 + 400 * static_cast<std::uint64_t>(i),
                          make_request(fmt::format("during-{}-{}", seed, i), 60, seed + i)});
    auto w = converged_cluster(seed, std::move(schedule), o);
    w->run_until(kCutAt);
    const member_id cut = serving_peer(*w, id);
    EXPECT_NE(cut, no_member) << "seed " << seed;
    if (cut == no_member) continue;
    std::vector<member_id> rest;
    for (member_id p = 1; p <= kPeers; ++p)
      if (p != cut) rest.push_back(p);
    w->partition({{cut}, rest});  // the client is in no group: it reaches everyone
    w->run_until(kHealAt);
    w->heal();
    finish_and_check(*w, seed);
    for (const auto& [rid, rec] : client_node_of(*w, kClient)->records()) {
      std::uint64_t sent = 0;
      for (member_id p = 1; p <= kPeers; ++p)
        if (const mesh_node* n = mesh_node_of(*w, p)) sent += n->tokens_sent(rid);
      const std::uint64_t dup = sent - rec.req.max_tokens;
      ++d.requests;
      d.total += dup;
      d.most = std::max(d.most, dup);
    }
    for (member_id p = 1; p <= kPeers; ++p)
      if (const mesh_node* n = mesh_node_of(*w, p)) d.cut += n->cancelled();
  }
  return d;
}

TEST(SimReliability, APartitionedServingPeerAndTheMajorityDuplicateAtMostOneRound) {
  const auto with = partition_duplicates(true);
  const auto without = partition_duplicates(false);
  std::printf(
      "partition {serving peer} | {the other two}, %llu requests over %llu seeds "
      "(simulated): duplicated tokens with the client's cut %llu in all, at most %llu per "
      "request (%llu acceptances cut); without it %llu in all, at most %llu per request\n",
      static_cast<unsigned long long>(with.requests), static_cast<unsigned long long>(kSeeds),
      static_cast<unsigned long long>(with.total), static_cast<unsigned long long>(with.most),
      static_cast<unsigned long long>(with.cut), static_cast<unsigned long long>(without.total),
      static_cast<unsigned long long>(without.most));
  // One round: a stream makes one token per round, so at most one token of a duplicate copy.
  EXPECT_LE(with.most, 1u);
  EXPECT_GT(with.cut, 0u) << "the scenario must make both sides accept";
  EXPECT_GT(without.most, 1u) << "without cancels the duplicate copy runs on";
}

// Finding 1, as the simulator can model it: a peer that the host stops running for 300 ms every
// 1.5 s (what a starved or SIGSTOPped process looks like to its peers), while streams run. When it
// runs again, its timers are late and its peers' acks wait in its queue: Lifeguard's stall
// awareness keeps it from accusing the peers it could not hear, and nobody is declared dead.
struct stall_counts {
  std::uint64_t accused_by_stalled = 0, dead = 0, plans = 0, leaders = 0;
};

stall_counts stalled_peer(std::uint64_t seed, std::uint32_t stall_threshold_ms) {
  auto o = request_options();
  o.control.membership.stall_threshold_ms = stall_threshold_ms;
  std::vector<scheduled_request> schedule;
  for (int i = 0; i < 30; ++i)
    schedule.push_back({kFirstRequestMs + 2'000 * static_cast<std::uint64_t>(i),
                        make_request(fmt::format("load-{}-{}", seed, i), 100, seed + i)});
  auto w = converged_cluster(seed, std::move(schedule), o);
  plan_checker plans(*w);
  election_checker leaders(*w, o.control.election.election_timeout_ms * 2 + 200);
  w->set_observer([&] {
    plans.observe();
    leaders.observe();
  });
  plans.observe();  // the converged cluster's plan and leader: what must not change
  leaders.observe();
  const std::size_t plans_before = plans.epochs();
  const std::size_t leaders_before = leaders.leaders().size();
  constexpr member_id kStalled = 2;
  for (int i = 0; i < 40; ++i) {
    w->run_for(1'200);
    w->pause(kStalled);
    w->run_for(300);
    w->resume(kStalled);
  }
  finish_and_check(*w, seed);
  w->set_observer({});
  stall_counts c;
  for (member_id p = 1; p <= kPeers; ++p) {
    const mesh_node* n = mesh_node_of(*w, p);
    if (n == nullptr) continue;
    for (const auto& e : n->member_events()) {
      if (e.at_ms < kFirstRequestMs) continue;
      if (e.event.status == member_status::dead) ++c.dead;
      if (p == kStalled && e.event.status == member_status::suspect) ++c.accused_by_stalled;
    }
  }
  c.plans = plans.epochs() - plans_before;
  c.leaders = leaders.leaders().size() - leaders_before;
  return c;
}

TEST(SimReliability, APeerThatStallsAccusesNobodyAndNobodyDies) {
  stall_counts with, without;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const auto a = stalled_peer(seed, request_options().control.membership.stall_threshold_ms);
    const auto b = stalled_peer(seed, 1'000'000);  // stall awareness off
    with.accused_by_stalled += a.accused_by_stalled;
    with.dead += a.dead;
    with.plans += a.plans;
    with.leaders += a.leaders;
    without.accused_by_stalled += b.accused_by_stalled;
    without.dead += b.dead;
    EXPECT_EQ(a.dead, 0u) << "seed " << seed;
    EXPECT_EQ(a.accused_by_stalled, 0u) << "seed " << seed;
    EXPECT_EQ(a.plans, 0u) << "seed " << seed << ": the plan changed";
    EXPECT_EQ(a.leaders, 0u) << "seed " << seed << ": a new leader";
  }
  std::printf(
      "a peer stopped 300 ms every 1.5 s for 60 s, 6 seeds (simulated): with stall "
      "awareness it accused its peers %llu times, %llu dead, %llu plans, %llu leaders; "
      "without %llu accusations, %llu dead\n",
      static_cast<unsigned long long>(with.accused_by_stalled),
      static_cast<unsigned long long>(with.dead), static_cast<unsigned long long>(with.plans),
      static_cast<unsigned long long>(with.leaders),
      static_cast<unsigned long long>(without.accused_by_stalled),
      static_cast<unsigned long long>(without.dead));
}

}  // namespace
}  // namespace tessera::mesh::sim
