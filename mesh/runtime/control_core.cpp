#include "mesh/runtime/control_core.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "mesh/discovery/peer_hint.hpp"
#include "mesh/node/advertise.hpp"
#include "mesh/node/node_id.hpp"
#include "mesh/serving/planning.hpp"

namespace tessera::mesh::runtime {

using json = nlohmann::ordered_json;

std::optional<std::pair<std::string, std::string>> split_address(std::string_view a) {
  const auto at = a.find('@');
  if (at == std::string_view::npos) return std::nullopt;
  std::string id(a.substr(0, at));
  std::string ep(a.substr(at + 1));
  if (!is_node_id_text(id) || ep.rfind("tcp://", 0) != 0) return std::nullopt;
  return std::pair(std::move(id), std::move(ep));
}

member_id member_of(std::string_view hex) {
  auto id = node_id::parse(hex);
  return id ? id->lo : no_member;
}

namespace {

const char* backend_name(std::uint8_t b) {
  switch (b) {
    case 1:
      return "tcp";
    case 2:
      return "shm";
    case 3:
      return "rdma";
    default:
      return "-";
  }
}

}  // namespace

control_settings control_settings_for(const node_config& cfg) {
  control_settings s;
  s.membership.probe_interval_ms = cfg.timeouts.heartbeat_interval_ms;
  s.membership.probe_timeout_ms =
      std::max<std::uint32_t>(1, cfg.timeouts.heartbeat_interval_ms * 2 / 5);
  s.membership.suspicion_timeout_ms = cfg.timeouts.suspect_timeout_ms;
  s.election.election_timeout_ms = cfg.timeouts.election_timeout_min_ms;
  s.election.heartbeat_interval_ms =
      std::max<std::uint32_t>(10, cfg.timeouts.election_timeout_min_ms / 6);
  s.election.remove_dead_after_ms = cfg.timeouts.dead_timeout_ms;
  s.planner.max_tp_ranks = cfg.max_tp_ranks;
  s.planner.tp_max_rtt_us = cfg.tp_max_rtt_us;
  s.link_down_ms = std::max<std::uint64_t>(5000, 4ull * cfg.timeouts.suspect_timeout_ms);
  return s;
}

result<std::unique_ptr<control_core>> control_core::create(core_options o, control_port& port) {
  auto& mc = o.settings.membership;
  mc.self = o.self;
  mc.self_address = o.self_address;
  mc.rng_seed = o.membership_seed;
  auto m = membership::create(mc, o.incarnation);
  if (!m) return m.error();
  auto& ec = o.settings.election;
  ec.self = o.self;
  ec.rng_seed = o.election_seed;
  auto e = election::create(ec, o.restored);
  if (!e) return e.error();
  return std::unique_ptr<control_core>(
      new control_core(std::move(o), port, std::move(m).value(), std::move(e).value()));
}

control_core::control_core(core_options options, control_port& port, mesh::membership m,
                           mesh::election e)
    : opt_(std::move(options)),
      port_(port),
      log_(opt_.log ? *opt_.log : *spdlog::default_logger_raw()),
      caps_(opt_.caps),
      topo_(topology::topology_config{.self = opt_.self}) {
  members_.emplace(std::move(m));
  elect_.emplace(std::move(e));
}

void control_core::start(std::uint64_t now) {
  apply(elect_->step(election_tick{}, now), now);
  apply(members_->step(membership_join{{}}, now), now);
  refresh_topology_members(now);
}

void control_core::join(member_id id, const std::string& address, std::uint64_t now) {
  if (failed_ || id == opt_.self || members_->status_of(id)) return;
  apply(members_->step(membership_join{{member_update{id, 0, 0, address}}}, now), now);
}

void control_core::join(std::vector<member_update> seeds, std::uint64_t now) {
  std::erase_if(seeds, [&](const member_update& s) { return s.id == opt_.self; });
  if (failed_) return;
  apply(members_->step(membership_join{std::move(seeds)}, now), now);
}

void control_core::leave(std::uint64_t now) {
  if (failed_) return;
  apply(elect_->step(election_leave{}, now), now);
  apply(members_->step(membership_leave{}, now), now);
}

// ------------------------------------------------------------------ state machine outputs

void control_core::apply(membership_output out, std::uint64_t now) {
  if (failed_) return;
  for (auto& m : out.messages)
    port_.send(m.to, runtime_msg::membership, pack(m));
  membership_timer_ = out.timer_at_ms;
  for (auto& ev : out.events) {
    port_.learn(ev.id, ev.address, /*first_hand=*/false);
    log_.info("node {}: member {:016x} {} (incarnation {})", opt_.hex, ev.id, to_string(ev.status),
              ev.incarnation);
    apply(elect_->step(peer_status_changed{ev.id, ev.status}, now), now);
    if (failed_) return;
    port_.on_member_event(ev);
  }
  if (!out.events.empty()) {
    refresh_topology_members(now);
    hand_to_engine();
  }
}

void control_core::apply(election_output out, std::uint64_t now) {
  if (failed_) return;
  // Durable first, then messages: a vote must be on disk before anyone can learn of it.
  if (out.persist && !port_.persist(pack(elect_->durable()))) {
    failed_ = true;
    return;
  }
  for (auto& m : out.messages)
    port_.send(m.to, runtime_msg::election, pack(m));
  election_timer_ = out.timer_at_ms;
  for (auto& ev : out.events) {
    if (ev.kind == election_event_kind::leader_changed) {
      log_.info("node {}: leader {:016x} term {}", opt_.hex, ev.leader, ev.term);
      if (ev.leader != no_member) ++counters_.leader_changes;
      if (ev.leader == opt_.self && !topo_.is_leader()) leading_since_ms_ = now;
      topo_.on_leader(ev.term, ev.leader);
      next_report_ms_ = 0;  // the new leader needs our row at once
    } else if (ev.kind == election_event_kind::role_changed) {
      log_.info("node {}: role {} term {}", opt_.hex, to_string(ev.role), ev.term);
    }
  }
  publish_if_leader(now);
}

// ------------------------------------------------------------------ topology and plan

void control_core::refresh_topology_members(std::uint64_t now) {
  std::vector<topology::member_fact> facts;
  facts.push_back({opt_.self, static_cast<std::uint8_t>(member_status::alive), opt_.self_address});
  for (const auto& [id, m] : members_->members())
    facts.push_back({id, static_cast<std::uint8_t>(m.status), m.address});
  topo_.on_members(std::move(facts));
  publish_if_leader(now);
}

void control_core::publish_if_leader(std::uint64_t now) {
  if (!topo_.is_leader()) return;
  auto v = topo_.maybe_publish(now);
  if (!v) return;
  log_.info("node {}: view {}.{} ({} members, {} links)", opt_.hex, v->at.term, v->at.version,
            v->members.size(), v->links.size());
  broadcast_view(*v, now);
  hand_to_engine();
  replan(now);
  // The plan goes with every view: a view published because a link's measurements moved also
  // pushes the resend timer back, so a follower that missed the plan would otherwise wait for a
  // quiet 2 s that may never come (found by the simulator: a follower kept its old plan for
  // 17 s while the leader's views were republished every ~2 s).
  broadcast_plan();
}

/// Leader: the plan for the current view. Sticky: a view change that leaves every group valid
/// keeps the plan (and, within a term, its epoch): nothing is unloaded, nothing is dropped.
/// Not before every live member reported or max_plan_wait_ms passed (serving::ready_to_plan).
/// The caller sends it (broadcast_plan) with the view.
void control_core::replan(std::uint64_t now) {
  if (!topo_.is_leader() || !topo_.current()) return;
  if (!serving::ready_to_plan(*topo_.current(), now - leading_since_ms_)) return;
  auto p =
      serving::plan_from_view(*topo_.current(), plan_.get(), elect_->term(), opt_.settings.planner);
  if (!p) {
    log_.warn("node {}: cannot plan: {}", opt_.hex, p.error().describe());
    return;
  }
  if (plan_ && p->epoch == plan_->epoch) return;
  adopt_plan(std::make_shared<const placement::plan>(std::move(*p)));
}

void control_core::broadcast_plan() {
  if (!plan_ || !topo_.current()) return;
  const std::string body = pack(*plan_);
  for (const auto& m : topo_.current()->members)
    if (m.id != opt_.self && topology::is_live_status(m.status))
      port_.send(m.id, runtime_msg::plan, body);
}

void control_core::adopt_plan(std::shared_ptr<const placement::plan> p) {
  std::string groups;
  for (const auto& m : p->models)
    groups += fmt::format(" {}:{}", m.spec.name,
                          m.groups.empty() ? std::string("none") : std::to_string(m.groups.size()));
  log_.info("node {}: plan {}.{}{}", opt_.hex, p->epoch.term, p->epoch.version, groups);
  plan_ = std::move(p);
  hand_to_engine();
}

void control_core::hand_to_engine() {
  serving_facts f;
  f.plan = plan_;
  f.live.push_back(opt_.self);
  for (member_id id : live_members())
    f.live.push_back(id);
  // Client endpoints of the live members as the view has them (ours even before a view).
  f.endpoints.push_back(caps_.client_endpoint);
  if (const auto& v = topo_.current())
    for (const auto& m : v->members) {
      if (m.id == opt_.self || !topology::is_live_status(m.status)) continue;
      // A member whose client endpoints are on loopback can be reached by clients on its own
      // host only: listed by the peers of that host, left out by the others (for a client of
      // theirs, 127.0.0.1 would be some other process).
      const std::string& ep = m.caps.client_endpoint;  // host:request-port:response-port
      const bool loopback_only = is_loopback_address(ep.substr(0, ep.find(':')));
      if (!m.caps.client_endpoint.empty() && (!loopback_only || m.caps.host_id == caps_.host_id))
        f.endpoints.push_back(m.caps.client_endpoint);
      auto& pf = f.peers[m.id];
      pf = {m.caps.node_id, {m.caps.host_id, m.caps.has_rdma}, {}};
      for (const auto& s : m.caps.model_specs)
        pf.holds.push_back(s.name + "@" + s.content);
    }
  port_.serving_changed(std::move(f));
}

void control_core::broadcast_view(const topology::view& v, std::uint64_t now) {
  const std::string body = pack(v);
  for (const auto& m : v.members)
    if (m.id != opt_.self && topology::is_live_status(m.status))
      port_.send(m.id, runtime_msg::topo_view, body);
  next_view_resend_ms_ = now + 2000;
}

// ------------------------------------------------------------------ probing

std::vector<member_id> control_core::live_members() const {
  std::vector<member_id> out;
  for (const auto& [id, m] : members_->members())
    if (m.status == member_status::alive || m.status == member_status::suspect) out.push_back(id);
  return out;
}

const topology::capabilities* control_core::peer_caps(member_id id) const {
  auto it = probes_.find(id);
  return it == probes_.end() || !it->second.caps ? nullptr : &*it->second.caps;
}

void control_core::set_bandwidth(member_id id, double mbps, std::uint8_t backend,
                                 double bulk_rtt_us) {
  if (mbps <= 0) return;
  auto& p = probes_[id];
  p.bandwidth_mbps = mbps;
  p.bulk_rtt_us = bulk_rtt_us;
  p.measured_backend = backend;
}

topology::row_report control_core::own_row(std::uint64_t now) const {
  topology::row_report r;
  r.from = opt_.self;
  r.caps = caps_;
  for (member_id id : live_members()) {
    auto it = probes_.find(id);
    // Only links this node hears directly: a member reachable only through others (a bridge
    // partition) keeps its membership, but the planner must not put the two in one group.
    if (it == probes_.end() || it->second.last_pong_ms == 0 ||
        now - it->second.last_pong_ms > opt_.settings.link_down_ms)
      continue;
    topology::link_measure l;
    l.from = opt_.self;
    l.to = id;
    std::vector<std::uint64_t> s(it->second.rtt_us.begin(), it->second.rtt_us.end());
    if (!s.empty()) {
      std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
      l.rtt_us = std::max<std::uint64_t>(1, s[s.size() / 2]);
    }
    if (it->second.caps) l.backend = port_.backend_for(*it->second.caps);
    if (it->second.bandwidth_mbps > 0) {
      l.bandwidth_mbps = it->second.bandwidth_mbps;
      l.bulk_rtt_us = it->second.bulk_rtt_us;
      l.backend = it->second.measured_backend;
    }
    r.links.push_back(l);
  }
  return r;
}

void control_core::probe_round(std::uint64_t now) {
  if (now >= next_probe_ms_) {
    next_probe_ms_ = now + 500;
    ping_body b;
    b.caps = caps_;
    for (member_id id : live_members()) {
      b.seq = ++ping_seq_;
      b.sent_ns = port_.mono_ns();
      port_.send(id, runtime_msg::topo_ping, pack(b));
    }
  }
  if (now >= next_report_ms_) {
    next_report_ms_ = now + 1000;
    port_.refresh_caps(caps_);
    const auto leader = elect_->leader();
    auto row = own_row(now);
    if (leader == opt_.self) {
      topo_.on_report(row);
      publish_if_leader(now);
    } else if (leader != no_member) {
      port_.send(leader, runtime_msg::topo_report, pack(row));
    }
  }
  if (topo_.is_leader() && topo_.current() && now >= next_view_resend_ms_) {
    broadcast_view(*topo_.current(), now);
    replan(now);
    broadcast_plan();
  }
}

void control_core::tick(std::uint64_t now) {
  if (failed_) return;
  if (membership_timer_ && now >= *membership_timer_)
    apply(members_->step(membership_tick{}, now), now);
  if (election_timer_ && now >= *election_timer_) apply(elect_->step(election_tick{}, now), now);
  if (failed_) return;
  probe_round(now);
}

std::uint64_t control_core::next_wake() const {
  std::uint64_t wake = std::min(next_probe_ms_, next_report_ms_);
  if (membership_timer_) wake = std::min(wake, *membership_timer_);
  if (election_timer_) wake = std::min(wake, *election_timer_);
  if (topo_.is_leader() && topo_.current()) wake = std::min(wake, next_view_resend_ms_);
  return wake;
}

// ------------------------------------------------------------------ inbound

bool control_core::on_message(member_id from, std::string_view link, runtime_msg type,
                              std::string_view body, std::uint64_t now) {
  if (failed_) {
    switch (type) {
      case runtime_msg::membership:
      case runtime_msg::election:
      case runtime_msg::topo_ping:
      case runtime_msg::topo_pong:
      case runtime_msg::topo_report:
      case runtime_msg::topo_view:
      case runtime_msg::plan:
        return true;
      default:
        return false;
    }
  }
  switch (type) {
    case runtime_msg::membership: {
      auto msg = unpack<membership_message>(body);
      // A member speaks only for itself: the sender record must be the link's own id.
      if (!msg || msg->sender.id != from) break;
      port_.learn(msg->sender.id, msg->sender.address, /*first_hand=*/true);
      apply(members_->step(membership_receive{std::move(*msg)}, now), now);
      return true;
    }
    case runtime_msg::election: {
      auto msg = unpack<election_message>(body);
      // As for membership: a member speaks only for itself (a peer holding the secret cannot
      // cast votes or claim leadership in another member's name).
      if (!msg || msg->from != from || msg->to != opt_.self) break;
      apply(elect_->step(election_receive{std::move(*msg)}, now), now);
      return true;
    }
    case runtime_msg::topo_ping: {
      auto b = unpack<ping_body>(body);
      if (!b) break;
      if (from != no_member) probes_[from].caps = b->caps;
      ping_body pong{b->seq, b->sent_ns, caps_};
      port_.reply(from, link, runtime_msg::topo_pong, pack(pong));
      return true;
    }
    case runtime_msg::topo_pong: {
      auto b = unpack<ping_body>(body);
      if (!b || from == no_member) break;
      auto& p = probes_[from];
      p.caps = b->caps;
      p.last_pong_ms = now;
      const std::int64_t rtt_ns = port_.mono_ns() - b->sent_ns;
      if (rtt_ns > 0) {
        p.rtt_us.push_back(static_cast<std::uint64_t>(rtt_ns / 1000));
        while (p.rtt_us.size() > 5)
          p.rtt_us.pop_front();
      }
      return true;
    }
    case runtime_msg::topo_report: {
      auto r = unpack<topology::row_report>(body);
      if (!r || r->from != from) break;
      if (topo_.is_leader()) {
        topo_.on_report(*r);
        publish_if_leader(now);
      }
      return true;
    }
    case runtime_msg::topo_view: {
      auto v = unpack<topology::view>(body);
      // Views come from the leader that sends them...
      if (!v || v->leader != from) break;
      // ... and count only from the leader this node follows: a deposed leader's last view
      // crossing the new one's is normal, not garbage.
      if (v->leader != elect_->leader()) {
        ++counters_.stale;
        return true;
      }
      if (topo_.on_view(*v)) {
        log_.debug("node {}: adopted view {}.{}", opt_.hex, v->at.term, v->at.version);
        hand_to_engine();  // the client endpoints it lists
      }
      return true;
    }
    case runtime_msg::plan: {
      auto p = unpack<placement::plan>(body);
      if (!p) break;
      // Plans only from the leader this node follows (a stale leader must not adopt its
      // successor's plan and then issue epochs in that term).
      if (from != elect_->leader()) {
        ++counters_.stale;
        return true;
      }
      auto adopt = serving::should_adopt(plan_.get(), *p);
      if (!adopt) {
        ++counters_.plans_refused;
        log_.warn("node {}: plan refused: {}", opt_.hex, adopt.error().describe());
        return true;
      }
      if (*adopt) adopt_plan(std::make_shared<const placement::plan>(std::move(*p)));
      return true;
    }
    default:
      return false;
  }
  ++counters_.undecodable;
  return true;
}

// ------------------------------------------------------------------ status

std::string control_core::name_of(member_id id) const {
  if (id == opt_.self) return opt_.hex;
  if (auto it = members_->members().find(id); it != members_->members().end())
    if (auto parsed = split_address(it->second.address)) return parsed->first;
  return fmt::format("{:016x}", id);
}

json control_core::view_json() const {
  const auto& cur = topo_.current();
  if (!cur) return nullptr;
  json v;
  v["epoch"] = {{"term", cur->at.term}, {"version", cur->at.version}};
  v["leader"] = cur->leader == no_member ? json(nullptr) : json(name_of(cur->leader));
  json vm = json::array();
  for (const auto& m : cur->members) {
    auto parsed = split_address(m.address);
    vm.push_back({{"id", parsed ? parsed->first : name_of(m.id)},
                  {"status", to_string(static_cast<member_status>(m.status))},
                  {"address", parsed ? parsed->second : m.address},
                  {"cores", m.caps.cores},
                  {"memory_total_mb", m.caps.memory_total_mb},
                  {"memory_free_mb", m.caps.memory_free_mb},
                  {"has_rdma", m.caps.has_rdma},
                  {"rdma_devices", m.caps.rdma_devices},
                  {"models", m.caps.models},
                  {"version", m.caps.version},
                  {"pid", m.caps.pid},
                  {"hostname", m.caps.hostname},
                  {"host_id", m.caps.host_id}});
  }
  v["members"] = vm;
  auto id_text = [&](member_id id) {
    for (const auto& m : cur->members)
      if (m.id == id)
        if (auto p = split_address(m.address)) return p->first;
    return name_of(id);
  };
  json links = json::array();
  for (const auto& l : cur->links)
    links.push_back({{"from", id_text(l.from)},
                     {"to", id_text(l.to)},
                     {"rtt_us", l.rtt_us},
                     {"bandwidth_mbps", l.bandwidth_mbps},
                     {"bulk_rtt_us", l.bulk_rtt_us},
                     {"backend", backend_name(l.backend)}});
  v["links"] = links;
  return v;
}

json control_core::plan_json() const {
  if (!plan_) return nullptr;
  json pj;
  pj["epoch"] = {{"term", plan_->epoch.term}, {"version", plan_->epoch.version}};
  json models = json::array();
  for (const auto& m : plan_->models) {
    json groups = json::array();
    for (const auto& g : m.groups) {
      json ranks = json::array();
      for (const auto& r : g.ranks) {
        json rank = {{"node", name_of(r.node)},
                     {"stage", r.stage},
                     {"tp_rank", r.tp_rank},
                     {"layers", {r.layer_first, r.layer_last}},
                     {"heads", {r.head_first, r.head_last}}};
        // Expert parallelism: the experts this rank holds, [first, last).
        if (m.spec.n_experts > 0) {
          const std::uint32_t width = m.spec.ffn_size / m.spec.n_experts;
          rank["experts"] = {r.ffn_first / width, r.ffn_last / width};
        }
        ranks.push_back(std::move(rank));
      }
      groups.push_back(ranks);
    }
    models.push_back({{"name", m.spec.name},
                      {"groups", groups},
                      {"no_capacity", m.no_capacity.empty() ? json(nullptr) : json(m.no_capacity)},
                      {"links_pending", m.links_pending}});
  }
  pj["models"] = models;
  return pj;
}

void control_core::status_into(json& j, const std::string& self_endpoint) const {
  const auto leader = elect_->leader();
  j["node"]["role"] = to_string(elect_->role());
  j["node"]["term"] = elect_->term();
  j["node"]["leader"] = leader == no_member ? json(nullptr) : json(name_of(leader));
  j["node"]["config_version"] = elect_->config().version;
  j["node"]["config_members"] = elect_->config().members.size();
  json ms = json::array();
  ms.push_back({{"id", opt_.hex},
                {"status", "alive"},
                {"incarnation", members_->incarnation()},
                {"address", self_endpoint}});
  for (const auto& [id, m] : members_->members()) {
    auto parsed = split_address(m.address);
    ms.push_back({{"id", name_of(id)},
                  {"status", to_string(m.status)},
                  {"incarnation", m.incarnation},
                  {"address", parsed ? parsed->second : m.address}});
  }
  j["membership"] = ms;
  j["view"] = view_json();
  j["plan"] = plan_json();
  j["stats"]["undecodable"] = counters_.undecodable;
  j["stats"]["stale"] = counters_.stale;
  j["stats"]["plans_refused"] = counters_.plans_refused;
  j["stats"]["leader_changes"] = counters_.leader_changes;
  const auto& mc = members_->counters();
  j["failure_detection"] = {
      {"health", members_->health()},      {"probe_interval_ms", members_->probe_interval_now()},
      {"suspicions", mc.suspicions},       {"refutations", mc.refutations},
      {"confirmations", mc.confirmations}, {"stalls", mc.stalls},
      {"nacks_sent", mc.nacks_sent},       {"nacks_missed", mc.nacks_missed}};
}

}  // namespace tessera::mesh::runtime
