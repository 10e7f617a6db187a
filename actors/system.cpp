#include "actors/system.hpp"

#include "actors/base/log.hpp"

#include <thread>

#include "actors/actor_cell.hpp"

namespace tessera::actors {
namespace {
std::unique_ptr<clock> make_clock(run_mode mode) {
  if (mode == run_mode::deterministic) return std::make_unique<virtual_clock>();
  return std::make_unique<real_clock>();
}
bool user_kind(message_kind k) {
  return k == message_kind::message || k == message_kind::request || k == message_kind::timer;
}
}  // namespace

actor_system::actor_system(config cfg)
    : config_(std::move(cfg)), mode_(config_.mode), node_(config_.node), rng_(config_.seed),
      clock_(make_clock(mode_)), timers_(*clock_, mode_ == run_mode::threaded) {
  TESSERA_ASSERT(config_.max_batch > 0 && config_.data_capacity > 0 &&
                     config_.control_capacity > 0,
                 "actor_system config: batch and mailbox bounds must be positive");
  if (mode_ == run_mode::deterministic) {
    virtual_clock_ = static_cast<virtual_clock*>(clock_.get());
    auto det = std::make_unique<deterministic_scheduler>(rng_);
    det_ = det.get();
    scheduler_ = std::move(det);
  } else {
    unsigned workers = config_.workers != 0 ? config_.workers : std::thread::hardware_concurrency();
    auto pool = std::make_unique<thread_pool_scheduler>(workers == 0 ? 1 : workers,
                                                        config_.max_batch, config_.spin);
    pool_ = pool.get();
    scheduler_ = std::move(pool);
  }
}

actor_system::~actor_system() { shutdown(); }

bool actor_system::on_worker_thread() const noexcept {
  return pool_ != nullptr && pool_->on_worker_thread();
}

result<actor_ref> actor_system::spawn(std::unique_ptr<actor> a, spawn_options opts) {
  TESSERA_ASSERT(a != nullptr, "spawn of a null actor");
  if (!accepting_.load()) return error{errc::closed, "spawn refused: actor system shutting down"};
  actor_id id = next_id_.fetch_add(1, std::memory_order_relaxed);
  actor* behaviour = a.get();
  auto* cell = new actor_cell(*this, id, std::move(a),
                              opts.data_capacity ? opts.data_capacity : config_.data_capacity,
                              opts.control_capacity ? opts.control_capacity
                                                    : config_.control_capacity,
                              opts.worker, opts.parent);
  cell_ptr holder(cell);
  actor_ref ref(node_, id, holder);
  behaviour->sys_ = this;
  behaviour->self_ = ref;
  behaviour->rng_ = actors::rng(config_.seed ^ (id * 0x9E3779B97F4A7C15ull));
  if (!opts.name.empty()) {
    if (auto r = names_.add(opts.name, ref, opts.replace_name); !r) {
      behaviour->self_ = actor_ref();  // break the cycle: the cell dies with `holder`
      return std::move(r).error();
    }
  }
  {
    std::lock_guard lock(table_mutex_);
    table_.emplace(id, holder);
  }
  cell->start();
  return ref;
}

std::vector<actor_info> actor_system::named_actors() const {
  std::vector<actor_info> out;
  for (auto& [name, ref] : names_.entries()) {
    cell_ptr cell = find_cell(ref.id());
    if (!cell || cell->stopped()) continue;
    out.push_back(actor_info{name, ref.id(), cell->queued(), cell->handled()});
  }
  return out;
}

cell_ptr actor_system::find_cell(actor_id id) const {
  std::lock_guard lock(table_mutex_);
  auto it = table_.find(id);
  return it == table_.end() ? cell_ptr() : it->second;
}

result<void> actor_system::post(const actor_ref& to, message_node* node) {
  std::unique_ptr<message_node> owned(node);
  if (!to.valid()) return error{errc::invalid_argument, "send to an invalid actor_ref"};
  if (user_kind(node->kind) && !accepting_.load(std::memory_order_relaxed)) {
    return make_error(errc::closed, "{} to {} refused: actor system shutting down",
                      node->type_name(), to);
  }
  if (to.node() != node_) return route_remote(to, std::move(owned));
  cell_ptr resolved;
  actor_cell* cell = to.cell();
  if (cell == nullptr) {
    resolved = find_cell(to.id());
    if (!resolved) return make_error(errc::closed, "{} is not alive", to);
    cell = resolved.get();
  }
  bool bypass = node->kind == message_kind::response || node->kind == message_kind::error_response;
  auto r = cell->enqueue(node, bypass);
  if (r) {
    owned.release();
    return r;
  }
  if (r.error().code == errc::overloaded && node->lane_ == lane::control) {
    counters_.control_overflow.fetch_add(1, std::memory_order_relaxed);
    SPDLOG_WARN("{}: control message {} refused: {}", to, node->type_name(), r.error().message);
  }
  return make_error(r.error().code, "{} to {}: {}", node->type_name(), to, r.error().message);
}

result<void> actor_system::route_remote(const actor_ref& to, std::unique_ptr<message_node> node) {
  if (!user_kind(node->kind) && node->kind != message_kind::response &&
      node->kind != message_kind::error_response) {
    return make_error(errc::unsupported, "{} to {}: node-local message kinds do not cross nodes",
                      node->type_name(), to);
  }
  std::shared_ptr<remote_router> router;
  {
    std::lock_guard lock(router_mutex_);
    router = router_;
  }
  if (!router) return make_error(errc::not_found, "no route to node {} (no transport)", to.node());
  envelope env;
  env.sender = actor_ref(node->sender.node(), node->sender.id());
  env.receiver = actor_ref(to.node(), to.id());
  env.type_id = node->type_id;
  env.request_id = node->request_id;
  env.kind = node->kind == message_kind::timer ? message_kind::message : node->kind;
  env.lane_ = node->lane_;
  try {
    env.body = node->encode();
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, "{} to {}: msgpack encoding failed: {}",
                      node->type_name(), to, e.what());
  }
  if (env.body.size() > max_envelope_body_bytes) {
    return make_error(errc::invalid_argument, "{} to {}: body of {} bytes exceeds {} bytes",
                      node->type_name(), to, env.body.size(), max_envelope_body_bytes);
  }
  return router->route(std::move(env));
}

