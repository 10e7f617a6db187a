// The control actor's side of the node (node_impl.hpp): every event of the control plane,
// discovery and membership subscribers is one of its messages, handled one at a time on the node's
// actor system, and the core's timers, bandwidth probes, the dashboard's member documents and the
// status snapshot run on its ticks. Supervised: a failure remakes the core from the disk.
#include "mesh/runtime/node_impl.hpp"

namespace tessera::mesh::runtime {

namespace {

/// The node's control actor: every event of the control plane, discovery and subscriptions is
/// one of its messages, handled one at a time on the actor system's worker, so the core and the
/// node's link tables need no locks. Its one timer is re-armed after each turn for the core's
/// next deadline.
class control_actor_t final : public actors::actor {
 public:
  explicit control_actor_t(node_runtime::impl& p) : p_(p) {}

  void on_start() override {
    on<node_runtime::impl::node_event>([this](node_runtime::impl::node_event& m) {
      if (m.frame) --p_.queued_frames;
      p_.handle(m.e);
      after_turn();
    });
    on<node_runtime::impl::node_tick>([this](node_runtime::impl::node_tick&) {
      armed_.reset();
      p_.tick();
      after_turn();
    });
    if (p_.control_instances++ == 0) {
      p_.core->start(p_.now_ms());
    } else {
      const auto n = ++p_.control_restarts;
      spdlog::warn(
          "node {}: control actor restarted by its supervisor (restart {}): core "
          "remade from the election state on disk",
          p_.hex, n);
      p_.remake_core();
    }
    std::vector<node_runtime::impl::node_event> early;
    {
      std::lock_guard lock(p_.mu);
      early.swap(p_.early);
      p_.actor_running = true;
      p_.control_actor = self();
      p_.queued_frames = 0;  // what the failed instance held is gone
    }
    for (auto& m : early) {
      if (m.frame) --p_.queued_frames;
      p_.handle(m.e);
    }
    after_turn();
  }

 private:
  void after_turn() {
    if (p_.failed || p_.stopped()) return;
    auto in_ms = p_.next_tick_in_ms();
    if (in_ms == 0) {
      p_.tick();
      in_ms = std::max<std::uint64_t>(1, p_.next_tick_in_ms());
    }
    const auto due = now() + std::chrono::milliseconds(in_ms);
    // A tick a second overdue is not on its way (timers go on the control lane, served first):
    // it was refused by a full lane (counted, logged). Without a new one, a node whose peers all
    // fell silent would never tick again.
    if (armed_ && armed_->first + std::chrono::seconds(1) < now()) armed_.reset();
    if (armed_ && armed_->first <= due) return;  // an earlier tick is on its way
    if (armed_) cancel_timer(armed_->second);
    armed_.emplace(due, after(std::chrono::milliseconds(in_ms), node_runtime::impl::node_tick{}));
  }

  void on_stop(const actors::exit_reason& why) override {
    if (why.abnormal()) spdlog::error("node {}: control actor failed: {}", p_.hex, why.describe());
  }

  node_runtime::impl& p_;
  std::optional<std::pair<actors::clock::time_point, actors::timer_id>> armed_;
};

/// Watches the control actor's supervisor: when it gives up (more failures than its restart
/// bound allows), the node stops with the reason instead of running without its control.
class control_watch_t final : public actors::actor {
 public:
  control_watch_t(node_runtime::impl& p, actors::actor_ref supervisor)
      : p_(p), supervisor_(std::move(supervisor)) {}
  void on_start() override {
    on<actors::down>([this](actors::down& d) {
      if (d.reason.abnormal())
        p_.fail(fmt::format("the control actor kept failing; its supervisor gave up: {}",
                            d.reason.describe()));
    });
    (void)monitor(supervisor_);
  }

 private:
  node_runtime::impl& p_;
  actors::actor_ref supervisor_;
};

}  // namespace

std::unique_ptr<actors::actor> make_control_actor(node_runtime::impl& p) {
  return std::make_unique<control_actor_t>(p);
}

std::unique_ptr<actors::actor> make_control_watch(node_runtime::impl& p,
                                                  actors::actor_ref supervisor) {
  return std::make_unique<control_watch_t>(p, std::move(supervisor));
}

void node_runtime::impl::ask_cluster_status() {
  if (!members_docs.ask_due()) return;
  const std::string body = pack(endpoint);
  for (member_id id : core->live_members())
    (void)directory->send(id, static_cast<std::uint16_t>(runtime_msg::status_request), body);
}

std::uint64_t node_runtime::impl::real_ms() const {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count());
}

std::uint64_t node_runtime::impl::now_ms() const {
  transport::faults::clock_rule r;
  if (injector)
    injector->update([&](const transport::faults::fault_policy& p) {
      if (const auto* c = p.clock_for(hex)) r = *c;
    });
  std::lock_guard g(clock_mu);
  const auto real = real_ms();
  if (!(r == clock_seen)) {
    spdlog::warn("node {}: clock fault: rate {}, bumped {} ms in all", hex, r.rate,
                 r.bump_ns / 1'000'000);
    pclock.apply(r.rate, static_cast<std::uint64_t>(r.bump_ns / 1'000'000), real);
    clock_seen = r;
  }
  return pclock.at(real);
}

