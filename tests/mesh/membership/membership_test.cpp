// Membership (SWIM) state machine: bad input and bounds first, then join, suspect, refute, dead,
// leave, on a tiny in-test message pump (instant delivery, per-link cut, 1 ms time steps).
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "mesh/membership/membership.hpp"

namespace tessera::mesh {
namespace {

membership_config config_for(member_id id) {
  membership_config c;
  c.self = id;
  c.self_address = "addr-" + std::to_string(id);
  c.rng_seed = 99;
  return c;
}

// Delivers every message after one 1 ms step (plus the receiver's extra inbound delay, if set);
// links in `cut` and messages matching `drop_if` are dropped; a paused node is neither ticked nor
// handed messages, which wait for it (a process the host does not run).
class pump {
 public:
  explicit pump(std::vector<member_id> ids, membership_config base = {}) {
    for (member_id id : ids) {
      membership_config c = base;
      c.self = id;
      c.self_address = "addr-" + std::to_string(id);
      auto m = membership::create(c);
      EXPECT_TRUE(m.has_value());
      nodes_.emplace(id, std::move(m).value());
      timers_[id] = 0;
    }
  }

  membership& at(member_id id) { return nodes_.at(id); }

  void input(member_id id, const membership_input& in) { apply(id, nodes_.at(id).step(in, now_)); }

  void run_for(std::uint64_t ms) {
    for (std::uint64_t end = now_ + ms; now_ < end;) {
      ++now_;
      auto batch = std::move(in_flight_);
      in_flight_.clear();
      for (auto& [at, m] : batch) {
        if (cut_.contains({m.sender.id, m.to}) || down_.contains(m.to) || !nodes_.contains(m.to) ||
            (drop_if_ && drop_if_(m)))
          continue;
        if (at > now_ || paused_.contains(m.to)) {
          in_flight_.emplace_back(at, std::move(m));
          continue;
        }
        input(m.to, membership_receive{m});
      }
      for (auto& [id, t] : timers_)
        if (!down_.contains(id) && !paused_.contains(id) && t != 0 && now_ >= t)
          input(id, membership_tick{});
    }
  }

  void cut(member_id a, member_id b) {
    cut_.insert({a, b});
    cut_.insert({b, a});
  }
  void heal() { cut_.clear(); }
  void kill(member_id id) { down_.insert(id); }
  void pause(member_id id) { paused_.insert(id); }
  /// The host runs `id` again: its timer fires first (the worst order for it), then the
  /// messages that waited are delivered.
  void resume(member_id id) {
    paused_.erase(id);
    input(id, membership_tick{});
  }
  void inbound_delay(member_id id, std::uint64_t ms) { delay_[id] = ms; }
  /// Messages of `type` that `id` has sent so far.
  std::uint64_t sent(member_id id, membership_message_type type) const {
    auto it = sent_.find({id, static_cast<std::uint8_t>(type)});
    return it == sent_.end() ? 0 : it->second;
  }
  void drop_if(std::function<bool(const membership_message&)> f) { drop_if_ = std::move(f); }
  /// When each event of `id` was published.
  std::vector<std::uint64_t> event_times_of(member_id id) const {
    auto it = event_times_.find(id);
    return it == event_times_.end() ? std::vector<std::uint64_t>{} : it->second;
  }

  std::vector<member_event> events_of(member_id id) const {
    auto it = events_.find(id);
    return it == events_.end() ? std::vector<member_event>{} : it->second;
  }
  std::uint64_t now() const { return now_; }

 private:
  void apply(member_id id, membership_output out) {
    for (auto& m : out.messages) {
      ++sent_[{id, m.type}];
      auto d = delay_.find(m.to);
      const std::uint64_t at = now_ + 1 + (d == delay_.end() ? 0 : d->second);
      in_flight_.emplace_back(at, std::move(m));
    }
    for (auto& e : out.events) {
      events_[id].push_back(e);
      event_times_[id].push_back(now_);
    }
    timers_[id] = out.timer_at_ms.value_or(0);
  }

