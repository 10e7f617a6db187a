#include "mesh/sim/world.hpp"

#include <algorithm>

#include "actors/base/assert.hpp"

namespace tessera::mesh::sim {

namespace {
// The network actor's messages to itself: its timer fired (alarm), or events were queued (wake).
struct sim_alarm {
  TESSERA_MESSAGE("tessera.sim.alarm");
  std::uint8_t unused = 0;
  MSGPACK_DEFINE(unused);
};
struct sim_wake {
  TESSERA_MESSAGE("tessera.sim.wake");
  std::uint8_t unused = 0;
  MSGPACK_DEFINE(unused);
};
// One event for a node's actor: a message, or its timer (timer_gen != 0).
struct sim_event {
  TESSERA_MESSAGE("tessera.sim.event");
  std::uint64_t epoch = 0;
  std::uint64_t timer_gen = 0;
  envelope msg;
  MSGPACK_DEFINE(epoch, timer_gen, msg);
};
}  // namespace

/// Holds what is in flight (world::queue_) and hands each event to its node when it is due.
class network_actor final : public actors::actor {
 public:
  explicit network_actor(world& w) : world_(w) {}
  void on_start() override {
    on<sim_alarm>([this](sim_alarm&) {
      armed_.reset();
      world_.pump();
    });
    on<sim_wake>([this](sim_wake&) {
      world_.kicked_ = false;
      world_.pump();
    });
  }
  /// One actor timer, for the earliest event.
  void arm(std::uint64_t at_ms) {
    if (armed_ && armed_->first == at_ms) return;
    if (armed_) cancel_timer(armed_->second);
    const auto at = std::chrono::milliseconds(at_ms);
    const auto t = now().time_since_epoch();
    const auto delay = at > t ? at - t : actors::clock::duration(0);
    armed_.emplace(at_ms, after(delay, sim_alarm{}));
  }

 private:
  world& world_;
  std::optional<std::pair<std::uint64_t, actors::timer_id>> armed_;
};

/// Hosts one life of a node: runs its events one at a time.
class node_actor final : public actors::actor {
 public:
  node_actor(world& w, member_id id) : world_(w), id_(id) {}
  void on_start() override {
    on<sim_event>([this](sim_event& e) {
      world_.run_event(id_, e.epoch, e.timer_gen, e.timer_gen == 0 ? &e.msg : nullptr);
    });
  }

 private:
  world& world_;
  member_id id_;
};

namespace {
actors::config system_config(std::uint64_t seed) {
  actors::config c;
  c.mode = actors::run_mode::deterministic;
  c.seed = seed;
  // Every message in flight may come due at one instant (a paused node's backlog included).
  c.data_capacity = world::max_in_flight + world::max_paused_backlog + world::max_clogged;
  return c;
}
}  // namespace

std::uint64_t node_context::now_ms() const {
  return world_.local_time(self_, world_.now_ms());
}

std::uint64_t node_context::global_ms() const {
  return world_.now_ms();
}

void node_context::send(member_id to, std::uint8_t channel, bytes payload) {
  world_.send(self_, envelope{self_, to, channel, std::move(payload)});
}

void node_context::set_timer(std::optional<std::uint64_t> local_at_ms) {
  world_.set_timer(self_, local_at_ms);
}

bytes& node_context::durable() {
  return world_.at(self_).durable;
}

world::world(std::uint64_t seed, node_factory factory)
    : seed_(seed),
      rng_(seed),
      factory_(std::move(factory)),
      sys_(system_config(seed)),
      policy_(mix64(seed ^ 0x6661756c7473ULL)) {
  set_link_faults(link_faults{});
  auto net = std::make_unique<network_actor>(*this);
  net_actor_ = net.get();
  auto ref = sys_.spawn(std::move(net));
  TESSERA_ASSERT(ref.has_value(), "sim: cannot start the network actor: {}", ref.error().describe());
  net_ = *ref;
}

world::~world() {
  // The actors refer to this world: stop them before the slots go.
  sys_.shutdown(std::chrono::nanoseconds(0));
}

std::uint64_t world::now_ms() const {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(sys_.clock().now().time_since_epoch())
          .count());
}

