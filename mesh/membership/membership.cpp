#include "mesh/membership/membership.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace tessera::mesh {

namespace {

using mtype = membership_message_type;

// Same incarnation: a later status in this order wins (left is the most precise news).
int rank(member_status s) {
  return static_cast<int>(s);
}

bool is_live(member_status s) {
  return s == member_status::alive || s == member_status::suspect;
}

}  // namespace

const char* to_string(member_status status) noexcept {
  switch (status) {
    case member_status::alive:
      return "alive";
    case member_status::suspect:
      return "suspect";
    case member_status::dead:
      return "dead";
    case member_status::left:
      return "left";
  }
  return "unknown";
}

result<void> membership_config::validate() const {
  if (self == no_member) return make_error(errc::invalid_argument, "membership: self id is 0");
  if (probe_interval_ms == 0)
    return make_error(errc::invalid_argument, "membership: probe_interval_ms is 0");
  if (probe_timeout_ms == 0 || probe_timeout_ms >= probe_interval_ms)
    return make_error(errc::invalid_argument,
                      "membership: probe_timeout_ms {} must be in (0, probe_interval_ms {})",
                      probe_timeout_ms, probe_interval_ms);
  if (suspicion_timeout_ms == 0)
    return make_error(errc::invalid_argument, "membership: suspicion_timeout_ms is 0");
  if (reconnect_interval_ms == 0)
    return make_error(errc::invalid_argument, "membership: reconnect_interval_ms is 0");
  if (join_retry_ms == 0)
    return make_error(errc::invalid_argument, "membership: join_retry_ms is 0");
  if (retransmit_mult == 0)
    return make_error(errc::invalid_argument, "membership: retransmit_mult is 0");
  if (max_members < 1 || max_piggyback < 1 || max_updates_per_message < 1 || max_relays < 1)
    return make_error(errc::invalid_argument,
                      "membership: max_members/max_piggyback/max_updates_per_message/max_relays "
                      "must be >= 1");
  if (suspicion_max_mult == 0)
    return make_error(errc::invalid_argument, "membership: suspicion_max_mult is 0");
  if (max_health > 64)
    return make_error(errc::invalid_argument, "membership: max_health {} is above 64", max_health);
  if (self_address.size() > max_address_bytes)
    return make_error(errc::invalid_argument,
                      "membership: self_address is {} bytes, above max_address_bytes {}",
                      self_address.size(), max_address_bytes);
  return ok();
}

result<membership> membership::create(const membership_config& cfg, std::uint64_t incarnation) {
  TESSERA_TRY(cfg.validate());
  return membership(cfg, incarnation);
}

membership::membership(const membership_config& cfg, std::uint64_t incarnation)
    : cfg_(cfg),
      rng_(cfg.rng_seed ^ (cfg.self * 0x9e3779b97f4a7c15ULL)),
      incarnation_(incarnation) {}

std::optional<member_status> membership::status_of(member_id id) const {
  if (id == cfg_.self) return leaving_ ? member_status::left : member_status::alive;
  auto it = members_.find(id);
  if (it == members_.end()) return std::nullopt;
  return it->second.status;
}

std::uint32_t membership::probe_interval_now() const {
  return cfg_.probe_interval_ms * (1 + health_);
}

std::uint32_t membership::probe_timeout_now() const {
  return cfg_.probe_timeout_ms * (1 + health_);
}

std::uint64_t membership::suspect_deadline(const member_info& m) const {
  // Lifeguard's suspicion timeout: max with no confirmation, down to min (log scale) as
  // independent accusers join, where k is what can be expected: the members alive here, other
  // than the suspect, that could confirm, at most suspicion_confirmations.
  const std::uint64_t lo = cfg_.suspicion_timeout_ms;
  const std::uint64_t hi = lo * cfg_.suspicion_max_mult;
  std::uint32_t could_confirm = 0;
  for (const auto& [id, o] : members_)
    could_confirm += (id != m.id && o.status == member_status::alive) ? 1 : 0;
  const std::uint32_t k = std::min(cfg_.suspicion_confirmations, could_confirm);
  const std::uint32_t c =
      m.accusers.empty() ? 0 : static_cast<std::uint32_t>(m.accusers.size() - 1);
  std::uint64_t timeout = lo;
  if (k > 0 && c < k) {
    const double frac = std::log(c + 1.0) / std::log(k + 1.0);
    timeout = std::max(lo, hi - static_cast<std::uint64_t>(static_cast<double>(hi - lo) * frac));
  }
  return m.changed_ms + timeout;
}