void actor_system::set_router(std::shared_ptr<remote_router> router) {
  std::lock_guard lock(router_mutex_);
  router_ = std::move(router);
}

void actor_system::reject_remote_request(const envelope& env, const error& why) {
  counters_.rejected_envelopes.fetch_add(1, std::memory_order_relaxed);
  SPDLOG_WARN("node {}: rejected envelope from {}: {}", node_, env.sender, why.message);
  if (env.kind != message_kind::request || !env.sender.valid() || env.sender.node() == node_) {
    return;
  }
  auto* reply = new typed_node<error_reply>(
      error_reply{static_cast<std::uint16_t>(why.code), why.message});
  reply->kind = message_kind::error_response;
  reply->request_id = env.request_id;
  reply->sender = actor_ref(node_, env.receiver.id());
  (void)post(env.sender, reply);
}

result<void> actor_system::deliver_remote(envelope env) {
  auto reject = [&](error why) -> result<void> {
    reject_remote_request(env, why);
    return why;
  };
  if (env.version != envelope_version) {
    return reject(make_error(errc::unsupported, "envelope version {} (this node speaks {})",
                             env.version, envelope_version));
  }
  if (env.receiver.node() != node_) {
    return reject(make_error(errc::invalid_argument, "envelope for node {} delivered to node {}",
                             env.receiver.node(), node_));
  }
  if (env.kind != message_kind::message && env.kind != message_kind::request &&
      env.kind != message_kind::response && env.kind != message_kind::error_response) {
    return reject(make_error(errc::protocol, "envelope kind {} is node-local",
                             static_cast<int>(env.kind)));
  }
  if (env.body.size() > max_envelope_body_bytes) {
    return reject(make_error(errc::invalid_argument, "envelope body of {} bytes exceeds {}",
                             env.body.size(), max_envelope_body_bytes));
  }
  if (!accepting_.load() && (env.kind == message_kind::message || env.kind == message_kind::request)) {
    return reject(make_error(errc::closed, "node {} is shutting down", node_));
  }
  cell_ptr cell = find_cell(env.receiver.id());
  if (!cell) return reject(make_error(errc::not_found, "no actor {} on node {}", env.receiver.id(), node_));
  auto* node = new bytes_node(std::move(env.body));
  node->type_id = env.type_id;
  node->kind = env.kind;
  node->lane_ = env.lane_ == lane::control ? lane::control : lane::data;
  node->request_id = env.request_id;
  node->sender = env.sender;
  bool bypass = env.kind == message_kind::response || env.kind == message_kind::error_response;
  auto r = cell->enqueue(node, bypass);
  if (!r) {
    delete node;
    return reject(make_error(r.error().code, "actor {}: {}", env.receiver.id(), r.error().message));
  }
  return ok();
}

result<void> actor_system::stop(const actor_ref& target, exit_reason reason) {
  auto* node = new typed_node<stop_request>(stop_request{std::move(reason)});
  node->kind = message_kind::stop;
  node->lane_ = lane::control;
  return post(target, node);
}

result<void> actor_system::monitor(const actor_ref& target, const actor_ref& watcher) {
  if (target.node() != node_) {
    std::shared_ptr<remote_router> router;
    {
      std::lock_guard lock(router_mutex_);
      router = router_;
    }
    if (!router) {
      return make_error(errc::unsupported, "monitoring {} on another node needs the transport",
                        target);
    }
    return router->monitor(actor_ref(target.node(), target.id()),
                           actor_ref(watcher.node(), watcher.id()));
  }
  cell_ptr cell = target.cell() != nullptr ? cell_ptr(target.cell()) : find_cell(target.id());
  exit_reason reason{exit_kind::unknown, "no such actor"};
  if (cell && cell->add_watcher(watcher, reason)) return ok();
  auto* node = new typed_node<down>(down{actor_ref(target.node(), target.id()), reason});
  node->lane_ = lane::control;
  return post(watcher, node);
}