void world::kick() {
  if (kicked_) return;
  kicked_ = true;
  auto r = sys_.send(net_, sim_wake{});
  TESSERA_ASSERT(r.has_value(), "sim: cannot wake the network actor: {}", r.error().describe());
}

world::slot& world::at(member_id id) {
  auto it = slots_.find(id);
  TESSERA_ASSERT(it != slots_.end(), "sim: unknown node {}", id);
  return it->second;
}

const world::slot& world::at(member_id id) const {
  auto it = slots_.find(id);
  TESSERA_ASSERT(it != slots_.end(), "sim: unknown node {}", id);
  return it->second;
}

void world::add_node(member_id id) {
  TESSERA_ASSERT(id != no_member && !slots_.contains(id), "sim: bad or duplicate node id {}", id);
  slots_.emplace(id, slot{});
  names_.emplace(id, name_of(id));
  ids_.push_back(id);
}

bool world::is_up(member_id id) const {
  return at(id).node != nullptr;
}
bool world::is_paused(member_id id) const {
  return at(id).paused;
}
sim_node* world::node(member_id id) const {
  return at(id).node.get();
}

void world::start(member_id id) {
  slot& s = at(id);
  if (s.node) return;
  s.epoch += 1;
  s.paused = false;
  s.backlog.clear();
  s.timer_pending = false;
  auto a = sys_.spawn(std::make_unique<node_actor>(*this, id));
  TESSERA_ASSERT(a.has_value(), "sim: cannot start node {}'s actor: {}", id, a.error().describe());
  s.actor = *a;
  s.node = factory_(id);
  node_context ctx(*this, id);
  s.node->on_start(ctx);
}

void world::crash(member_id id) {
  slot& s = at(id);
  // The actor stops at its next turn; anything it still holds belongs to an older epoch and is
  // dropped (counted) rather than run.
  if (s.actor) (void)sys_.stop(s.actor, {actors::exit_kind::killed, "crashed by the simulation"});
  s.actor = {};
  s.node.reset();
  s.epoch += 1;
  s.paused = false;
  s.backlog.clear();
  s.timer_pending = false;
  s.timer_gen += 1;
  s.timer_local.reset();
}

void world::pause(member_id id) {
  at(id).paused = true;
}

void world::resume(member_id id) {
  slot& s = at(id);
  if (!s.paused) return;
  s.paused = false;
  // Everything that arrived while stopped is handled now, in arrival order, and the late timer
  // before or after it, by the seed: on a real node the timer thread and the socket reader race
  // when SIGCONT comes, and timer-first is the order in which a node takes its own absence for
  // its peers' silence (membership's stall rule is what copes with it).
  const std::uint64_t now = now_ms();
  const bool timer_first = s.timer_pending && rng_.uniform(0, 2) == 0;
  if (timer_first) queue_.push(event{now, next_seq_++, id, s.epoch, s.timer_gen, nullptr});
  for (auto& e : s.backlog) {
    queue_.push(event{now, next_seq_++, id, s.epoch, 0, std::make_shared<envelope>(std::move(e))});
    ++in_flight_;
  }
  s.backlog.clear();
  if (s.timer_pending) {
    s.timer_pending = false;
    if (!timer_first) queue_.push(event{now, next_seq_++, id, s.epoch, s.timer_gen, nullptr});
  }
  kick();
}