std::size_t membership::live_count() const {
  std::size_t n = leaving_ ? 0 : 1;
  for (const auto& [id, m] : members_)
    n += is_live(m.status) ? 1 : 0;
  return n;
}

membership_output membership::step(const membership_input& input, std::uint64_t now_ms) {
  membership_output out;
  if (!started_) {
    started_ = true;
    next_probe_ms_ = now_ms + cfg_.probe_interval_ms;
    next_reconnect_ms_ = now_ms + cfg_.reconnect_interval_ms;
  }
  // Run late past the timer we asked for: the host did not run us (CPU starvation, a pause).
  // Move every deadline on by the lateness before looking at anything, so the acks that are
  // waiting to be read are not taken for silence.
  if (expected_wake_ms_ != 0 && now_ms > expected_wake_ms_ + cfg_.stall_threshold_ms)
    on_stall(now_ms - expected_wake_ms_);
  std::visit(
      [&](const auto& in) {
        using T = std::decay_t<decltype(in)>;
        if constexpr (std::is_same_v<T, membership_tick>) on_tick(now_ms, out);
        if constexpr (std::is_same_v<T, membership_receive>) on_receive(in.message, now_ms, out);
        if constexpr (std::is_same_v<T, membership_join>) on_join(in, now_ms, out);
        if constexpr (std::is_same_v<T, membership_leave>) on_leave(now_ms, out);
      },
      input);
  // Anything due now (e.g. a receive that arrived after a deadline) is handled in the same step.
  if (!std::holds_alternative<membership_tick>(input)) on_tick(now_ms, out);
  out.timer_at_ms = next_timer();
  expected_wake_ms_ = out.timer_at_ms.value_or(0);
  return out;
}

void membership::on_stall(std::uint64_t late_ms) {
  ++counters_.stalls;
  adjust_health(1);
  next_probe_ms_ += late_ms;
  probe_direct_deadline_ms_ += late_ms;
  next_reconnect_ms_ += late_ms;
  for (auto& [id, m] : members_)
    m.changed_ms += late_ms;  // suspicion deadlines and tombstone ages alike
  for (auto& [seq, r] : relays_) {
    r.deadline_ms += late_ms;
    r.nack_at_ms += late_ms;
  }
}

void membership::adjust_health(int delta) {
  const auto h = static_cast<int>(health_) + delta;
  health_ = static_cast<std::uint32_t>(std::clamp(h, 0, static_cast<int>(cfg_.max_health)));
}

void membership::accuse(member_info& m, member_id accuser) {
  if (accuser == no_member) return;
  if (std::find(m.accusers.begin(), m.accusers.end(), accuser) != m.accusers.end()) return;
  if (m.accusers.size() > cfg_.suspicion_confirmations) return;  // the minimum is reached
  if (!m.accusers.empty()) ++counters_.confirmations;
  m.accusers.push_back(accuser);
}

// ---- timers ----------------------------------------------------------------------------------

void membership::on_tick(std::uint64_t now_ms, membership_output& out) {
  if (leaving_) return;
  expire(now_ms, out);
  // Helpers whose target has not answered tell the requester so: it learns that they (and so
  // its own path to them) are fine, and the silence is the target's.
  for (auto& [seq, r] : relays_) {
    if (r.nacked || now_ms < r.nack_at_ms) continue;
    r.nacked = true;
    ++counters_.nacks_sent;
    out.messages.push_back(make(mtype::nack, r.requester, r.requester_seq, r.target));
  }
  if (probe_phase_ == probe_phase::direct && now_ms >= probe_direct_deadline_ms_)
    send_indirect_probes(out);
  if (now_ms >= next_probe_ms_) {
    run_probe_round(now_ms, out);
    next_probe_ms_ = now_ms + probe_interval_now();
  }
  if (now_ms >= next_reconnect_ms_) {
    reconnect(out);
    next_reconnect_ms_ = now_ms + cfg_.reconnect_interval_ms;
  }
  if (!joined_ && !seeds_.empty() && now_ms >= next_join_ms_) {
    send_joins(out);
    next_join_ms_ = now_ms + cfg_.join_retry_ms;
  }
}

