// Election state machine driven directly (no simulator): bad input and bounds first, then the
// vote/lease/durability rules one message at a time.
#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "mesh/election/election.hpp"

namespace tessera::mesh {
namespace {

election_config config_for(member_id id) {
  election_config c;
  c.self = id;
  c.rng_seed = 5;
  return c;
}

durable_election_state member_of(std::vector<member_id> members, std::uint64_t term) {
  durable_election_state d;
  d.term = term;
  d.config = member_config{3, term, 1, std::move(members)};
  return d;
}

election_message msg(election_message_type type, member_id from, member_id to, std::uint64_t term) {
  election_message m;
  m.type = static_cast<std::uint8_t>(type);
  m.from = from;
  m.to = to;
  m.term = term;
  return m;
}

election_message heartbeat(member_id from, member_id to, std::uint64_t term,
                           std::vector<member_id> members) {
  election_message m = msg(election_message_type::heartbeat, from, to, term);
  m.config = member_config{3, term, 1, std::move(members)};
  return m;
}

const election_message* find(const election_output& out, election_message_type type) {
  for (const auto& m : out.messages)
    if (m.type == static_cast<std::uint8_t>(type)) return &m;
  return nullptr;
}

// ---- bad input and bounds ------------------------------------------------------------------

TEST(ElectionConfig, RejectsUnusableValuesNamingTheField) {
  election_config c = config_for(1);
  c.election_timeout_ms = c.heartbeat_interval_ms;
  auto r = election::create(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  EXPECT_NE(r.error().message.find("election_timeout_ms"), std::string::npos);
  c = config_for(0);
  r = election::create(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("self"), std::string::npos);
}

TEST(Election, RejectsInconsistentRestoredState) {
  auto d = member_of({3, 1, 2}, 4);  // unsorted
  auto r = election::create(config_for(1), d);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::corrupt);
  d = member_of({1, 2, 3}, 4);
  d.config.term = 9;  // config from a term we never reached
  EXPECT_FALSE(election::create(config_for(1), d));
  election_config small = config_for(1);
  small.max_members = 2;
  EXPECT_FALSE(election::create(small, member_of({1, 2, 3}, 4)));
}

TEST(Election, MalformedMessagesAreCountedAndChangeNothing) {
  auto e = election::create(config_for(2), member_of({1, 2, 3}, 4)).value();
  (void)e.step(election_tick{}, 0);
  auto unknown = msg(election_message_type::heartbeat, 1, 2, 9);
  unknown.type = 42;
  (void)e.step(election_receive{unknown}, 1);
  (void)e.step(election_receive{heartbeat(1, 7, 9, {1, 2, 3})}, 2);  // not for us
  (void)e.step(election_receive{heartbeat(2, 2, 9, {1, 2, 3})}, 3);  // from ourselves
  (void)e.step(election_receive{heartbeat(1, 2, 9, {3, 2})}, 4);     // unsorted config
  (void)e.step(election_receive{heartbeat(5, 2, 9, {1, 2, 3})}, 5);  // leader not in it
  EXPECT_EQ(e.counters().malformed, 5u);
  EXPECT_EQ(e.term(), 4u);
  EXPECT_EQ(e.leader(), no_member);
}

TEST(Election, LeaderAtMemberBoundRefusesToAddMore) {
  election_config c = config_for(1);
  c.max_members = 1;
  durable_election_state d;
  d.term = 1;
  d.voted_for = 1;
  d.config = member_config{1, 1, 1, {1}};
  auto e = election::create(c, d).value();
  std::uint64_t now = 0;
  (void)e.step(election_tick{}, now);
  (void)e.step(peer_status_changed{2, member_status::alive}, now);
  while (e.role() != election_role::leader && now < 5000)
    (void)e.step(election_tick{}, now += 10);
  ASSERT_EQ(e.role(), election_role::leader);
  auto resp = msg(election_message_type::heartbeat_resp, 2, 1, e.term());
  resp.granted = true;
  (void)e.step(election_receive{resp}, now += 1);
  (void)e.step(election_tick{}, now += 100);
  EXPECT_EQ(e.config().members, std::vector<member_id>{1});
  EXPECT_GE(e.counters().members_refused, 1u);
}

TEST(Election, PeerTableBoundForgetsGonePeersFirst) {
  election_config c = config_for(1);
  c.max_members = 2;  // peer table bound: 4 * max_members = 8
  auto e = election::create(c).value();
  (void)e.step(election_tick{}, 0);
  for (member_id id = 2; id <= 9; ++id)
    (void)e.step(peer_status_changed{id, id <= 5 ? member_status::dead : member_status::alive}, id);
  EXPECT_EQ(e.counters().members_refused, 0u);
  // Full: each new peer replaces the longest-gone dead one (2, then 3, ...).
  for (member_id id = 10; id <= 13; ++id)
    (void)e.step(peer_status_changed{id, member_status::alive}, 100 + id);
  EXPECT_EQ(e.counters().members_refused, 0u);
  // Now every entry is alive: the next new peer is refused and counted.
  (void)e.step(peer_status_changed{14, member_status::alive}, 200);
  EXPECT_EQ(e.counters().members_refused, 1u);
}

TEST(Election, MessagesAndDurableStateRoundTripThroughMsgpack) {
  auto m = heartbeat(1, 2, 7, {1, 2, 3});
  m.commit_version = 3;
  msgpack::sbuffer buf;
  msgpack::pack(buf, m);
  auto back = msgpack::unpack(buf.data(), buf.size()).get().as<election_message>();
  EXPECT_EQ(back.config, m.config);
  EXPECT_EQ(back.commit_version, 3u);
  durable_election_state d = member_of({1, 2}, 8);
  d.voted_for = 2;
  msgpack::sbuffer b2;
  msgpack::pack(b2, d);
  EXPECT_EQ(msgpack::unpack(b2.data(), b2.size()).get().as<durable_election_state>(), d);
}

// ---- rules -----------------------------------------------------------------------------------

TEST(Election, VoteIsPersistedAndHonouredAcrossARestart) {
  auto e = election::create(config_for(2), member_of({1, 2, 3}, 4)).value();
  (void)e.step(election_tick{}, 0);
  auto vote = msg(election_message_type::vote, 1, 2, 5);
  vote.config = member_config{3, 4, 1, {}};
  auto out = e.step(election_receive{vote}, 10);
  ASSERT_NE(find(out, election_message_type::vote_resp), nullptr);
  EXPECT_TRUE(find(out, election_message_type::vote_resp)->granted);
  EXPECT_TRUE(out.persist);
  EXPECT_EQ(e.durable().voted_for, 1u);
  EXPECT_EQ(e.durable().term, 5u);

  // Crash and restart from what was persisted: a second candidate in term 5 is refused.
  auto again = election::create(config_for(2), e.durable()).value();
  (void)again.step(election_tick{}, 0);
  auto other = vote;
  other.from = 3;
  out = again.step(election_receive{other}, 10);
  ASSERT_NE(find(out, election_message_type::vote_resp), nullptr);
  EXPECT_FALSE(find(out, election_message_type::vote_resp)->granted);
}

TEST(Election, VoteRefusedToACandidateWithAnOlderConfig) {
  auto d = member_of({1, 2, 3}, 4);
  d.config.version = 9;
  auto e = election::create(config_for(2), d).value();
  (void)e.step(election_tick{}, 0);
  auto vote = msg(election_message_type::vote, 1, 2, 5);
  vote.config = member_config{8, 4, 1, {}};  // one version behind us
  auto out = e.step(election_receive{vote}, 10);
  ASSERT_NE(find(out, election_message_type::vote_resp), nullptr);
  EXPECT_FALSE(find(out, election_message_type::vote_resp)->granted);
  EXPECT_EQ(e.term(), 5u);  // the term is still learnt
}

TEST(Election, FreshLeaseIgnoresPreVotesAndVotes) {
  auto e = election::create(config_for(2), member_of({1, 2, 3}, 4)).value();
  (void)e.step(election_tick{}, 0);
  (void)e.step(election_receive{heartbeat(1, 2, 4, {1, 2, 3})}, 100);
  ASSERT_EQ(e.leader(), 1u);
  auto pre = msg(election_message_type::pre_vote, 3, 2, 5);
  pre.config = member_config{3, 4, 1, {}};
  auto out = e.step(election_receive{pre}, 150);
  ASSERT_NE(find(out, election_message_type::pre_vote_resp), nullptr);
  EXPECT_FALSE(find(out, election_message_type::pre_vote_resp)->granted);
  auto vote = msg(election_message_type::vote, 3, 2, 9);
  vote.config = member_config{3, 4, 1, {}};
  out = e.step(election_receive{vote}, 160);
  EXPECT_EQ(find(out, election_message_type::vote_resp), nullptr);  // ignored, no answer
  EXPECT_EQ(e.term(), 4u);                                          // and no term bump
  EXPECT_EQ(e.leader(), 1u);
  EXPECT_EQ(e.counters().votes_ignored_lease, 2u);
  // Once the lease has run out, the same pre-vote is granted (and still changes nothing here).
  out = e.step(election_receive{pre}, 100 + 300);
  ASSERT_NE(find(out, election_message_type::pre_vote_resp), nullptr);
  EXPECT_TRUE(find(out, election_message_type::pre_vote_resp)->granted);
  EXPECT_EQ(e.term(), 4u);
}

TEST(Election, NodeOutsideItsConfigNeverCampaigns) {
  auto e = election::create(config_for(5), member_of({1, 2, 3}, 4)).value();
  std::uint64_t now = 0;
  for (; now < 10'000; now += 50) {
    auto out = e.step(election_tick{}, now);
    EXPECT_EQ(find(out, election_message_type::pre_vote), nullptr);
  }
  EXPECT_EQ(e.term(), 4u);
  EXPECT_EQ(e.counters().pre_votes_started, 0u);
}

TEST(Election, BootstrapOnlyByTheLowestVisibleNeverConfiguredNode) {
  auto low = election::create(config_for(1)).value();
  auto high = election::create(config_for(2)).value();
  for (auto* e : {&low, &high}) {
    (void)e->step(election_tick{}, 0);
    (void)e->step(
        peer_status_changed{e == &low ? member_id{2} : member_id{1}, member_status::alive}, 0);
  }
  for (std::uint64_t now = 0; now <= 1000; now += 10) {
    (void)low.step(election_tick{}, now);
    (void)high.step(election_tick{}, now);
  }
  EXPECT_EQ(low.role(), election_role::leader);
  EXPECT_EQ(low.config().members, std::vector<member_id>{1});
  EXPECT_EQ(low.config().genesis, 1u);
  EXPECT_EQ(high.role(), election_role::follower);  // waits to be added
  EXPECT_EQ(high.config().version, 0u);
  // bootstrap_expect: a lone node that expects 3 never bootstraps.
  election_config c = config_for(1);
  c.bootstrap_expect = 3;
  auto lonely = election::create(c).value();
  for (std::uint64_t now = 0; now <= 5000; now += 10)
    (void)lonely.step(election_tick{}, now);
  EXPECT_EQ(lonely.role(), election_role::follower);
}

TEST(Election, LeaderStepsDownWithoutAQuorumWithinOneElectionTimeout) {
  durable_election_state d = member_of({1, 2, 3}, 4);
  auto e = election::create(config_for(1), d).value();
  std::uint64_t now = 0;
  (void)e.step(election_tick{}, now);
  while (e.role() != election_role::pre_candidate && now < 2000)
    (void)e.step(election_tick{}, now += 1);
  auto pre = msg(election_message_type::pre_vote_resp, 2, 1, 5);
  pre.granted = true;
  (void)e.step(election_receive{pre}, now += 1);
  ASSERT_EQ(e.role(), election_role::candidate);
  auto vote = msg(election_message_type::vote_resp, 2, 1, 5);
  vote.granted = true;
  (void)e.step(election_receive{vote}, now += 1);
  ASSERT_EQ(e.role(), election_role::leader);
  const std::uint64_t elected = now;
  // Nobody answers any heartbeat from now on.
  while (e.role() == election_role::leader && now < elected + 5000)
    (void)e.step(election_tick{}, now += 1);
  EXPECT_EQ(e.role(), election_role::follower);
  EXPECT_LE(now - elected, 2u * 300u);  // CheckQuorum: the vote counts as contact for one window
  EXPECT_EQ(e.counters().check_quorum_step_downs, 1u);
  EXPECT_EQ(e.term(), 5u);
}

}  // namespace
}  // namespace tessera::mesh
