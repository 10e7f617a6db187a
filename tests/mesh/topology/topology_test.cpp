// topology_state: the leader's merge/publish rules and the followers' epoch rule.
#include "mesh/topology/topology.hpp"

#include <limits>

#include <gtest/gtest.h>

namespace tessera::mesh::topology {
namespace {

constexpr std::uint8_t alive = 0;
constexpr std::uint8_t dead = 2;

std::vector<member_fact> facts(std::initializer_list<member_id> ids, std::uint8_t status = alive) {
  std::vector<member_fact> out;
  for (auto id : ids)
    out.push_back({id, status, "addr"});
  return out;
}

row_report row(member_id from, std::initializer_list<member_id> to, std::uint64_t rtt = 100,
               std::uint8_t backend = 1) {
  row_report r;
  r.from = from;
  r.caps.cores = 4;
  for (auto t : to)
    r.links.push_back({from, t, rtt, 0.0, backend});
  return r;
}

TEST(Topology, FollowerNeverPublishes) {
  topology_state t({.self = 2});
  t.on_members(facts({1, 2, 3}));
  t.on_leader(1, 1);
  EXPECT_FALSE(t.maybe_publish(0).has_value());
  EXPECT_FALSE(t.is_leader());
}

TEST(Topology, MalformedReportsAreRefusedAndCounted) {
  topology_state t({.self = 1, .max_links_per_report = 2});
  t.on_members(facts({1, 2, 3, 4}));
  EXPECT_FALSE(t.on_report(row(9, {1})));  // not a member
  auto wrong_from = row(2, {1});
  wrong_from.links[0].from = 3;  // a link that is not the reporter's
  EXPECT_FALSE(t.on_report(wrong_from));
  EXPECT_FALSE(t.on_report(row(2, {2})));  // a link to itself
  auto bad_backend = row(2, {1}, 100, 7);
  EXPECT_FALSE(t.on_report(bad_backend));
  auto nan_bw = row(2, {1});
  nan_bw.links[0].bandwidth_mbps = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(t.on_report(nan_bw));
  EXPECT_FALSE(t.on_report(row(2, {1, 3, 4})));  // over max_links_per_report
  EXPECT_EQ(t.counters().reports_refused, 6u);
  EXPECT_TRUE(t.on_report(row(2, {1, 3})));
}

TEST(Topology, LeaderPublishesOnElectionThenOnlyOnChange) {
  topology_state t({.self = 1});
  t.on_members(facts({1, 2, 3}));
  t.on_leader(4, 1);
  auto v = t.maybe_publish(10);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->at, (epoch{4, 1}));
  EXPECT_EQ(v->leader, 1u);
  ASSERT_EQ(v->members.size(), 3u);
  EXPECT_TRUE(v->links.empty());
  EXPECT_FALSE(t.maybe_publish(11).has_value());  // nothing changed

  ASSERT_TRUE(t.on_report(row(2, {1, 3})));
  auto v2 = t.maybe_publish(12);
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->at, (epoch{4, 2}));
  ASSERT_EQ(v2->links.size(), 2u);
  EXPECT_EQ(v2->links[0].from, 2u);
  EXPECT_EQ(v2->links[0].to, 1u);
  EXPECT_EQ(v2->members[1].caps.cores, 4u);
  EXPECT_EQ(t.current(), v2);
}

TEST(Topology, MeasurementNoiseIsRateLimitedButBigMovesPublish) {
  topology_state t({.self = 1, .refresh_ms = 1000, .significant_change = 0.5});
  t.on_members(facts({1, 2}));
  t.on_leader(1, 1);
  ASSERT_TRUE(t.on_report(row(2, {1}, 100)));
  ASSERT_TRUE(t.maybe_publish(0).has_value());
  ASSERT_TRUE(t.on_report(row(2, {1}, 120)));  // +20 %: noise
  EXPECT_FALSE(t.maybe_publish(5000).has_value());
  ASSERT_TRUE(t.on_report(row(2, {1}, 400)));  // x4, but inside refresh_ms of the last view
  EXPECT_FALSE(t.maybe_publish(500).has_value());
  auto v = t.maybe_publish(1000);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->links[0].rtt_us, 400u);
}

TEST(Topology, BackendChangeAndMemberDeathAreStructural) {
  topology_state t({.self = 1, .refresh_ms = 1'000'000});
  t.on_members(facts({1, 2, 3}));
  t.on_leader(2, 1);
  ASSERT_TRUE(t.on_report(row(2, {1, 3}, 100, 1)));
  ASSERT_TRUE(t.on_report(row(3, {1, 2}, 100, 1)));
  ASSERT_TRUE(t.maybe_publish(0).has_value());
  ASSERT_TRUE(t.on_report(row(2, {1, 3}, 100, 2)));  // tcp -> shm
  auto v = t.maybe_publish(1);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->links[0].backend, 2u);

  auto f = facts({1, 2});
  f.push_back({3, dead, "addr"});
  t.on_members(f);
  auto v2 = t.maybe_publish(2);
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->members.size(), 3u);
  EXPECT_EQ(v2->members[2].status, dead);
  for (const auto& l : v2->links) {
    EXPECT_NE(l.from, 3u);  // no links to or from a dead member
    EXPECT_NE(l.to, 3u);
  }
  EXPECT_EQ(v2->links.size(), 1u);
}