std::optional<std::uint64_t> membership::next_timer() const {
  if (leaving_) return std::nullopt;
  std::uint64_t t = std::min(next_probe_ms_, next_reconnect_ms_);
  if (probe_phase_ == probe_phase::direct) t = std::min(t, probe_direct_deadline_ms_);
  if (!joined_ && !seeds_.empty()) t = std::min(t, next_join_ms_);
  for (const auto& [id, m] : members_) {
    if (m.status == member_status::suspect) t = std::min(t, suspect_deadline(m));
    if (!is_live(m.status)) t = std::min(t, m.changed_ms + cfg_.tombstone_ms);
  }
  for (const auto& [seq, r] : relays_) {
    t = std::min(t, r.deadline_ms);
    if (!r.nacked) t = std::min(t, r.nack_at_ms);
  }
  return t;
}

void membership::expire(std::uint64_t now_ms, membership_output& out) {
  for (auto it = members_.begin(); it != members_.end();) {
    member_info& m = it->second;
    if (m.status == member_status::suspect && now_ms >= suspect_deadline(m)) {
      set_status(m, member_status::dead, m.incarnation, now_ms, out);
      enqueue_gossip(update_of(m));
    }
    if (!is_live(m.status) && now_ms >= m.changed_ms + cfg_.tombstone_ms) {
      it = members_.erase(it);
      continue;
    }
    ++it;
  }
  for (auto it = relays_.begin(); it != relays_.end();)
    it = now_ms >= it->second.deadline_ms ? relays_.erase(it) : std::next(it);
}

void membership::run_probe_round(std::uint64_t now_ms, membership_output& out) {
  // The previous round ended without an ack, direct or relayed: suspect the target.
  if (probe_phase_ != probe_phase::idle) {
    // Lifeguard: helpers that neither relayed an ack nor sent a nack point at us (our sends or
    // receives are slow); with every nack in, the silence is the target's alone.
    if (probe_phase_ == probe_phase::indirect && nacks_expected_ > 0) {
      const std::uint32_t missed = nacks_expected_ - std::min(nacks_heard_, nacks_expected_);
      counters_.nacks_missed += missed;
      adjust_health(static_cast<int>(missed));
    } else {
      adjust_health(1);
    }
    auto it = members_.find(probe_target_);
    if (it != members_.end() && it->second.status == member_status::alive) {
      ++counters_.suspicions;
      set_status(it->second, member_status::suspect, it->second.incarnation, now_ms, out);
      accuse(it->second, cfg_.self);
      enqueue_gossip(update_of(it->second));
    } else if (it != members_.end() && it->second.status == member_status::suspect) {
      // Our own probe failing is an independent confirmation of someone else's suspicion.
      const auto before = it->second.accusers.size();
      accuse(it->second, cfg_.self);
      if (it->second.accusers.size() != before) {
        member_update u = update_of(it->second);
        u.origin = cfg_.self;  // spread our confirmation, not the first accuser's again
        enqueue_gossip(u);
      }
    }
    probe_phase_ = probe_phase::idle;
  }
  member_id target = next_probe_target();
  if (target == no_member) return;
  probe_target_ = target;
  probe_seq_ = next_seq_++;
  probe_phase_ = probe_phase::direct;
  probe_direct_deadline_ms_ = now_ms + probe_timeout_now();
  nacks_expected_ = 0;
  nacks_heard_ = 0;
  out.messages.push_back(make(mtype::ping, target, probe_seq_, no_member));
}

member_id membership::next_probe_target() {
  // Shuffled round robin (SWIM section 4.3): every live member is probed once per pass, in an
  // order re-shuffled each pass, which bounds the time to first detection.
  for (int pass = 0; pass < 2; ++pass) {
    while (probe_index_ < probe_order_.size()) {
      member_id id = probe_order_[probe_index_++];
      auto it = members_.find(id);
      if (it != members_.end() && is_live(it->second.status)) return id;
    }
    probe_order_.clear();
    probe_index_ = 0;
    for (const auto& [id, m] : members_)
      if (is_live(m.status)) probe_order_.push_back(id);
    for (std::size_t i = probe_order_.size(); i > 1; --i)
      std::swap(probe_order_[i - 1], probe_order_[rng_.uniform(0, i)]);
  }
  return no_member;
}

void membership::send_indirect_probes(membership_output& out) {
  probe_phase_ = probe_phase::indirect;
  std::vector<member_id> helpers;
  for (const auto& [id, m] : members_)
    if (id != probe_target_ && m.status == member_status::alive) helpers.push_back(id);
  for (std::size_t i = 0; i < helpers.size() && i < cfg_.indirect_probes; ++i) {
    std::swap(helpers[i], helpers[rng_.uniform(i, helpers.size())]);
    out.messages.push_back(make(mtype::ping_req, helpers[i], probe_seq_, probe_target_));
    ++nacks_expected_;
  }
}