void node_runtime::impl::push(event e, bool droppable) {
  if (droppable && queued_frames.fetch_add(1) >= static_cast<std::int64_t>(kMaxQueuedEvents)) {
    --queued_frames;
    ++dropped_events;
    return;
  }
  actors::actor_ref to;
  {
    // Before the control actor runs (the control plane and discovery start first), events
    // wait here; its first turn takes them, in order, under the same lock.
    std::lock_guard lock(mu);
    if (stopping) {
      if (droppable) --queued_frames;
      return;
    }
    if (!actor_running) {
      early.push_back(node_event{std::move(e), droppable, 0});
      return;
    }
    to = control_actor;
  }
  // Between a failure of the control actor and its restart the send fails: the event is lost
  // and counted (the protocols retry).
  if (!actors->send(to, node_event{std::move(e), droppable, 0})) {
    if (droppable) --queued_frames;
    ++dropped_events;
  }
}

void node_runtime::impl::fail(std::string why) {
  spdlog::error("node {}: {}", hex, why);
  {
    std::lock_guard lock(mu);
    if (fatal.empty()) fatal = std::move(why);
    stopping = true;
  }
  failed = true;
  cv.notify_all();
}

bool node_runtime::impl::persist(const std::string& bytes) {
  auto w = write_durable(dir->path(), opt.election_state_file, bytes);
  if (!w) fail(fmt::format("cannot persist the election state: {}", w.error().describe()));
  return w.has_value();
}

void node_runtime::impl::serving_changed(serving_facts f) {
  if (engine)
    engine->set_plan(std::move(f.plan), std::move(f.live), std::move(f.endpoints),
                     std::move(f.peers));
}

void node_runtime::impl::refresh_caps(topology::capabilities& c) {
  // A model fetched whole from peers makes this peer a holder too (it serves the bytes on):
  // the leader plans over it even when the peers it fetched from are gone.
  if (engine) c.model_specs = engine->held_specs();
}

member_changed node_runtime::impl::changed_of(member_id id, member_status st,
                                              std::uint64_t incarnation, const std::string& address,
                                              bool initial) const {
  member_changed m;
  m.member = fmt::format("{:016x}", id);
  if (id == self) {
    m.node = hex;
  } else if (const auto* known = directory->find(id)) {
    m.node = known->hex;
  }
  m.status = std::string(to_string(st));
  m.incarnation = incarnation;
  m.address = address;
  m.initial = initial;
  return m;
}

void node_runtime::impl::deliver(const member_changed& m) {
  if (const auto gone = feed->deliver(m); gone > 0) {
    std::lock_guard lock(mu);
    member_subscriptions -= gone;
  }
}

void node_runtime::impl::on_subscribe(const ev_subscribe& e) {
  if (e.system == nullptr) {
    const auto n = feed->remove(e.who);
    std::lock_guard lock(mu);
    member_subscriptions -= n;
    return;
  }
  std::vector<member_changed> snapshot;
  snapshot.push_back(
      changed_of(self, member_status::alive, core->membership().incarnation(), self_address, true));
  for (const auto& [id, m] : core->membership().members())
    snapshot.push_back(changed_of(id, m.status, m.incarnation, m.address, true));
  if (!feed->add(*e.system, e.who, snapshot)) {
    std::lock_guard lock(mu);
    --member_subscriptions;
  }
}

void node_runtime::impl::bandwidth_round(std::uint64_t now) {
  for (auto& r : prober->take_results()) {
    if (r.mbps > 0) {
      core->set_bandwidth(r.peer, r.mbps, r.backend, r.rtt_us);
      next_bandwidth_ms[r.peer] = now + 30'000;
    } else {
      spdlog::debug("node {}: bandwidth probe to {:016x} failed: {}", hex, r.peer, r.error);
      next_bandwidth_ms[r.peer] = now + 10'000;
    }
  }
  if (prober->busy()) return;
  const auto live = core->live_members();
  std::erase_if(next_bandwidth_ms, [&](const auto& e) {
    return std::find(live.begin(), live.end(), e.first) == live.end();
  });
  for (member_id id : live) {
    const auto* caps_of = core->peer_caps(id);
    const auto* k = directory->find(id);
    auto& next = next_bandwidth_ms[id];
    if (caps_of == nullptr || k == nullptr || now < next) continue;
    next = now + 10'000;  // until the result says otherwise
    if (prober->start(id, k->hex, backend_kind_for(*caps_of))) return;
  }
}