void world::set_clock(member_id id, std::int64_t offset_ms, std::int32_t rate_ppm) {
  TESSERA_ASSERT(rate_ppm > -500'000 && offset_ms >= 0,
                 "sim: clock rate {} / offset {} out of range", rate_ppm, offset_ms);
  slot& s = at(id);
  // Keep the local clock monotonic across the change: shift the offset so local(now) does not
  // go back.
  const std::uint64_t before = local_time(id, now_ms());
  s.offset_ms = offset_ms;
  s.rate_ppm = rate_ppm;
  const std::uint64_t after = local_time(id, now_ms());
  if (after < before) s.offset_ms += static_cast<std::int64_t>(before - after);
}

void world::skew_clock(member_id id, std::int32_t rate_ppm, std::uint64_t bump_ms) {
  // `tessera fault clock` rates: 0.25x .. 4x.
  TESSERA_ASSERT(rate_ppm >= -750'000 && rate_ppm <= 3'000'000, "sim: clock rate {} out of range",
                 rate_ppm);
  slot& s = at(id);
  const std::uint64_t now = now_ms();
  const auto before = static_cast<std::int64_t>(local_time(id, now));
  const auto g = static_cast<std::int64_t>(now);
  s.rate_ppm = rate_ppm;
  // Continue from the time the clock shows (plus the bump) at the new rate.
  s.offset_ms = before + static_cast<std::int64_t>(bump_ms) - g - g * rate_ppm / 1'000'000;
  // The node's timer was set in local time: it is due at another global time now.
  if (s.node && s.timer_local) set_timer(id, s.timer_local);
}

std::uint64_t world::local_time(member_id id, std::uint64_t global_ms) const {
  const slot& s = at(id);
  const std::int64_t g = static_cast<std::int64_t>(global_ms);
  const std::int64_t local = s.offset_ms + g + g * s.rate_ppm / 1'000'000;
  return local < 0 ? 0 : static_cast<std::uint64_t>(local);
}

std::string world::name_of(member_id id) {
  return std::to_string(id);
}

result<void> world::apply_fault(const transport::faults::fault_command& command) {
  if (auto r = transport::faults::apply(policy_, command); !r) return r;
  // Clock rules as a node applies them to its protocol clock: the rate from now on, and the
  // bumps added since the last command (forward only).
  for (member_id id : ids_) {
    const auto* rule = policy_.clock_for(names_.at(id));
    const auto now = rule ? *rule : transport::faults::clock_rule{};
    auto& seen = clocks_applied_[id];
    if (now == seen) continue;
    const std::int64_t bump_ns = std::max<std::int64_t>(0, now.bump_ns - seen.bump_ns);
    skew_clock(id, static_cast<std::int32_t>((now.rate - 1.0) * 1e6),
               static_cast<std::uint64_t>(bump_ns / 1'000'000));
    seen = now;
  }
  return ok();
}

void world::set_link_faults(const link_faults& f) {
  using std::chrono::milliseconds;
  transport::faults::link_rule r;
  r.delay = milliseconds(f.delay_min_ms);
  r.jitter = milliseconds(f.delay_max_ms > f.delay_min_ms ? f.delay_max_ms - f.delay_min_ms : 0);
  r.drop = f.drop_ppm / 1e6;
  r.duplicate = f.duplicate_ppm / 1e6;
  auto ok = policy_.set_rule(transport::faults::any_node, transport::faults::any_node, r);
  TESSERA_ASSERT(ok.has_value(), "sim: bad link faults: {}", ok.error().describe());
}

void world::partition(const std::vector<std::vector<member_id>>& groups) {
  policy_.heal();  // replaces the partition in force (clogs and rules stay)
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (std::size_t j = i + 1; j < groups.size(); ++j) {
      std::vector<std::string> a, b;
      for (member_id x : groups[i])
        a.push_back(name_of(x));
      for (member_id y : groups[j])
        b.push_back(name_of(y));
      policy_.partition(a, b, /*two_way=*/true);
    }
  clean_groups_ = groups;
}

void world::block(member_id from, member_id to) {
  policy_.partition({name_of(from)}, {name_of(to)}, /*two_way=*/false);
  clean_groups_.clear();
}