void membership::send_joins(membership_output& out) {
  for (const auto& s : seeds_)
    out.messages.push_back(make(mtype::join, s.id, 0, no_member));
}

void membership::reconnect(membership_output& out) {
  std::vector<member_id> candidates;
  for (const auto& [id, m] : members_)
    if (m.status == member_status::dead) candidates.push_back(id);
  for (const auto& s : seeds_) {
    auto it = members_.find(s.id);
    if (it == members_.end()) candidates.push_back(s.id);
  }
  if (candidates.empty()) return;
  out.messages.push_back(
      make(mtype::join, candidates[rng_.uniform(0, candidates.size())], 0, no_member));
}

// ---- inputs ----------------------------------------------------------------------------------

void membership::on_join(const membership_join& join, std::uint64_t now_ms,
                         membership_output& /*out: the joins go out from on_tick*/) {
  if (leaving_) return;
  for (const auto& s : join.seeds) {
    if (s.id == cfg_.self || !valid(s)) continue;
    if (seeds_.size() >= cfg_.max_members) {
      ++counters_.members_refused;
      break;
    }
    seeds_.push_back(s);
  }
  joined_ = false;
  next_join_ms_ = now_ms;  // on_tick (same step) sends the joins now
}

void membership::on_leave(std::uint64_t now_ms, membership_output& out) {
  if (leaving_) return;
  leaving_ = true;  // first, so the announcement carries our `left` record
  // Announced directly to every live member at once: peers learn without waiting for a
  // timeout or for gossip to spread.
  for (const auto& [id, m] : members_)
    if (is_live(m.status)) out.messages.push_back(make(mtype::leave, id, 0, no_member));
  (void)now_ms;
}

bool membership::valid(const member_update& u) const {
  return u.id != no_member && u.status <= static_cast<std::uint8_t>(member_status::left) &&
         u.address.size() <= cfg_.max_address_bytes;
}