  std::map<member_id, membership> nodes_;
  std::map<member_id, std::uint64_t> timers_;
  std::map<member_id, std::vector<member_event>> events_;
  std::map<member_id, std::vector<std::uint64_t>> event_times_;
  std::vector<std::pair<std::uint64_t, membership_message>> in_flight_;  // (deliver at, message)
  std::set<std::pair<member_id, member_id>> cut_;
  std::set<member_id> down_;
  std::set<member_id> paused_;
  std::map<member_id, std::uint64_t> delay_;
  std::function<bool(const membership_message&)> drop_if_;
  std::map<std::pair<member_id, std::uint8_t>, std::uint64_t> sent_;
  std::uint64_t now_ = 1;
};

void join_all(pump& p, const std::vector<member_id>& ids) {
  for (member_id id : ids)
    p.input(id, membership_join{{member_update{1, 0, 0, "addr-1"}}});
}

std::vector<member_status> statuses_of(const std::vector<member_event>& evs, member_id about) {
  std::vector<member_status> out;
  for (const auto& e : evs)
    if (e.id == about) out.push_back(e.status);
  return out;
}

// ---- bad input and bounds ------------------------------------------------------------------

TEST(MembershipConfig, RejectsUnusableValuesNamingTheField) {
  membership_config c = config_for(1);
  c.self = no_member;
  auto r = membership::create(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  EXPECT_NE(r.error().message.find("self"), std::string::npos);

  c = config_for(1);
  c.probe_timeout_ms = c.probe_interval_ms;
  r = membership::create(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("probe_timeout_ms"), std::string::npos);

  c = config_for(1);
  c.self_address = std::string(300, 'x');
  r = membership::create(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("self_address"), std::string::npos);
}

TEST(Membership, MalformedMessagesAreCountedAndIgnored) {
  auto m = membership::create(config_for(1)).value();
  membership_message bad;
  bad.type = 99;  // unknown type
  bad.sender = member_update{2, 0, 0, "a"};
  bad.to = 1;
  auto out = m.step(membership_receive{bad}, 10);
  EXPECT_TRUE(out.messages.empty());
  EXPECT_EQ(m.counters().malformed, 1u);

  membership_message wrong_to;
  wrong_to.type = static_cast<std::uint8_t>(membership_message_type::ping);
  wrong_to.sender = member_update{2, 0, 0, "a"};
  wrong_to.to = 3;  // not us
  out = m.step(membership_receive{wrong_to}, 11);
  EXPECT_TRUE(out.messages.empty());
  EXPECT_EQ(m.counters().malformed, 2u);

  membership_message too_much = wrong_to;
  too_much.to = 1;
  too_much.updates.assign(9, member_update{5, 0, 0, ""});  // above max_updates_per_message = 8
  out = m.step(membership_receive{too_much}, 12);
  EXPECT_EQ(m.counters().malformed, 3u);
  EXPECT_FALSE(m.status_of(5).has_value());

  membership_message bad_update = too_much;
  bad_update.updates = {member_update{6, 0, 17, ""}};  // status 17 does not exist
  out = m.step(membership_receive{bad_update}, 13);
  EXPECT_EQ(m.counters().malformed, 4u);
  EXPECT_FALSE(m.status_of(6).has_value());
  EXPECT_EQ(m.status_of(2), member_status::alive);  // the sender itself was valid
}

TEST(Membership, MemberTableBoundRefusesNewLiveMembersButEvictsTombstones) {
  membership_config c = config_for(1);
  c.max_members = 3;
  auto m = membership::create(c).value();
  auto ping_from = [&](member_id id, std::uint64_t now, std::vector<member_update> ups = {}) {
    membership_message p;
    p.type = static_cast<std::uint8_t>(membership_message_type::ping);
    p.sender = member_update{id, 0, 0, "a"};
    p.to = 1;
    p.updates = std::move(ups);
    return m.step(membership_receive{p}, now);
  };
  (void)ping_from(2, 10);
  (void)ping_from(3, 11);
  (void)ping_from(4, 12, {member_update{5, 0, static_cast<std::uint8_t>(member_status::dead), ""}});
  EXPECT_EQ(m.members().size(), 3u);  // 2, 3, 4; 5 did not fit
  EXPECT_EQ(m.counters().members_refused, 1u);
  // A tombstone is evicted to make room; a live member never is.
  (void)ping_from(2, 13, {member_update{3, 0, static_cast<std::uint8_t>(member_status::left), ""}});
  (void)ping_from(6, 14);
  EXPECT_EQ(m.status_of(6), member_status::alive);
  EXPECT_FALSE(m.status_of(3).has_value());
  (void)ping_from(7, 15);
  EXPECT_FALSE(m.status_of(7).has_value());
  EXPECT_EQ(m.counters().members_refused, 2u);
}

TEST(Membership, PiggybackBoundEvictsTheMostSentEntry) {
  membership_config c = config_for(1);
  c.max_piggyback = 2;
  auto m = membership::create(c).value();
  for (member_id id = 2; id <= 5; ++id) {
    membership_message p;
    p.type = static_cast<std::uint8_t>(membership_message_type::ping);
    p.sender = member_update{id, 0, 0, "a"};
    p.to = 1;
    (void)m.step(membership_receive{p}, 10 + id);
  }
  EXPECT_EQ(m.counters().piggyback_evicted, 2u);  // 4 new members, room for 2 pieces of gossip
}

TEST(Membership, RelayBoundRefusesPingReqs) {
  membership_config c = config_for(1);
  c.max_relays = 1;
  auto m = membership::create(c).value();
  for (member_id target : {7, 8}) {
    membership_message r;
    r.type = static_cast<std::uint8_t>(membership_message_type::ping_req);
    r.sender = member_update{2, 0, 0, "a"};
    r.to = 1;
    r.seq = 5;
    r.target = target;
    (void)m.step(membership_receive{r}, 10);
  }
  EXPECT_EQ(m.counters().relays_refused, 1u);
}

TEST(Membership, MessagesRoundTripThroughMsgpack) {
  membership_message m;
  m.type = static_cast<std::uint8_t>(membership_message_type::ack);
  m.sender = member_update{3, 9, 0, "tcp://10.0.0.3:7000"};
  m.to = 4;
  m.seq = 77;
  m.target = 5;
  m.updates = {member_update{5, 2, 1, "x"}};
  msgpack::sbuffer buf;
  msgpack::pack(buf, m);
  auto back = msgpack::unpack(buf.data(), buf.size()).get().as<membership_message>();
  EXPECT_EQ(back.sender.address, m.sender.address);
  EXPECT_EQ(back.seq, 77u);
  ASSERT_EQ(back.updates.size(), 1u);
  EXPECT_EQ(back.updates[0].incarnation, 2u);
}

// An update without the accuser (origin) field, as encoded before Lifeguard, still decodes.
TEST(Membership, UpdatesWithoutAnAccuserStillDecode) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(4);
  pk.pack(std::uint64_t{5});
  pk.pack(std::uint64_t{2});
  pk.pack(std::uint8_t{1});
  pk.pack(std::string("x"));
  auto back = msgpack::unpack(buf.data(), buf.size()).get().as<member_update>();
  EXPECT_EQ(back.id, 5u);
  EXPECT_EQ(back.status, 1u);
  EXPECT_EQ(back.origin, no_member);
}

// ---- protocol ------------------------------------------------------------------------------

TEST(Membership, JoinThroughASeedSpreadsToEveryone) {
  pump p({1, 2, 3, 4});
  join_all(p, {2, 3, 4});
  p.run_for(2000);
  for (member_id a : {1, 2, 3, 4})
    for (member_id b : {1, 2, 3, 4})
      EXPECT_EQ(p.at(a).status_of(b), member_status::alive) << a << " sees " << b;
  EXPECT_EQ(statuses_of(p.events_of(2), 3), std::vector<member_status>{member_status::alive});
  EXPECT_EQ(p.at(2).members().at(3).address, "addr-3");
}

TEST(Membership, CrashedMemberBecomesSuspectThenDead) {
  pump p({1, 2, 3, 4});
  join_all(p, {2, 3, 4});
  p.run_for(1000);
  p.kill(4);
  p.run_for(3000);
  for (member_id a : {1, 2, 3}) {
    EXPECT_EQ(p.at(a).status_of(4), member_status::dead) << a;
    auto seen = statuses_of(p.events_of(a), 4);
    // alive, then (suspect if this node suspected or heard of it first), then dead.
    ASSERT_GE(seen.size(), 2u);
    EXPECT_EQ(seen.front(), member_status::alive);
    EXPECT_EQ(seen.back(), member_status::dead);
  }
}

TEST(Membership, SuspectedMemberRefutesWithAHigherIncarnation) {
  pump p({1, 2, 3});
  join_all(p, {2, 3});
  p.run_for(1000);
  // 1 cannot reach 3 and nobody relays for it long enough to matter: cut 1-3 and 2-3 briefly,
  // so 3 is suspected; heal before the suspicion times out.
  p.cut(1, 3);
  p.cut(2, 3);
  std::uint64_t start = p.now();
  while (p.at(1).status_of(3) != member_status::suspect && p.now() < start + 2000)
    p.run_for(1);
  ASSERT_EQ(p.at(1).status_of(3), member_status::suspect);
  p.heal();
  p.run_for(1000);
  EXPECT_EQ(p.at(1).status_of(3), member_status::alive);
  EXPECT_EQ(p.at(2).status_of(3), member_status::alive);
  EXPECT_GE(p.at(3).incarnation(), 1u);
  EXPECT_GE(p.at(3).counters().refutations, 1u);
  auto seen = statuses_of(p.events_of(1), 3);
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(seen[seen.size() - 2], member_status::suspect);
  EXPECT_EQ(seen.back(), member_status::alive);
}

TEST(Membership, ARecordPlacingUsElsewhereIsRefutedAndEveryPeerConverges) {
  pump p({1, 2, 3});
  join_all(p, {2, 3});
  p.run_for(1000);
  ASSERT_EQ(p.at(2).members().at(1).address, "addr-1");
  // A copy of node 1 (same id, later start, so a higher incarnation) announces itself to 2 from
  // another address, then is gone.
  membership_message from_copy;
  from_copy.type = static_cast<std::uint8_t>(membership_message_type::ping);
  from_copy.sender = member_update{1, 1'000'000, 0, "addr-copy"};
  from_copy.to = 2;
  p.input(2, membership_receive{from_copy});
  ASSERT_EQ(p.at(2).members().at(1).address, "addr-copy");
  p.run_for(3000);
  // 1 heard the record that placed it elsewhere and refuted above it; everyone has it back.
  EXPECT_GT(p.at(1).incarnation(), 1'000'000u);
  EXPECT_EQ(p.at(2).members().at(1).address, "addr-1");
  EXPECT_EQ(p.at(3).members().at(1).address, "addr-1");
  EXPECT_EQ(p.at(2).status_of(1), member_status::alive);
}

TEST(Membership, IndirectProbeKeepsAMemberAliveAcrossOneBrokenLink) {
  pump p({1, 2, 3, 4});
  join_all(p, {2, 3, 4});
  p.run_for(1000);
  p.cut(1, 4);  // 1 cannot reach 4 directly, but 2 and 3 relay
  p.run_for(3000);
  EXPECT_EQ(p.at(1).status_of(4), member_status::alive);
  EXPECT_EQ(p.at(1).counters().suspicions, 0u);
}

TEST(Membership, DeadMembersMeetAgainAfterAPartitionHeals) {
  pump p({1, 2, 3, 4});
  join_all(p, {2, 3, 4});
  p.run_for(1000);
  for (member_id a : {1, 2})
    for (member_id b : {3, 4})
      p.cut(a, b);
  p.run_for(3000);
  EXPECT_EQ(p.at(1).status_of(3), member_status::dead);
  EXPECT_EQ(p.at(3).status_of(1), member_status::dead);
  p.heal();
  p.run_for(4000);  // reconnect_interval_ms brings them back; refutation makes it stick
  for (member_id a : {1, 2, 3, 4})
    for (member_id b : {1, 2, 3, 4})
      EXPECT_EQ(p.at(a).status_of(b), member_status::alive) << a << " sees " << b;
}

TEST(Membership, GracefulLeaveIsKnownAtOnce) {
  pump p({1, 2, 3});
  join_all(p, {2, 3});
  p.run_for(1000);
  p.input(3, membership_leave{});
  p.run_for(2);  // one delivery step: no timeout involved
  EXPECT_EQ(p.at(1).status_of(3), member_status::left);
  EXPECT_EQ(p.at(2).status_of(3), member_status::left);
  EXPECT_EQ(statuses_of(p.events_of(1), 3).back(), member_status::left);
  p.run_for(2000);
  EXPECT_EQ(p.at(1).status_of(3), member_status::left);  // stays left, not dead
}

TEST(Membership, RestartedMemberRejoinsPastItsTombstone) {
  pump p({1, 2, 3});
  join_all(p, {2, 3});
  p.run_for(1000);
  p.input(3, membership_leave{});
  p.run_for(100);
  ASSERT_EQ(p.at(1).status_of(3), member_status::left);
  // 3 comes back at a higher incarnation (what a restarted node reaches after refuting).
  membership_message ping;
  ping.type = static_cast<std::uint8_t>(membership_message_type::ping);
  ping.sender = member_update{3, 1, 0, "addr-3"};
  ping.to = 1;
  p.input(1, membership_receive{ping});
  EXPECT_EQ(p.at(1).status_of(3), member_status::alive);
  // Elsewhere: a stale alive at the old incarnation does not resurrect a tombstone.
  membership_message stale = ping;
  stale.sender = member_update{2, 0, 0, "addr-2"};
  stale.updates = {member_update{3, 4, 0, "addr-3"}};
  auto m = membership::create(config_for(9)).value();
  membership_message tomb = ping;
  tomb.to = 9;
  tomb.sender = member_update{2, 0, 0, "a"};
  tomb.updates = {member_update{3, 4, static_cast<std::uint8_t>(member_status::dead), ""}};
  (void)m.step(membership_receive{tomb}, 5);
  stale.to = 9;
  (void)m.step(membership_receive{stale}, 6);
  EXPECT_EQ(m.status_of(3), member_status::dead);
}

// ---- Lifeguard -------------------------------------------------------------------------------

std::size_t count_status(const std::vector<member_event>& evs, member_status s) {
  return static_cast<std::size_t>(
      std::count_if(evs.begin(), evs.end(), [&](const auto& e) { return e.status == s; }));
}

// Four members joined through 1 and settled for a second, with `base` for every one of them.
pump settled_four(const membership_config& base) {
  pump p({1, 2, 3, 4}, base);
  join_all(p, {2, 3, 4});
  p.run_for(1000);
  return p;
}

// A node the host did not run for 1.5 s (CPU starvation, SIGSTOP) wakes with every deadline
// past and the acks it could not read still queued. It must not take its own absence for its
// peers' silence: no suspicion of anyone, the stall counted, its health lowered.
TEST(Lifeguard, ANodeRunLateDoesNotAccuseThePeersItCouldNotHear) {
  auto run = [](std::uint32_t stall_threshold_ms) {
    membership_config base;
    base.stall_threshold_ms = stall_threshold_ms;
    pump p({1, 2, 3}, base);
    join_all(p, {2, 3});
    p.run_for(1000);
    const auto before = p.events_of(1).size();
    // Stopped just after it sent a probe: the ack will wait, unread, with its deadlines.
    const auto pings = p.sent(1, membership_message_type::ping);
    while (p.sent(1, membership_message_type::ping) == pings)
      p.run_for(1);
    p.pause(1);
    p.run_for(1500);
    p.resume(1);
    p.run_for(1000);
    const auto evs = p.events_of(1);
    const std::vector<member_event> since(evs.begin() + static_cast<std::ptrdiff_t>(before),
                                          evs.end());
    // Its peers saw it silent for 1.5 s, a real absence: they may have declared it dead; it
    // refuted and is alive again everywhere.
    EXPECT_EQ(p.at(2).status_of(1), member_status::alive);
    EXPECT_EQ(p.at(3).status_of(1), member_status::alive);
    return std::tuple{
        count_status(since, member_status::suspect) + count_status(since, member_status::dead),
        p.at(1).counters().stalls, p.at(1).status_of(2), p.at(1).status_of(3)};
  };
  const auto [accusations, stalls, of2, of3] = run(50);
  EXPECT_EQ(accusations, 0u);
  EXPECT_GE(stalls, 1u);
  EXPECT_EQ(of2, member_status::alive);
  EXPECT_EQ(of3, member_status::alive);
  // The same without stall awareness: it accuses a peer on waking.
  const auto [blind_accusations, blind_stalls, b2, b3] = run(1'000'000);
  EXPECT_GE(blind_accusations, 1u);
  EXPECT_EQ(blind_stalls, 0u);
}

// Node 1 cannot reach node 4 and its ping_reqs are lost, so only node 1 suspects 4, round after
// round; 2 and 3 reach 4 fine. Unconfirmed, the suspicion lasts suspicion_max_mult times the
// minimum, which leaves 4 the time to hear it (through 2 and 3) and refute: never declared dead.
TEST(Lifeguard, ASuspicionNobodyConfirmsGivesTheSuspectTimeToRefute) {
  auto run = [](std::uint32_t suspicion_max_mult) {
    membership_config base;
    base.suspicion_max_mult = suspicion_max_mult;
    pump p = settled_four(base);
    p.cut(1, 4);
    p.drop_if([](const membership_message& m) {
      return m.sender.id == 1 &&
             m.type == static_cast<std::uint8_t>(membership_message_type::ping_req);
    });
    p.run_for(20'000);
    EXPECT_GE(p.at(1).counters().suspicions, 3u);  // the scenario happened, repeatedly
    EXPECT_GE(p.at(4).counters().refutations, 3u);
    std::ptrdiff_t deaths = 0;
    for (member_id a : {1, 2, 3}) {
      const auto seen = statuses_of(p.events_of(a), 4);
      deaths += std::count(seen.begin(), seen.end(), member_status::dead);
    }
    return deaths;
  };
  EXPECT_EQ(run(4), 0) << "a live member was declared dead";
  // With a fixed suspicion timeout the refutation loses the race now and then.
  EXPECT_GT(run(1), 0);
}

// A crash is seen by everyone: the survivors' suspicions confirm each other, and each declares
// the crashed member dead sooner than an unconfirmed suspicion would last.
TEST(Lifeguard, ACrashIsConfirmedAndDeclaredDeadSoonerThanAnUnconfirmedSuspicion) {
  membership_config base;
  pump p = settled_four(base);
  p.kill(4);
  p.run_for(4000);
  std::uint64_t confirmations = 0;
  for (member_id a : {1, 2, 3}) {
    ASSERT_EQ(p.at(a).status_of(4), member_status::dead) << a;
    const auto evs = p.events_of(a);
    const auto at = p.event_times_of(a);
    std::uint64_t suspected = 0, dead = 0;
    for (std::size_t i = 0; i < evs.size(); ++i) {
      if (evs[i].id != 4) continue;
      if (evs[i].status == member_status::suspect && suspected == 0) suspected = at[i];
      if (evs[i].status == member_status::dead) dead = at[i];
    }
    ASSERT_GT(suspected, 0u) << a;
    EXPECT_LT(dead - suspected, std::uint64_t{base.suspicion_timeout_ms} * base.suspicion_max_mult)
        << a << " waited out an unconfirmed suspicion";
    confirmations += p.at(a).counters().confirmations;
  }
  EXPECT_GE(confirmations, 2u);
  // The helpers nacked for the dead target, so the probers did not blame themselves.
  for (member_id a : {1, 2, 3})
    EXPECT_EQ(p.at(a).health(), 0u) << a;
  EXPECT_GT(
      p.at(1).counters().nacks_sent + p.at(2).counters().nacks_sent + p.at(3).counters().nacks_sent,
      0u);
}

// Node 1 reads every message 120 ms late (a starved receive path): no ack, direct or relayed,
// reaches it within its 100 ms probe round. Missed nacks raise its health, which stretches its
// rounds past the delay; it stops suspecting healthy peers, while a node with health pinned at 0
// keeps suspecting them.
TEST(Lifeguard, ASlowNodeStretchesItsProbesInsteadOfAccusingItsPeers) {
  auto run = [](std::uint32_t max_health) {
    membership_config base;
    base.max_health = max_health;
    pump p = settled_four(base);
    p.inbound_delay(1, 120);
    p.run_for(5000);  // adapt
    const auto settled = p.at(1).counters().suspicions;
    p.run_for(10'000);
    return std::pair{p.at(1).counters().suspicions - settled, p.at(1).health()};
  };
  const auto [fixed_suspicions, fixed_health] = run(0);
  const auto [aware_suspicions, aware_health] = run(8);
  EXPECT_EQ(fixed_health, 0u);
  EXPECT_GT(fixed_suspicions, 10u) << "the slow node should keep accusing without Lifeguard";
  EXPECT_GE(aware_health, 1u);
  EXPECT_EQ(aware_suspicions, 0u);
}

TEST(Membership, IsDeterministicForTheSameSeed) {
  auto run = [] {
    pump p({1, 2, 3, 4, 5});
    join_all(p, {2, 3, 4, 5});
    p.run_for(500);
    p.kill(5);
    p.run_for(1500);
    return p.events_of(1);
  };
  EXPECT_EQ(run(), run());
}

}  // namespace
}  // namespace tessera::mesh