void world::bridge(const std::vector<member_id>& a, member_id bridge_node,
                   const std::vector<member_id>& b) {
  policy_.heal();
  clean_groups_.clear();
  std::vector<std::string> sa, sb;
  for (member_id x : a)
    if (x != bridge_node) sa.push_back(name_of(x));
  for (member_id y : b)
    if (y != bridge_node) sb.push_back(name_of(y));
  policy_.partition(sa, sb, /*two_way=*/true);
}

void world::heal() {
  policy_.heal();
  clean_groups_.clear();
  while (!clogged_.empty())
    unclog(*clogged_.begin());
}

void world::clog(member_id id) {
  (void)at(id);
  clogged_.insert(id);
}

void world::unclog(member_id id) {
  if (clogged_.erase(id) == 0) return;
  // Release what no longer touches a clogged node; the rest waits for its other end.
  std::vector<event> still;
  for (event& e : held_) {
    if (clogged_.contains(e.msg->from) || clogged_.contains(e.msg->to)) {
      still.push_back(std::move(e));
      continue;
    }
    e.at_ms = arrival(*e.msg);
    e.seq = next_seq_++;
    queue_.push(std::move(e));
    ++in_flight_;
  }
  held_ = std::move(still);
  kick();
}

bool world::can_deliver(member_id from, member_id to) const {
  auto f = names_.find(from), t = names_.find(to);
  if (f == names_.end() || t == names_.end()) return true;
  return !policy_.is_cut(f->second, t->second);
}