void membership::on_receive(const membership_message& msg, std::uint64_t now_ms,
                            membership_output& out) {
  if (leaving_) return;
  const bool type_ok = msg.type >= static_cast<std::uint8_t>(mtype::ping) &&
                       msg.type <= static_cast<std::uint8_t>(mtype::nack);
  if (!type_ok || msg.to != cfg_.self || !valid(msg.sender) || msg.sender.id == cfg_.self ||
      (msg.type != static_cast<std::uint8_t>(mtype::join_ack) &&
       msg.updates.size() > cfg_.max_updates_per_message) ||
      msg.updates.size() > cfg_.max_members) {
    ++counters_.malformed;
    return;
  }
  const auto type = static_cast<mtype>(msg.type);
  const member_id from = msg.sender.id;
  member_update sender = msg.sender;
  sender.status =
      static_cast<std::uint8_t>(type == mtype::leave ? member_status::left : member_status::alive);
  apply_update(sender, now_ms, out);
  for (const auto& u : msg.updates) {
    if (!valid(u)) {
      ++counters_.malformed;
      continue;
    }
    apply_update(u, now_ms, out);
  }
  auto known = members_.find(from);
  // The sender claims an address that our newer record of it contradicts (another process
  // announced the same id elsewhere): tell it our record now, so it refutes and every peer
  // converges on where it really is, instead of waiting for gossip that may have run out.
  if (known != members_.end() && known->second.status == member_status::alive &&
      known->second.incarnation > msg.sender.incarnation && !known->second.address.empty() &&
      known->second.address != msg.sender.address) {
    membership_message tell = make(mtype::ping, from, 0, no_member);
    tell.updates.insert(tell.updates.begin(), update_of(known->second));
    if (tell.updates.size() > cfg_.max_updates_per_message)
      tell.updates.resize(cfg_.max_updates_per_message);
    out.messages.push_back(std::move(tell));
  }
  // The sender talks to us but we hold it suspect/dead at an incarnation it has not refuted:
  // tell it now (the ack of a ping carries this anyway) instead of waiting for gossip.
  if (type != mtype::ping && type != mtype::join && type != mtype::leave &&
      known != members_.end() &&
      (known->second.status == member_status::suspect ||
       known->second.status == member_status::dead))
    out.messages.push_back(make(mtype::ping, from, 0, no_member));
  switch (type) {
    case mtype::ping:
      out.messages.push_back(make(mtype::ack, from, msg.seq, no_member));
      break;
    case mtype::ack: {
      auto r = relays_.find(msg.seq);
      if (r != relays_.end() && r->second.target == from) {
        out.messages.push_back(
            make(mtype::ack, r->second.requester, r->second.requester_seq, from));
        relays_.erase(r);
      } else if (probe_phase_ != probe_phase::idle && msg.seq == probe_seq_ &&
                 (from == probe_target_ || msg.target == probe_target_)) {
        if (probe_phase_ == probe_phase::direct && from == probe_target_) adjust_health(-1);
        probe_phase_ = probe_phase::idle;
      }
      break;
    }
    case mtype::nack:
      if (probe_phase_ == probe_phase::indirect && msg.seq == probe_seq_ &&
          msg.target == probe_target_)
        ++nacks_heard_;
      break;
    case mtype::ping_req: {
      if (msg.target == no_member || msg.target == cfg_.self) {
        ++counters_.malformed;
        break;
      }
      if (relays_.size() >= cfg_.max_relays) {
        ++counters_.relays_refused;  // the requester's round fails or another helper answers
        break;
      }
      const std::uint64_t seq = next_seq_++;
      // Nack at 4/5 of our own probe timeout: early enough to reach the requester before its
      // round ends (its indirect phase is at least probe_interval - probe_timeout long).
      relays_[seq] = relay{from,
                           msg.seq,
                           msg.target,
                           now_ms + cfg_.probe_interval_ms,
                           now_ms + cfg_.probe_timeout_ms * 4 / 5,
                           false};
      out.messages.push_back(make(mtype::ping, msg.target, seq, no_member));
      break;
    }
    case mtype::join: {
      membership_message ack = make(mtype::join_ack, from, 0, no_member);
      ack.updates.clear();
      // If we hold the joiner suspect/dead at its incarnation, say so: it refutes at once.
      auto j = members_.find(from);
      if (j != members_.end() && j->second.status != member_status::alive)
        ack.updates.push_back(update_of(j->second));
      for (const auto& [id, m] : members_)
        if (id != from && ack.updates.size() < cfg_.max_members)
          ack.updates.push_back(update_of(m));
      out.messages.push_back(std::move(ack));
      break;
    }
    case mtype::join_ack:
      joined_ = true;
      break;
    case mtype::leave:
      break;
  }
  // Any message from a seed proves we are known: stop re-sending joins.
  for (const auto& s : seeds_)
    if (s.id == from) joined_ = true;
}

// ---- gossip ----------------------------------------------------------------------------------

void membership::apply_update(const member_update& u, std::uint64_t now_ms,
                              membership_output& out) {
  const auto status = static_cast<member_status>(u.status);
  if (u.id == cfg_.self) {
    // Refute what is not us: suspicion of us, and also a record that places us at another
    // address (a copied identity announced itself there; left alone, peers would dial it).
    const bool elsewhere = !u.address.empty() && u.address != cfg_.self_address;
    if ((status != member_status::alive || elsewhere) && u.incarnation >= incarnation_)
      refute(u.incarnation);
    return;
  }
  auto it = members_.find(u.id);
  if (it == members_.end()) {
    if (!insert_member(u, now_ms)) return;
    member_info& m = members_.at(u.id);
    if (is_live(status)) {
      out.events.push_back(member_event{m.id, member_status::alive, m.incarnation, m.address});
      if (status == member_status::suspect) {
        set_status(m, member_status::suspect, u.incarnation, now_ms, out);
        accuse(m, u.origin);
      }
      enqueue_gossip(update_of(m));
    }
    return;
  }
  member_info& m = it->second;
  // The same suspicion from another accuser: a Lifeguard confirmation; pass it on once.
  if (status == member_status::suspect && m.status == member_status::suspect &&
      u.incarnation == m.incarnation) {
    const auto before = m.accusers.size();
    accuse(m, u.origin);
    if (m.accusers.size() != before) enqueue_gossip(u);
    return;
  }
  const bool newer = u.incarnation > m.incarnation ||
                     (u.incarnation == m.incarnation && rank(status) > rank(m.status));
  if (!newer) return;
  if (!u.address.empty()) m.address = u.address;
  if (status == m.status) {
    m.incarnation = u.incarnation;  // same status, newer incarnation: no event
    if (status == member_status::suspect) {
      m.accusers.clear();  // a new suspicion of the newer incarnation
      m.changed_ms = now_ms;
    }
  } else {
    set_status(m, status, u.incarnation, now_ms, out);
  }
  if (status == member_status::suspect) accuse(m, u.origin);
  enqueue_gossip(update_of(m));
}