void node_runtime::impl::on_message(ctl::inbound_message& m) {
  const auto now = now_ms();
  const member_id from = member_of(m.sender);
  const auto type = static_cast<runtime_msg>(m.type);
  if (core->on_message(from, m.sender, type, std::string_view(m.body.data(), m.body.size()), now))
    return;
  switch (type) {
    case runtime_msg::bulk_offer:
    case runtime_msg::bulk_answer: {
      auto b = unpack<bulk_setup_message>(std::string_view(m.body.data(), m.body.size()));
      if (!b || from == no_member) break;
      if (type == runtime_msg::bulk_offer) {
        if (core->is_member(from)) prober->on_offer(from, m.sender, *b);
      } else {
        prober->on_answer(from, *b);
      }
      return;
    }
    case runtime_msg::group_link:
      if (engine) engine->on_group_link(from, std::string_view(m.body.data(), m.body.size()));
      return;
    case runtime_msg::model_share:
      // Only members share model bytes (an offer names the fetcher by the link it came on).
      if (engine && from != no_member && core->is_member(from))
        engine->on_share(m.sender, std::string_view(m.body.data(), m.body.size()));
      return;
    case runtime_msg::status_request: {
      auto reply_to = unpack<std::string>(std::string_view(m.body.data(), m.body.size()));
      if (!reply_to) break;
      // A member asks over its own link (its dashboard): answer there. A status client is not
      // a member: add it as a control peer for the reply (it is dropped again when its link
      // goes down).
      if (from != no_member && core->is_member(from) && directory->linked(m.sender)) {
        // its link is ours already
      } else if (directory->link_endpoint(m.sender) == *reply_to) {
        // introduced itself already
      } else if (auto r = control->add_peer(m.sender, *reply_to); !r) {
        spdlog::warn("node {}: status client {}: {}", hex, m.sender, r.error().describe());
        return;
      }
      const std::string doc = status_json().dump();
      (void)control->send(m.sender, static_cast<std::uint16_t>(runtime_msg::status_reply),
                          bytes_of(pack(doc)));
      return;
    }
    case runtime_msg::status_reply: {
      // A member's answer to ask_cluster_status (nobody else gets our status requests).
      auto doc = unpack<std::string>(std::string_view(m.body.data(), m.body.size()));
      if (!doc || from == no_member || !core->is_member(from)) break;
      members_docs.on_answer(m.sender, std::move(*doc));
      return;
    }
    default:
      break;
  }
  ++undecodable;
}

void node_runtime::impl::handle(event& e) {
  if (stopped()) return;
  if (auto* m = std::get_if<ev_message>(&e)) {
    on_message(m->msg);
  } else if (auto* p = std::get_if<ev_peer>(&e)) {
    on_peer(p->ev);
  } else if (auto* h = std::get_if<ev_hint>(&e)) {
    on_hint(h->hint);
  } else if (auto* sub = std::get_if<ev_subscribe>(&e)) {
    on_subscribe(*sub);
  } else {
    core->leave(now_ms());
    std::lock_guard lock(mu);
    left = true;
    stopping = true;
    cv.notify_all();
  }
}

void node_runtime::impl::tick() {
  if (stopped()) return;
  fail_if_asked();
  const auto now = now_ms();
  core->tick(now);
  if (failed) return;
  bandwidth_round(now);
  ask_cluster_status();
  if (now >= next_snapshot_ms) {
    std::string doc = status_json().dump();
    std::lock_guard lock(snapshot_mu);
    snapshot = std::move(doc);
    next_snapshot_ms = now + kSnapshotMs;
  }
}

std::uint64_t node_runtime::impl::next_tick_in_ms() {
  const auto now = now_ms();
  const std::uint64_t wake = std::min(core->next_wake(), next_snapshot_ms);
  return wake <= now ? 0 : std::min<std::uint64_t>(real_wait_ms(wake - now), 100);
}

void node_runtime::impl::fail_if_asked() {
  std::uint64_t asked = 0;
  injector->update([&](const transport::faults::fault_policy& pol) {
    asked = pol.crashes_requested(hex, "control");
  });
  if (asked <= crash_requests_seen) return;
  crash_requests_seen = asked;
  throw std::runtime_error("tessera fault crash: the control actor fails on request");
}

void node_runtime::impl::remake_core() {
  core_options o = core_base;
  auto restored = read_election_state(dir->path() / opt.election_state_file);
  if (!restored) {
    fail(fmt::format("the restarted control actor cannot go on: {}", restored.error().describe()));
    return;
  }
  o.restored = *restored;
  o.incarnation = static_cast<std::uint64_t>(unix_ms());
  o.membership_seed ^= o.incarnation;
  o.election_seed ^= o.incarnation;
  o.caps = caps;
  auto c = control_core::create(std::move(o), *this);
  if (!c) {
    fail(fmt::format("cannot remake the control core: {}", c.error().describe()));
    return;
  }
  core = std::move(c).value();
  core->start(now_ms());
  for (const auto& [id, k] : directory->known())
    core->join(id, k.hex + "@" + k.endpoint, now_ms());
}

}  // namespace tessera::mesh::runtime
