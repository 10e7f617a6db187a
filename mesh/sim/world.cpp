#include "mesh/sim/world.hpp"

#include <algorithm>

#include "actors/base/assert.hpp"

namespace tessera::mesh::sim {

std::uint64_t node_context::now_ms() const {
  return world_.local_time(self_, world_.now_ms());
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
    : seed_(seed), rng_(seed), factory_(std::move(factory)) {}

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
  s.node = factory_(id);
  node_context ctx(*this, id);
  s.node->on_start(ctx);
}

void world::crash(member_id id) {
  slot& s = at(id);
  s.node.reset();
  s.epoch += 1;
  s.paused = false;
  s.backlog.clear();
  s.timer_pending = false;
  s.timer_gen += 1;
}

void world::pause(member_id id) {
  at(id).paused = true;
}

void world::resume(member_id id) {
  slot& s = at(id);
  if (!s.paused) return;
  s.paused = false;
  // Everything that arrived while stopped is handled now, in arrival order, then the late timer.
  for (auto& e : s.backlog) {
    queue_.push(
        event{now_ms_, next_seq_++, id, s.epoch, 0, std::make_shared<envelope>(std::move(e))});
    ++in_flight_;
  }
  s.backlog.clear();
  if (s.timer_pending) {
    s.timer_pending = false;
    queue_.push(event{now_ms_, next_seq_++, id, s.epoch, s.timer_gen, nullptr});
  }
}

void world::set_clock(member_id id, std::int64_t offset_ms, std::int32_t rate_ppm) {
  TESSERA_ASSERT(rate_ppm > -500'000 && offset_ms >= 0,
                 "sim: clock rate {} / offset {} out of range", rate_ppm, offset_ms);
  slot& s = at(id);
  // Keep the local clock monotonic across the change: shift the offset so local(now) does not
  // go back.
  const std::uint64_t before = local_time(id, now_ms_);
  s.offset_ms = offset_ms;
  s.rate_ppm = rate_ppm;
  const std::uint64_t after = local_time(id, now_ms_);
  if (after < before) s.offset_ms += static_cast<std::int64_t>(before - after);
}

std::uint64_t world::local_time(member_id id, std::uint64_t global_ms) const {
  const slot& s = at(id);
  const std::int64_t g = static_cast<std::int64_t>(global_ms);
  const std::int64_t local = s.offset_ms + g + g * s.rate_ppm / 1'000'000;
  return local < 0 ? 0 : static_cast<std::uint64_t>(local);
}

void world::partition(const std::vector<std::vector<member_id>>& groups) {
  blocked_.clear();  // replaces the partition in force (clogs stay)
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (std::size_t j = 0; j < groups.size(); ++j)
      if (i != j)
        for (member_id a : groups[i])
          for (member_id b : groups[j])
            blocked_.insert({a, b});
  clean_groups_ = groups;
}

void world::block(member_id from, member_id to) {
  blocked_.insert({from, to});
  clean_groups_.clear();
}

void world::bridge(const std::vector<member_id>& a, member_id bridge_node,
                   const std::vector<member_id>& b) {
  blocked_.clear();
  clean_groups_.clear();
  for (member_id x : a)
    for (member_id y : b) {
      if (x == bridge_node || y == bridge_node) continue;
      blocked_.insert({x, y});
      blocked_.insert({y, x});
    }
}

void world::heal() {
  blocked_.clear();
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
}

bool world::can_deliver(member_id from, member_id to) const {
  return !blocked_.contains({from, to});
}

void world::send(member_id from, envelope e) {
  ++counters_.sent;
  TESSERA_ASSERT(e.to != from, "sim: node {} sent to itself", from);
  if (!slots_.contains(e.to)) {
    ++counters_.dropped_down;
    return;
  }
  if (rng_.chance_ppm(faults_.drop_ppm)) {
    ++counters_.dropped_random;
    return;
  }
  const int copies = rng_.chance_ppm(faults_.duplicate_ppm) ? 2 : 1;
  if (copies == 2) ++counters_.duplicated;
  auto shared = std::make_shared<envelope>(std::move(e));
  for (int c = 0; c < copies; ++c) {
    if (in_flight_ >= max_in_flight) {
      ++counters_.dropped_overflow;
      return;
    }
    queue_.push(event{arrival(*shared), next_seq_++, shared->to, at(shared->to).epoch, 0, shared});
    ++in_flight_;
  }
}

std::uint64_t world::arrival(const envelope& e) {
  const std::uint64_t delay =
      rng_.uniform(faults_.delay_min_ms, std::uint64_t{faults_.delay_max_ms} + 1);
  std::uint64_t at_ms = now_ms_ + delay;
  if (fifo_.contains(e.channel)) {
    // Same time as the previous one is enough: equal times are delivered in sequence order.
    auto& last = last_arrival_[{e.from, e.to, e.channel}];
    at_ms = std::max(at_ms, last);
    last = at_ms;
  }
  return at_ms;
}

void world::set_timer(member_id id, std::optional<std::uint64_t> local_at_ms) {
  slot& s = at(id);
  s.timer_gen += 1;
  s.timer_pending = false;
  if (!local_at_ms) return;
  // Invert the node's clock, rounding up so the node's local time has reached its deadline.
  const double scale = 1'000'000.0 / (1'000'000.0 + s.rate_ppm);
  const double g = (static_cast<double>(*local_at_ms) - static_cast<double>(s.offset_ms)) * scale;
  std::uint64_t at_ms = g <= static_cast<double>(now_ms_) ? now_ms_ : static_cast<std::uint64_t>(g);
  while (local_time(id, at_ms) < *local_at_ms)
    ++at_ms;
  queue_.push(event{at_ms, next_seq_++, id, s.epoch, s.timer_gen, nullptr});
}

void world::deliver(slot& s, member_id id, const envelope& e) {
  ++counters_.delivered;
  node_context ctx(*this, id);
  s.node->on_message(ctx, e);
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
    deliver(s, e.node, *e.msg);
    return;
  }
  if (e.epoch != s.epoch || e.timer_gen != s.timer_gen || !s.node) return;
  if (s.paused) {
    s.timer_pending = true;
    return;
  }
  node_context ctx(*this, e.node);
  s.node->on_timer(ctx);
}

void world::invoke(member_id id, const std::function<void(sim_node&, node_context&)>& fn) {
  slot& s = at(id);
  if (!s.node) return;
  node_context ctx(*this, id);
  fn(*s.node, ctx);
  if (observer_) observer_();
}

void world::run_until(std::uint64_t t_ms) {
  while (!queue_.empty() && queue_.top().at_ms <= t_ms) {
    event e = queue_.top();
    queue_.pop();
    TESSERA_ASSERT(e.at_ms >= now_ms_, "sim: time went back ({} < {})", e.at_ms, now_ms_);
    now_ms_ = e.at_ms;
    ++counters_.events;
    dispatch(e);
    if (observer_) observer_();
  }
  now_ms_ = std::max(now_ms_, t_ms);
}

}  // namespace tessera::mesh::sim