bool membership::insert_member(const member_update& u, std::uint64_t now_ms) {
  if (members_.size() >= cfg_.max_members) {
    // Make room by forgetting the oldest tombstone; live members are never evicted.
    auto victim = members_.end();
    for (auto it = members_.begin(); it != members_.end(); ++it)
      if (!is_live(it->second.status) &&
          (victim == members_.end() || it->second.changed_ms < victim->second.changed_ms))
        victim = it;
    if (victim == members_.end()) {
      ++counters_.members_refused;
      return false;
    }
    members_.erase(victim);
  }
  const auto status = static_cast<member_status>(u.status);
  member_info m;
  m.id = u.id;
  m.incarnation = u.incarnation;
  // A first-heard suspect is entered alive and moved to suspect by the caller (so subscribers
  // see alive first); a first-heard dead/left is a silent tombstone.
  m.status = is_live(status) ? member_status::alive : status;
  m.address = u.address;
  m.changed_ms = now_ms;
  members_.emplace(u.id, std::move(m));
  return true;
}

void membership::set_status(member_info& m, member_status s, std::uint64_t incarnation,
                            std::uint64_t now_ms, membership_output& out) {
  m.status = s;
  m.incarnation = incarnation;
  m.changed_ms = now_ms;
  m.accusers.clear();
  out.events.push_back(member_event{m.id, s, m.incarnation, m.address});
}

void membership::refute(std::uint64_t seen_incarnation) {
  if (leaving_) return;
  ++counters_.refutations;
  adjust_health(1);  // Lifeguard: being suspected hints that we are the slow one
  incarnation_ = seen_incarnation + 1;
  enqueue_gossip(self_update());
}

void membership::enqueue_gossip(const member_update& u) {
  for (auto& e : piggyback_) {
    if (e.update.id == u.id) {
      e = piggyback_entry{u, 0};
      return;
    }
  }
  if (piggyback_.size() >= cfg_.max_piggyback) {
    // Evict the entry already sent most often: it has had the most chances to spread.
    auto victim =
        std::max_element(piggyback_.begin(), piggyback_.end(),
                         [](const auto& a, const auto& b) { return a.transmits < b.transmits; });
    piggyback_.erase(victim);
    ++counters_.piggyback_evicted;
  }
  piggyback_.push_back(piggyback_entry{u, 0});
}

std::uint32_t membership::retransmit_limit() const {
  const auto n = static_cast<std::uint32_t>(members_.size() + 2);
  return cfg_.retransmit_mult * static_cast<std::uint32_t>(std::bit_width(n));
}

void membership::attach_gossip(membership_message& msg, member_id to) {
  // Tell the receiver first if we hold it suspect/dead/left at an incarnation it may not know:
  // that is what makes it refute.
  auto it = members_.find(to);
  if (it != members_.end() && it->second.status != member_status::alive)
    msg.updates.push_back(update_of(it->second));
  std::stable_sort(piggyback_.begin(), piggyback_.end(),
                   [](const auto& a, const auto& b) { return a.transmits < b.transmits; });
  const std::uint32_t limit = retransmit_limit();
  for (auto& e : piggyback_) {
    if (msg.updates.size() >= cfg_.max_updates_per_message) break;
    if (e.update.id == to) continue;
    msg.updates.push_back(e.update);
    ++e.transmits;
  }
  std::erase_if(piggyback_, [&](const auto& e) { return e.transmits >= limit; });
}

member_update membership::self_update() const {
  return member_update{
      cfg_.self, incarnation_,
      static_cast<std::uint8_t>(leaving_ ? member_status::left : member_status::alive),
      cfg_.self_address};
}

member_update membership::update_of(const member_info& m) const {
  const member_id origin =
      m.status == member_status::suspect && !m.accusers.empty() ? m.accusers.front() : no_member;
  return member_update{m.id, m.incarnation, static_cast<std::uint8_t>(m.status), m.address, origin};
}

membership_message membership::make(membership_message_type type, member_id to, std::uint64_t seq,
                                    member_id target) {
  membership_message msg;
  msg.type = static_cast<std::uint8_t>(type);
  msg.sender = self_update();
  msg.to = to;
  msg.seq = seq;
  msg.target = target;
  attach_gossip(msg, to);
  return msg;
}

}  // namespace tessera::mesh