void actor_system::cell_stopped(actor_cell& cell, const actor_ref& self, const exit_reason& reason,
                                std::vector<actor_ref> watchers, const actor_ref& parent) {
  names_.remove_actor(cell.id());
  actor_ref plain(self.node(), self.id());
  for (const auto& w : watchers) {
    auto* node = new typed_node<down>(down{plain, reason});
    node->lane_ = lane::control;
    node->sender = plain;
    (void)post(w, node);
  }
  if (parent.valid()) {
    auto* node = new typed_node<child_exit>(child_exit{plain, reason});
    node->lane_ = lane::control;
    node->sender = plain;
    (void)post(parent, node);
  }
  cell_ptr keep;  // released after the lock: the last ref may delete the cell
  {
    std::lock_guard lock(table_mutex_);
    auto it = table_.find(cell.id());
    if (it != table_.end()) {
      keep = std::move(it->second);
      table_.erase(it);
    }
  }
  table_cv_.notify_all();
}

result<void> actor_system::register_name(std::string_view name, const actor_ref& ref) {
  if (ref.node() == node_ && !find_cell(ref.id())) {
    return make_error(errc::closed, "name '{}': {} is not alive", name, ref);
  }
  return names_.add(name, ref);
}

result<actor_ref> actor_system::lookup(std::string_view name) const { return names_.lookup(name); }

bool actor_system::unregister_name(std::string_view name) { return names_.remove(name); }

std::size_t actor_system::run_until_idle(std::size_t max_turns) {
  TESSERA_ASSERT(det_ != nullptr, "run_until_idle() is for deterministic mode");
  std::size_t turns = 0;
  while (turns < max_turns && det_->run_one()) ++turns;
  return turns;
}

void actor_system::advance(clock::duration d) {
  TESSERA_ASSERT(det_ != nullptr, "advance() is for deterministic mode");
  auto target = clock_->now() + d;
  run_until_idle();
  while (auto due = timers_.next_due()) {
    if (*due > target) break;
    virtual_clock_->advance_to(*due);
    timers_.fire_due(*due);
    run_until_idle();
  }
  virtual_clock_->advance_to(target);
  run_until_idle();
}

void actor_system::run_until(const std::function<bool()>& done) {
  run_until_idle();
  while (!done()) {
    auto due = timers_.next_due();
    if (!due) break;
    virtual_clock_->advance_to(*due);
    timers_.fire_due(*due);
    run_until_idle();
  }
}

bool actor_system::quiescent() const {
  std::lock_guard lock(table_mutex_);
  for (const auto& [id, cell] : table_) {
    if (!cell->quiescent()) return false;
  }
  return true;
}

void actor_system::shutdown(clock::duration drain) {
  TESSERA_ASSERT(!on_worker_thread(), "shutdown() from an actor would join its own worker");
  if (shut_down_.exchange(true)) return;
  accepting_.store(false);
  // 1. Drain: queued messages run to completion (responses may still flow) for at most `drain`.
  if (det_ != nullptr) {
    run_until_idle();
  } else {
    auto deadline = std::chrono::steady_clock::now() + drain;
    while (!quiescent() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // 2. Stop every actor; each fails its pending requests with errc::closed and notifies monitors.
  //    Repeat: a supervisor may have spawned a child just before spawning was refused.
  for (int round = 0; round < 100; ++round) {
    std::vector<actor_ref> live;
    {
      std::lock_guard lock(table_mutex_);
      if (table_.empty()) break;
      for (const auto& [id, cell] : table_) live.emplace_back(node_, id, cell);
    }
    for (const auto& ref : live) (void)stop(ref, exit_reason{exit_kind::shutdown, "actor system shutting down"});
    if (det_ != nullptr) {
      run_until_idle();
    } else {
      std::unique_lock lock(table_mutex_);
      table_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return table_.empty(); });
    }
  }
  {
    std::lock_guard lock(table_mutex_);
    if (!table_.empty()) {
      SPDLOG_ERROR("node {}: {} actors did not stop during shutdown", node_, table_.size());
    }
  }
  // 3. Join.
  timers_.stop();
  scheduler_->stop();
  std::lock_guard lock(table_mutex_);
  table_.clear();
}

system_stats actor_system::stats() const noexcept {
  system_stats s;
  s.late_replies = counters_.late_replies.load();
  s.rejected_envelopes = counters_.rejected_envelopes.load();
  s.unhandled = counters_.unhandled.load();
  s.dropped_on_stop = counters_.dropped_on_stop.load();
  s.control_overflow = counters_.control_overflow.load();
  s.handler_failures = counters_.handler_failures.load();
  s.cancelled_timer_drops = counters_.cancelled_timer_drops.load();
  return s;
}

std::size_t actor_system::live_actors() const {
  std::lock_guard lock(table_mutex_);
  return table_.size();
}

}  // namespace tessera::actors