TEST(Topology, FollowersAdoptOnlyNewerEpochs) {
  topology_state f({.self = 2});
  view a;
  a.at = {3, 5};
  view older;
  older.at = {3, 4};
  view lower_term_higher_version;
  lower_term_higher_version.at = {2, 99};
  view newer_term;
  newer_term.at = {4, 1};
  EXPECT_TRUE(f.on_view(a));
  EXPECT_FALSE(f.on_view(a));  // duplicate
  EXPECT_FALSE(f.on_view(older));
  EXPECT_FALSE(f.on_view(lower_term_higher_version));
  EXPECT_TRUE(f.on_view(newer_term));
  EXPECT_EQ(f.current()->at, (epoch{4, 1}));
  EXPECT_EQ(f.counters().views_stale, 3u);
}

TEST(Topology, NewLeaderSupersedesThePreviousLeadersViews) {
  // Node 2 follows leader 1 (term 3, many versions), then wins term 4: its first view must be
  // newer than anything 1 published.
  topology_state t({.self = 2});
  t.on_members(facts({1, 2, 3}));
  t.on_leader(3, 1);
  view from1;
  from1.at = {3, 40};
  ASSERT_TRUE(t.on_view(from1));
  t.on_leader(4, 2);
  auto v = t.maybe_publish(0);
  ASSERT_TRUE(v.has_value());
  EXPECT_GT(v->at, from1.at);
  EXPECT_EQ(v->at, (epoch{4, 1}));
}

// A new leader's first view is the view in force (capabilities and links of every member that had
// reported), not an empty one: a view without capabilities plans no model at all.
TEST(Topology, NewLeaderStartsFromTheViewInForce) {
  topology_state old_leader({.self = 1});
  old_leader.on_members(facts({1, 2, 3}));
  old_leader.on_leader(3, 1);
  for (member_id id : {1, 2, 3}) {
    auto r = row(id, {id == 1 ? 2u : 1u, id == 3 ? 2u : 3u});
    r.caps.memory_free_mb = 1000 * id;
    ASSERT_TRUE(old_leader.on_report(r));
  }
  auto published = old_leader.maybe_publish(0);
  ASSERT_TRUE(published.has_value());

  topology_state t({.self = 2});
  t.on_members(facts({1, 2, 3}));
  t.on_leader(3, 1);
  ASSERT_TRUE(t.on_view(*published));
  t.on_members({{1, dead, "addr"}, {2, alive, "addr"}, {3, alive, "addr"}});  // the leader died
  t.on_leader(4, 2);
  auto v = t.maybe_publish(0);
  ASSERT_TRUE(v.has_value());
  ASSERT_EQ(v->members.size(), 3u);
  EXPECT_EQ(v->members[1].caps.memory_free_mb, 2000u);
  EXPECT_EQ(v->members[2].caps.memory_free_mb, 3000u);
  EXPECT_EQ(v->members[0].status, dead);
  // The live members' links between live members: 2 -> 3 and 3 -> 2 (1 is dead).
  ASSERT_EQ(v->links.size(), 2u);
  EXPECT_EQ(v->links[0].from, 2u);
  EXPECT_EQ(v->links[0].to, 3u);
  EXPECT_EQ(v->links[1].from, 3u);
  EXPECT_EQ(v->links[1].to, 2u);
  // A fresh report replaces the row taken from the view.
  auto r = row(3, {2});
  r.caps.memory_free_mb = 42;
  ASSERT_TRUE(t.on_report(r));
  auto v2 = t.maybe_publish(10);
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->members[2].caps.memory_free_mb, 42u);
}

TEST(Topology, MemberTableIsBoundedAndRowsOfGoneMembersForgotten) {
  topology_state t({.self = 1, .max_members = 3});
  t.on_members(facts({1, 2, 3, 4, 5}));
  EXPECT_EQ(t.counters().members_refused, 2u);
  EXPECT_FALSE(t.on_report(row(5, {1})));  // 5 was cut at the bound
  ASSERT_TRUE(t.on_report(row(3, {1})));
  t.on_members(facts({1, 2}));
  t.on_leader(1, 1);
  auto v = t.maybe_publish(0);
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->links.empty());
  EXPECT_EQ(v->members.size(), 2u);
}

TEST(Topology, SuspicionFlipsAreRateLimitedDeathIsNot) {
  topology_state t({.self = 1, .refresh_ms = 1000});
  t.on_members(facts({1, 2, 3}));
  t.on_leader(1, 1);
  ASSERT_TRUE(t.maybe_publish(0).has_value());
  auto f = facts({1, 2, 3});
  f[1].status = 1;  // 2 suspect
  t.on_members(f);
  EXPECT_FALSE(t.maybe_publish(10).has_value());  // transient: waits for the refresh
  auto v = t.maybe_publish(1000);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->members[1].status, 1u);
  f[1].status = dead;
  t.on_members(f);
  EXPECT_TRUE(t.maybe_publish(1001).has_value());  // death is structural: at once
}

}  // namespace
}  // namespace tessera::mesh::topology
