#include "mesh/election/election.hpp"

#include <algorithm>
#include <tuple>

namespace tessera::mesh {

namespace {
using etype = election_message_type;

election_event config_event(const member_config& c, bool committed) {
  election_event e;
  e.kind = election_event_kind::config_changed;
  e.term = c.term;
  e.config = c;
  e.committed = committed;
  return e;
}

member_config header_of(const member_config& c) {
  return member_config{c.version, c.term, c.genesis, {}};
}
}  // namespace

const char* to_string(election_role role) noexcept {
  switch (role) {
    case election_role::follower:
      return "follower";
    case election_role::pre_candidate:
      return "pre_candidate";
    case election_role::candidate:
      return "candidate";
    case election_role::leader:
      return "leader";
  }
  return "unknown";
}

bool member_config::contains(member_id id) const {
  return std::binary_search(members.begin(), members.end(), id);
}

result<void> election_config::validate() const {
  if (self == no_member) return make_error(errc::invalid_argument, "election: self id is 0");
  if (heartbeat_interval_ms == 0)
    return make_error(errc::invalid_argument, "election: heartbeat_interval_ms is 0");
  if (election_timeout_ms < 2 * heartbeat_interval_ms)
    return make_error(errc::invalid_argument,
                      "election: election_timeout_ms {} must be at least twice "
                      "heartbeat_interval_ms {}",
                      election_timeout_ms, heartbeat_interval_ms);
  if (max_members < 1) return make_error(errc::invalid_argument, "election: max_members is 0");
  if (bootstrap_expect < 1)
    return make_error(errc::invalid_argument, "election: bootstrap_expect is 0");
  return ok();
}

result<election> election::create(const election_config& cfg,
                                  const durable_election_state& restored) {
  TESSERA_TRY(cfg.validate());
  const auto& m = restored.config.members;
  if (m.size() > cfg.max_members || !std::is_sorted(m.begin(), m.end()) ||
      std::adjacent_find(m.begin(), m.end()) != m.end() ||
      std::find(m.begin(), m.end(), no_member) != m.end() || restored.config.term > restored.term ||
      (restored.config.version == 0) != m.empty())
    return make_error(errc::corrupt,
                      "election: restored state is inconsistent (term {}, config v{} t{} with {} "
                      "members, max {})",
                      restored.term, restored.config.version, restored.config.term, m.size(),
                      cfg.max_members);
  return election(cfg, restored);
}

election::election(const election_config& cfg, const durable_election_state& restored)
    : cfg_(cfg), rng_(cfg.rng_seed ^ (cfg.self * 0xd1b54a32d192ed03ULL)), d_(restored) {}

election_output election::step(const election_input& input, std::uint64_t now_ms) {
  election_output out;
  if (!started_) {
    started_ = true;
    boot_ms_ = now_ms;
    reset_election_deadline(now_ms);
  }
  std::visit(
      [&](const auto& in) {
        using T = std::decay_t<decltype(in)>;
        if constexpr (std::is_same_v<T, election_tick>) on_tick(now_ms, out);
        if constexpr (std::is_same_v<T, election_receive>) on_receive(in.message, now_ms, out);
        if constexpr (std::is_same_v<T, peer_status_changed>) on_peer(in, now_ms, out);
        if constexpr (std::is_same_v<T, election_leave>) on_leave(now_ms, out);
      },
      input);
  if (!std::holds_alternative<election_tick>(input)) on_tick(now_ms, out);
  out.timer_at_ms = next_timer();
  return out;
}

// ---- timers ----------------------------------------------------------------------------------

void election::on_tick(std::uint64_t now_ms, election_output& out) {
  if (role_ == election_role::leader) {
    if (now_ms >= check_quorum_ms_) check_quorum(now_ms, out);
    if (role_ == election_role::leader && now_ms >= next_heartbeat_ms_) {
      change_config(now_ms, out);
      send_heartbeats(now_ms, out);
      next_heartbeat_ms_ = now_ms + cfg_.heartbeat_interval_ms;
    }
    return;
  }
  if (now_ms < election_deadline_ms_) return;
  if (d_.config.version == 0) {
    maybe_bootstrap(now_ms, out);
    if (role_ != election_role::leader)
      election_deadline_ms_ = now_ms + cfg_.heartbeat_interval_ms;  // poll for bootstrap
    return;
  }
  if (leader_ != no_member && !lease_fresh(now_ms)) set_leader(no_member, out);
  if (may_campaign()) {
    start_pre_vote(now_ms, out);
  } else {
    reset_election_deadline(now_ms);
  }
}

std::optional<std::uint64_t> election::next_timer() const {
  if (role_ == election_role::leader) return std::min(next_heartbeat_ms_, check_quorum_ms_);
  if (leaving_) return std::nullopt;
  return election_deadline_ms_;
}

void election::reset_election_deadline(std::uint64_t now_ms) {
  election_deadline_ms_ =
      now_ms + rng_.uniform(cfg_.election_timeout_ms, 2ULL * cfg_.election_timeout_ms);
}

bool election::lease_fresh(std::uint64_t now_ms) const {
  if (role_ == election_role::leader) return true;
  // One heartbeat shorter than the shortest election timeout: a follower still hearing the
  // leader renews it every heartbeat, while a follower whose timer fired (>= election_timeout
  // after its own last heartbeat) finds its peers' leases expired even if their last heartbeat
  // arrived a few ms later than its own (without the margin, that race costs a whole extra
  // randomized timeout).
  const std::uint64_t lease_ms = cfg_.election_timeout_ms - cfg_.heartbeat_interval_ms;
  return leader_ != no_member && now_ms < last_leader_contact_ms_ + lease_ms;
}

bool election::quorum_fresh(std::uint64_t now_ms) const {
  std::size_t heard = 0;
  for (member_id id : d_.config.members) {
    if (id == cfg_.self) {
      ++heard;
      continue;
    }
    auto it = acks_.find(id);
    if (it != acks_.end() && now_ms < it->second.last_ack_ms + cfg_.election_timeout_ms) ++heard;
  }
  return heard >= d_.config.majority();
}

bool election::up_to_date(const member_config& c) const {
  if (d_.config.version == 0) return true;
  if (c.genesis != d_.config.genesis) return false;
  return std::tie(c.term, c.version) >= std::tie(d_.config.term, d_.config.version);
}

bool election::may_campaign() const {
  return !leaving_ && d_.config.contains(cfg_.self);
}

// ---- role transitions --------------------------------------------------------------------------

void election::maybe_bootstrap(std::uint64_t now_ms, election_output& out) {
  // Only a node that has never been part of a cluster, has heard of none, and is the lowest id
  // it can see creates one; everyone else waits to be added by a leader (design doc, "Cold start").
  if (leaving_ || d_.term != 0 || heard_cluster_ || now_ms < boot_ms_ + cfg_.bootstrap_wait_ms)
    return;
  // Suspect counts as present: on a slow network a lower id may be suspected for a moment, and
  // bootstrapping past it would split the cluster into two lineages.
  std::size_t alive = 1;
  for (const auto& [id, p] : peers_) {
    if (p.status != member_status::alive && p.status != member_status::suspect) continue;
    if (id < cfg_.self) return;
    ++alive;
  }
  if (alive < cfg_.bootstrap_expect) return;
  d_.term = 1;
  d_.voted_for = cfg_.self;
  d_.config = member_config{1, 1, cfg_.self, {cfg_.self}};
  out.persist = true;
  out.events.push_back(config_event(d_.config, false));
  become_leader(now_ms, out);
}

void election::start_pre_vote(std::uint64_t now_ms, election_output& out) {
  ++counters_.pre_votes_started;
  set_role(election_role::pre_candidate, out);
  set_leader(no_member, out);
  votes_ = {cfg_.self};
  reset_election_deadline(now_ms);
  for (member_id id : d_.config.members) {
    if (id == cfg_.self) continue;
    election_message m = make(etype::pre_vote, id);
    m.term = d_.term + 1;  // the term we would campaign in; ours does not change yet
    m.config = header_of(d_.config);
    out.messages.push_back(std::move(m));
  }
  if (votes_.size() >= d_.config.majority()) start_election(now_ms, false, out);
}

void election::start_election(std::uint64_t now_ms, bool force, election_output& out) {
  ++counters_.elections_started;
  d_.term += 1;
  d_.voted_for = cfg_.self;
  out.persist = true;
  set_role(election_role::candidate, out);
  set_leader(no_member, out);
  votes_ = {cfg_.self};
  reset_election_deadline(now_ms);
  for (member_id id : d_.config.members) {
    if (id == cfg_.self) continue;
    election_message m = make(etype::vote, id);
    m.force = force;
    m.config = header_of(d_.config);
    out.messages.push_back(std::move(m));
  }
  if (votes_.size() >= d_.config.majority()) become_leader(now_ms, out);
}

void election::become_follower(std::uint64_t term, member_id leader, std::uint64_t now_ms,
                               election_output& out) {
  if (term > d_.term) {
    d_.term = term;
    d_.voted_for = no_member;
    out.persist = true;
  }
  set_role(election_role::follower, out);
  set_leader(leader, out);
  votes_.clear();
  acks_.clear();
  if (leader != no_member) last_leader_contact_ms_ = now_ms;
  reset_election_deadline(now_ms);
}

void election::become_leader(std::uint64_t now_ms, election_output& out) {
  TESSERA_ASSERT(d_.voted_for == cfg_.self, "leader of term {} did not vote for itself", d_.term);
  set_role(election_role::leader, out);
  set_leader(cfg_.self, out);
  acks_.clear();
  // A granted vote is a sign of life for CheckQuorum; it acks no config version yet.
  for (member_id v : votes_)
    if (v != cfg_.self) acks_[v] = ack_state{now_ms, 0, 0};
  votes_.clear();
  check_quorum_ms_ = now_ms + cfg_.election_timeout_ms;
  change_config(now_ms, out);
  send_heartbeats(now_ms, out);
  next_heartbeat_ms_ = now_ms + cfg_.heartbeat_interval_ms;
  maybe_commit(out);
}

void election::check_quorum(std::uint64_t now_ms, election_output& out) {
  if (quorum_fresh(now_ms)) {
    check_quorum_ms_ = now_ms + cfg_.election_timeout_ms;
    return;
  }
  ++counters_.check_quorum_step_downs;
  become_follower(d_.term, no_member, now_ms, out);
}

void election::set_leader(member_id leader, election_output& out) {
  if (leader == leader_) return;
  leader_ = leader;
  election_event e;
  e.kind = election_event_kind::leader_changed;
  e.term = d_.term;
  e.leader = leader;
  out.events.push_back(std::move(e));
}

void election::set_role(election_role role, election_output& out) {
  if (role == role_) return;
  role_ = role;
  election_event e;
  e.kind = election_event_kind::role_changed;
  e.term = d_.term;
  e.role = role;
  out.events.push_back(std::move(e));
}

// ---- inputs ----------------------------------------------------------------------------------

void election::on_peer(const peer_status_changed& p, std::uint64_t now_ms, election_output& out) {
  if (p.id == cfg_.self || p.id == no_member) return;
  auto it = peers_.find(p.id);
  if (it == peers_.end()) {
    if (peers_.size() >= 4 * cfg_.max_members) {
      // Full: forget the longest-gone peer that is neither live nor a member (a long-running
      // cluster sees many nodes come and go); refuse only if every entry still matters.
      auto victim = peers_.end();
      for (auto v = peers_.begin(); v != peers_.end(); ++v) {
        const bool gone =
            v->second.status == member_status::dead || v->second.status == member_status::left;
        if (gone && !d_.config.contains(v->first) &&
            (victim == peers_.end() || v->second.since_ms < victim->second.since_ms))
          victim = v;
      }
      if (victim == peers_.end()) {
        ++counters_.members_refused;
        return;
      }
      peers_.erase(victim);
    }
    it = peers_.emplace(p.id, peer_state{p.status, now_ms}).first;
  } else if (it->second.status != p.status) {
    it->second = peer_state{p.status, now_ms};
  }
  // Our leader left (or was found dead): its lease ends now, so an election starts soon instead
  // of one election timeout later. Peers hear the same news and stop defending the lease.
  if (role_ != election_role::leader && p.id == leader_ &&
      (p.status == member_status::left || p.status == member_status::dead)) {
    set_leader(no_member, out);
    election_deadline_ms_ =
        now_ms + rng_.uniform(cfg_.heartbeat_interval_ms, 4ULL * cfg_.heartbeat_interval_ms);
  }
}

void election::on_leave(std::uint64_t now_ms, election_output& out) {
  if (leaving_) return;
  leaving_ = true;
  if (role_ != election_role::follower || leader_ == cfg_.self)
    become_follower(d_.term, no_member, now_ms, out);
}

void election::on_receive(const election_message& m, std::uint64_t now_ms, election_output& out) {
  const bool type_ok = m.type >= static_cast<std::uint8_t>(etype::pre_vote) &&
                       m.type <= static_cast<std::uint8_t>(etype::heartbeat_resp);
  if (!type_ok || m.to != cfg_.self || m.from == no_member || m.from == cfg_.self ||
      m.config.members.size() > cfg_.max_members) {
    ++counters_.malformed;
    return;
  }
  if (m.term > 0) heard_cluster_ = true;
  switch (static_cast<etype>(m.type)) {
    case etype::pre_vote:
      on_pre_vote(m, now_ms, out);
      break;
    case etype::vote:
      on_vote(m, now_ms, out);
      break;
    case etype::heartbeat:
      on_heartbeat(m, now_ms, out);
      break;
    case etype::heartbeat_resp:
      on_heartbeat_resp(m, now_ms, out);
      break;
    case etype::pre_vote_resp:
    case etype::vote_resp:
      on_vote_resp(m, now_ms, out);
      break;
  }
}

void election::on_pre_vote(const election_message& m, std::uint64_t now_ms, election_output& out) {
  // PreVote changes nothing here: a node cut off from the cluster can ask forever without ever
  // raising anyone's term. A fresh lease means we still hear a leader: refuse.
  const bool lease = lease_fresh(now_ms);
  if (lease) ++counters_.votes_ignored_lease;
  const bool grant = !lease && m.term > d_.term && up_to_date(m.config);
  election_message r = make(etype::pre_vote_resp, m.from);
  r.granted = grant;
  r.term = grant ? m.term : d_.term;
  out.messages.push_back(std::move(r));
}

void election::on_vote(const election_message& m, std::uint64_t now_ms, election_output& out) {
  if (m.term < d_.term) {
    election_message r = make(etype::vote_resp, m.from);
    out.messages.push_back(std::move(r));
    return;
  }
  // Ignore (no term bump, no answer) while a leader lease is fresh, unless our own leader asks:
  // it re-elects itself to move past a higher term it has seen (forced vote).
  const bool from_our_leader = m.force && m.from == leader_ && role_ != election_role::leader;
  if (lease_fresh(now_ms) && !from_our_leader) {
    ++counters_.votes_ignored_lease;
    return;
  }
  if (m.term > d_.term) become_follower(m.term, no_member, now_ms, out);
  const bool grant = (d_.voted_for == no_member || d_.voted_for == m.from) && up_to_date(m.config);
  if (grant && d_.voted_for != m.from) {
    d_.voted_for = m.from;
    out.persist = true;
  }
  if (grant) reset_election_deadline(now_ms);
  election_message r = make(etype::vote_resp, m.from);
  r.granted = grant;
  out.messages.push_back(std::move(r));
}

void election::on_vote_resp(const election_message& m, std::uint64_t now_ms, election_output& out) {
  const bool pre = m.type == static_cast<std::uint8_t>(etype::pre_vote_resp);
  if (m.term > d_.term && !(pre && m.granted)) {
    become_follower(m.term, no_member, now_ms, out);  // learn the cluster's term
    return;
  }
  const auto want_role = pre ? election_role::pre_candidate : election_role::candidate;
  const std::uint64_t want_term = pre ? d_.term + 1 : d_.term;
  if (role_ != want_role || m.term != want_term || !m.granted || !d_.config.contains(m.from))
    return;
  votes_.insert(m.from);
  if (votes_.size() < d_.config.majority()) return;
  if (pre) {
    start_election(now_ms, false, out);
  } else {
    become_leader(now_ms, out);
  }
}

void election::on_heartbeat(const election_message& m, std::uint64_t now_ms, election_output& out) {
  const auto& mem = m.config.members;
  if (m.config.version == 0 || m.config.genesis == no_member || m.config.term > m.term ||
      !std::is_sorted(mem.begin(), mem.end()) ||
      std::adjacent_find(mem.begin(), mem.end()) != mem.end() || !m.config.contains(m.from)) {
    ++counters_.malformed;
    return;
  }
  if (d_.config.version != 0 && m.config.genesis != d_.config.genesis) {
    // Two lineages (clusters bootstrapped apart) met: the lower genesis id absorbs the other.
    if (m.config.genesis > d_.config.genesis) return;
    d_.config = member_config{};
    commit_version_ = 0;
    out.persist = true;
    out.events.push_back(config_event(d_.config, false));
    if (role_ != election_role::follower) become_follower(d_.term, no_member, now_ms, out);
  }
  if (m.term < d_.term) {
    // A stale leader, or we ran ahead: answer with our term so the leader moves past it.
    out.messages.push_back(make(etype::heartbeat_resp, m.from));
    return;
  }
  if (role_ == election_role::leader && m.term == d_.term) {
    ++counters_.malformed;  // two leaders in one term: impossible in one lineage
    return;
  }
  become_follower(m.term, m.from, now_ms, out);
  adopt_config(m.config, out);
  if (m.commit_version == d_.config.version && commit_version_ != m.commit_version) {
    commit_version_ = m.commit_version;
    out.events.push_back(config_event(d_.config, true));
  }
  election_message r = make(etype::heartbeat_resp, m.from);
  r.granted = true;
  r.config = header_of(d_.config);
  out.messages.push_back(std::move(r));
}

void election::on_heartbeat_resp(const election_message& m, std::uint64_t now_ms,
                                 election_output& out) {
  if (m.term > d_.term) {
    auto p = peers_.find(m.from);
    const bool wanted = d_.config.contains(m.from) ||
                        (p != peers_.end() && p->second.status == member_status::alive);
    if (role_ == election_role::leader && quorum_fresh(now_ms) && wanted && !leaving_) {
      // A healthy leader learns that a member ran ahead in term (it rejoined after campaigning
      // alone): re-elect itself past that term rather than step down and let the cluster churn.
      ++counters_.forced_reelections;
      d_.term = m.term;
      d_.voted_for = no_member;
      start_election(now_ms, true, out);
    } else {
      become_follower(m.term, no_member, now_ms, out);
    }
    return;
  }
  if (role_ != election_role::leader || m.term != d_.term || !m.granted) return;
  acks_[m.from] = ack_state{now_ms, m.config.version, m.config.term};
  maybe_commit(out);
}

// ---- leader: heartbeats and member-set changes --------------------------------------------------

std::vector<member_id> election::learners(std::uint64_t now_ms) const {
  (void)now_ms;
  std::vector<member_id> out;
  for (const auto& [id, p] : peers_)
    if (p.status == member_status::alive && !d_.config.contains(id) &&
        out.size() < cfg_.max_members)
      out.push_back(id);
  return out;
}

void election::send_heartbeats(std::uint64_t now_ms, election_output& out) {
  auto send = [&](member_id id) {
    election_message m = make(etype::heartbeat, id);
    m.config = d_.config;
    m.commit_version = commit_version_;
    out.messages.push_back(std::move(m));
  };
  for (member_id id : d_.config.members)
    if (id != cfg_.self) send(id);
  for (member_id id : learners(now_ms))
    send(id);
}

void election::change_config(std::uint64_t now_ms, election_output& out) {
  if (leaving_) return;
  // First commit a config stamped with our own term (Raft's no-op entry; it closes the known
  // single-server-change hole where an uncommitted change of an older term is overwritten).
  if (d_.config.term != d_.term) {
    propose(d_.config, out);
    return;
  }
  if (commit_version_ < d_.config.version) return;  // one change at a time
  for (member_id id : d_.config.members) {
    if (id == cfg_.self) continue;
    auto p = peers_.find(id);
    if (p == peers_.end()) continue;
    const bool gone = p->second.status == member_status::left ||
                      (p->second.status == member_status::dead &&
                       now_ms >= p->second.since_ms + cfg_.remove_dead_after_ms);
    // Membership's view can lag (a healed partition is seen dead until it refutes); a member
    // that acks our heartbeats is not removed whatever that view says, unless it left.
    auto a = acks_.find(id);
    const bool acking =
        a != acks_.end() && now_ms < a->second.last_ack_ms + cfg_.election_timeout_ms;
    if (!gone || (acking && p->second.status != member_status::left)) continue;
    member_config next = d_.config;
    std::erase(next.members, id);
    propose(std::move(next), out);
    return;
  }
  for (const auto& [id, p] : peers_) {
    if (p.status != member_status::alive || d_.config.contains(id)) continue;
    // Add only a node that answers our heartbeats this term: it is reachable and follows us, so
    // growing the majority cannot stall the cluster on a node that never acks.
    auto a = acks_.find(id);
    if (a == acks_.end() || now_ms >= a->second.last_ack_ms + cfg_.election_timeout_ms) continue;
    if (d_.config.members.size() >= cfg_.max_members) {
      ++counters_.members_refused;
      return;
    }
    member_config next = d_.config;
    next.members.insert(std::upper_bound(next.members.begin(), next.members.end(), id), id);
    propose(std::move(next), out);
    return;
  }
}

void election::propose(member_config next, election_output& out) {
  next.version = d_.config.version + 1;
  next.term = d_.term;
  next.genesis = d_.config.genesis;
  TESSERA_ASSERT(next.contains(cfg_.self), "leader {} proposed a config without itself", cfg_.self);
  d_.config = std::move(next);
  out.persist = true;
  out.events.push_back(config_event(d_.config, false));
  maybe_commit(out);
}

void election::maybe_commit(election_output& out) {
  if (role_ != election_role::leader || commit_version_ == d_.config.version) return;
  std::size_t acked = 0;
  for (member_id id : d_.config.members) {
    if (id == cfg_.self) {
      ++acked;
      continue;
    }
    auto it = acks_.find(id);
    if (it != acks_.end() && it->second.version == d_.config.version &&
        it->second.config_term == d_.config.term)
      ++acked;
  }
  if (acked < d_.config.majority()) return;
  commit_version_ = d_.config.version;
  out.events.push_back(config_event(d_.config, true));
}

void election::adopt_config(const member_config& c, election_output& out) {
  if (c == d_.config) return;
  d_.config = c;
  out.persist = true;
  out.events.push_back(config_event(d_.config, false));
}

election_message election::make(election_message_type type, member_id to) const {
  election_message m;
  m.type = static_cast<std::uint8_t>(type);
  m.from = cfg_.self;
  m.to = to;
  m.term = d_.term;
  return m;
}

}  // namespace tessera::mesh