void world::send(member_id from, envelope e) {
  ++counters_.sent;
  TESSERA_ASSERT(e.to != from, "sim: node {} sent to itself", from);
  if (!slots_.contains(e.to)) {
    ++counters_.dropped_down;
    return;
  }
  const auto d =
      policy_.decide(names_.at(from), names_.at(e.to), std::chrono::milliseconds(now_ms()));
  if (d.outcome == transport::faults::decision::fate::partitioned) {
    ++counters_.dropped_partition;
    return;
  }
  if (d.lost()) {
    ++counters_.dropped_random;
    return;
  }
  if (d.copies == 2) ++counters_.duplicated;
  auto shared = std::make_shared<envelope>(std::move(e));
  for (std::uint8_t c = 0; c < d.copies; ++c) {
    if (in_flight_ >= max_in_flight) {
      ++counters_.dropped_overflow;
      return;
    }
    // Whole milliseconds, rounded up: the policy's delay and jitter are finer than the clock.
    const auto at_ms = static_cast<std::uint64_t>((d.deliver_at[c].count() + 999'999) / 1'000'000);
    queue_.push(
        event{fifo_at(*shared, at_ms), next_seq_++, shared->to, at(shared->to).epoch, 0, shared});
    ++in_flight_;
  }
  kick();
}

std::uint64_t world::fifo_at(const envelope& e, std::uint64_t at_ms) {
  if (fifo_.contains(e.channel)) {
    // Same time as the previous one is enough: equal times are delivered in sequence order.
    auto& last = last_arrival_[{e.from, e.to, e.channel}];
    at_ms = std::max(at_ms, last);
    last = at_ms;
  }
  return at_ms;
}

std::uint64_t world::arrival(const envelope& e) {
  // A message released by a clog: a fresh link delay under its pair's rule (never lost: a clog
  // holds, it does not drop).
  const auto r = policy_.rule_for(names_.at(e.from), names_.at(e.to));
  const auto delay_ms = static_cast<std::uint64_t>(r.delay.count() / 1'000'000);
  const auto jitter_ms = static_cast<std::uint64_t>(r.jitter.count() / 1'000'000);
  return fifo_at(e, now_ms() + delay_ms + rng_.uniform(0, jitter_ms + 1));
}

void world::set_timer(member_id id, std::optional<std::uint64_t> local_at_ms) {
  slot& s = at(id);
  s.timer_gen += 1;
  s.timer_pending = false;
  s.timer_local = local_at_ms;
  if (!local_at_ms) return;
  // Invert the node's clock, rounding up so the node's local time has reached its deadline.
  const double scale = 1'000'000.0 / (1'000'000.0 + s.rate_ppm);
  const double g = (static_cast<double>(*local_at_ms) - static_cast<double>(s.offset_ms)) * scale;
  const std::uint64_t now = now_ms();
  std::uint64_t at_ms = g <= static_cast<double>(now) ? now : static_cast<std::uint64_t>(g);
  while (local_time(id, at_ms) < *local_at_ms)
    ++at_ms;
  queue_.push(event{at_ms, next_seq_++, id, s.epoch, s.timer_gen, nullptr});
  kick();
}

void world::hand_to_node(slot& s, std::uint64_t timer_gen, const envelope* msg) {
  sim_event ev;
  ev.epoch = s.epoch;
  ev.timer_gen = timer_gen;
  if (msg != nullptr) ev.msg = *msg;
  // The node's mailbox is bounded like everything else (beyond: lost and counted); its bound is
  // above everything that can be in flight, so this does not happen in practice.
  if (auto r = sys_.send(s.actor, std::move(ev)); !r && msg != nullptr) ++counters_.dropped_overflow;
}

void world::run_event(member_id id, std::uint64_t epoch, std::uint64_t timer_gen, envelope* msg) {
  slot& s = at(id);
  if (epoch != s.epoch || !s.node) {
    if (msg != nullptr) ++counters_.dropped_down;
    return;
  }
  node_context ctx(*this, id);
  if (msg != nullptr) {
    ++counters_.delivered;
    s.node->on_message(ctx, *msg);
  } else {
    if (timer_gen != s.timer_gen) return;  // re-armed since it was handed over
    s.timer_local.reset();
    s.node->on_timer(ctx);
  }
  if (observer_) observer_();
}

void world::pump() {
  const std::uint64_t now = now_ms();
  while (!queue_.empty() && queue_.top().at_ms <= now) {
    event e = queue_.top();
    queue_.pop();
    ++counters_.events;
    dispatch(e);
  }
  if (!queue_.empty()) net_actor_->arm(queue_.top().at_ms);
}

void world::dispatch(const event& e) {
  slot& s = at(e.node);
  if (e.msg) {
    --in_flight_;
    if (e.epoch != s.epoch || !s.node) {
      ++counters_.dropped_down;
      return;
    }
    if (!can_deliver(e.msg->from, e.msg->to)) {
      ++counters_.dropped_partition;
      return;
    }
    if (clogged_.contains(e.msg->from) || clogged_.contains(e.msg->to)) {
      if (held_.size() >= max_clogged) {
        ++counters_.dropped_overflow;
      } else {
        ++counters_.clogged;
        held_.push_back(e);
      }
      return;
    }
    if (s.paused) {
      if (s.backlog.size() >= max_paused_backlog) {
        ++counters_.dropped_overflow;
      } else {
        s.backlog.push_back(*e.msg);
      }
      return;
    }
    hand_to_node(s, 0, e.msg.get());
    return;
  }
  if (e.epoch != s.epoch || e.timer_gen != s.timer_gen || !s.node) return;
  if (s.paused) {
    s.timer_pending = true;
    return;
  }
  hand_to_node(s, e.timer_gen, nullptr);
}

void world::invoke(member_id id, const std::function<void(sim_node&, node_context&)>& fn) {
  slot& s = at(id);
  if (!s.node) return;
  node_context ctx(*this, id);
  fn(*s.node, ctx);
  if (observer_) observer_();
}

void world::run_until(std::uint64_t t_ms) {
  const std::uint64_t now = now_ms();
  sys_.advance(std::chrono::milliseconds(t_ms > now ? t_ms - now : 0));
}

}  // namespace tessera::mesh::sim
