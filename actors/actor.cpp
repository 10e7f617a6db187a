#include "actors/actor.hpp"

#include "actors/actor_cell.hpp"
#include "actors/base/log.hpp"

#include "actors/system.hpp"

namespace tessera::actors {

std::string_view to_string(exit_kind kind) noexcept {
  switch (kind) {
    case exit_kind::normal: return "normal";
    case exit_kind::failed: return "failed";
    case exit_kind::shutdown: return "shutdown";
    case exit_kind::killed: return "killed";
    case exit_kind::unknown: return "unknown";
  }
  return "unknown";
}

std::string exit_reason::describe() const {
  return detail.empty() ? std::string(to_string(kind))
                        : fmt::format("{}: {}", to_string(kind), detail);
}

namespace detail {
result<void> post_response(actor_system* sys, const actor_ref& to, std::uint64_t request_id,
                           message_node* node) {
  if (node->kind != message_kind::error_response) node->kind = message_kind::response;
  node->request_id = request_id;
  if (!to.valid()) {
    delete node;
    return error{errc::invalid_argument, "response to a request without a sender"};
  }
  return sys->post(to, node);
}
}  // namespace detail

void actor::add_handler(std::uint32_t type_id, std::string_view type_name, handler_fn fn) {
  for (auto& h : handlers_) {
    if (h.type_id == type_id) {
      TESSERA_ASSERT(h.type_name == type_name, "type id {:#x} of {} collides with {}", type_id,
                     type_name, h.type_name);
      h.fn = std::move(fn);
      return;
    }
  }
  handlers_.push_back(handler_entry{type_id, type_name, std::move(fn)});
}

result<void> actor::post(const actor_ref& to, message_node* node) {
  node->sender = lend_self();
  return sys_->post(to, node);
}

namespace {
// A batch is small next to the count's range and large next to a turn's usual sends.
constexpr std::uint32_t self_credit_batch = 256;
}  // namespace

actor_ref actor::lend_self() noexcept {
  actor_cell* cell = self_.cell();
  if (cell == nullptr) return self_;
  if (self_credit_ == 0) {
    cell->refs.fetch_add(self_credit_batch, std::memory_order_relaxed);
    self_credit_ = self_credit_batch;
  }
  --self_credit_;
  return actor_ref(self_.node(), self_.id(), cell_ptr(cell, /*add_ref=*/false));
}

void actor::return_self_credit() noexcept {
  if (self_credit_ == 0) return;
  // Never the last count: self_ itself holds one until the behaviour is destroyed.
  self_.cell()->refs.fetch_sub(std::exchange(self_credit_, 0), std::memory_order_relaxed);
}

result<void> actor::send_request(const actor_ref& to, std::unique_ptr<message_node> node,
                                 clock::duration timeout, request_continuation cont) {
  if (stopping_) return make_error(errc::closed, "{} is stopping", self_);
  if (pending_.size() >= sys_->config_.max_pending_requests) {
    return make_error(errc::overloaded, "{}: {} requests already pending", self_,
                      pending_.size());
  }
  std::uint64_t id = sys_->next_request_id_.fetch_add(1, std::memory_order_relaxed);
  std::string_view type_name = node->type_name();
  node->kind = message_kind::request;
  node->request_id = id;
  TESSERA_TRY(post(to, node.release()));
  // The deadline is a control-lane message to ourselves, so timeouts and replies are handled in
  // one order on one thread: whichever comes first wins, the other is dropped (and counted).
  actor_ref target = self_;
  actor_system* sys = sys_;
  timer_id timer = sys_->timers_.schedule(sys_->clock().now() + timeout, clock::duration::zero(),
                                          [sys, target, id](timer_id) {
                                            auto* n = new typed_node<stop_request>({});
                                            n->kind = message_kind::request_timeout;
                                            n->lane_ = lane::control;
                                            n->request_id = id;
                                            (void)sys->post(target, n);
                                          });
  auto wrapped = [cont = std::move(cont), type_name, to, timeout](message_node* n,
                                                                   const error* e) mutable {
    if (e != nullptr && e->code == errc::timeout) {
      error detailed = make_error(
          errc::timeout, "request {} to {} got no answer within {} ms", type_name, to,
          std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
      cont(nullptr, &detailed);
      return;
    }
    cont(n, e);
  };
  pending_.emplace(id, pending_request{timer, std::move(wrapped)});
  sys_->pending_count_.fetch_add(1, std::memory_order_relaxed);
  return ok();
}

timer_id actor::start_timer_node(clock::duration delay, bool periodic,
                                 std::function<message_node*()> make) {
  actor_ref target = self_;
  actor_system* sys = sys_;
  // The timer service hands the closure its id: a timer due at once can fire before schedule()
  // returns, and a message carrying no id would be dropped as a cancelled timer's.
  timer_id id = sys_->timers_.schedule(
      sys_->clock().now() + delay, periodic ? delay : clock::duration::zero(),
      [sys, target, make = std::move(make)](timer_id fired) {
        message_node* n = make();
        n->kind = message_kind::timer;
        n->lane_ = lane::control;
        n->request_id = fired;
        if (auto r = sys->post(target, n); !r && r.error().code == errc::overloaded) {
          SPDLOG_WARN("timer message for {} refused: {}", target, r.error().message);
        }
      });
  timers_.emplace(id, periodic);
  return id;
}

bool actor::cancel_timer(timer_id id) {
  if (timers_.erase(id) == 0) return false;
  sys_->timers_.cancel(id);
  return true;
}

result<void> actor::monitor(const actor_ref& target) { return sys_->monitor(target, self_); }

void actor::quit(exit_reason reason) {
  if (quitting_) return;  // the first reason wins
  quitting_ = true;
  quit_reason_ = std::move(reason);
}

clock::time_point actor::now() const { return sys_->clock().now(); }

void actor::reply_error(message_node& request, const error& err) {
  if (request.kind != message_kind::request) return;
  auto* node = new typed_node<error_reply>(
      error_reply{static_cast<std::uint16_t>(err.code), err.message});
  node->kind = message_kind::error_response;
  (void)detail::post_response(sys_, request.sender, request.request_id, node);
}

void actor::after_void_handler(message_node& n) {
  if (n.kind == message_kind::request && !current_deferred_) {
    reply_error(n, make_error(errc::unsupported, "{}: the handler of {} returns no reply", self_,
                              n.type_name()));
  }
}

void actor::reject_body(message_node& n, const error& err) {
  sys_->counters_.rejected_envelopes.fetch_add(1, std::memory_order_relaxed);
  SPDLOG_WARN("{}: rejected message from {}: {}", self_, n.sender, err.message);
  reply_error(n, err);
}

void actor::dispatch(message_node& n) {
  switch (n.kind) {
    case message_kind::response:
    case message_kind::error_response: {
      auto it = pending_.find(n.request_id);
      if (it == pending_.end()) {
        // Timed out (or this actor failed it) earlier: the answer is late. Drop and count.
        sys_->counters_.late_replies.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      pending_request p = std::move(it->second);
      pending_.erase(it);
      sys_->pending_count_.fetch_sub(1, std::memory_order_relaxed);
      sys_->timers_.cancel(p.timer);
      p.cont(&n, nullptr);
      return;
    }
    case message_kind::request_timeout: {
      auto it = pending_.find(n.request_id);
      if (it == pending_.end()) return;  // the answer won the race
      pending_request p = std::move(it->second);
      pending_.erase(it);
      sys_->pending_count_.fetch_sub(1, std::memory_order_relaxed);
      error e{errc::timeout, "deadline passed"};
      p.cont(nullptr, &e);
      return;
    }
    case message_kind::timer: {
      auto it = timers_.find(n.request_id);
      if (it == timers_.end()) {
        sys_->counters_.cancelled_timer_drops.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (!it->second) timers_.erase(it);
      dispatch_user(n);
      return;
    }
    case message_kind::stop: {
      auto* req = static_cast<stop_request*>(n.payload());
      quit(req != nullptr ? req->reason : exit_reason{exit_kind::killed, "stopped"});
      return;
    }
    case message_kind::message:
    case message_kind::request:
      dispatch_user(n);
      return;
  }
}

void actor::dispatch_user(message_node& n) {
  for (auto& h : handlers_) {
    if (h.type_id == n.type_id) {
      current_ = &n;
      current_deferred_ = false;
      h.fn(*this, n);
      current_ = nullptr;
      return;
    }
  }
  if (n.payload() == nullptr) {
    reject_body(n, make_error(errc::unsupported, "{} has no handler for type id {:#x}", self_,
                              n.type_id));
    return;
  }
  sys_->counters_.unhandled.fetch_add(1, std::memory_order_relaxed);
  SPDLOG_DEBUG("{}: no handler for {}", self_, n.type_name());
  reply_error(n, make_error(errc::unsupported, "{} has no handler for {}", self_, n.type_name()));
}

void actor::fail_pending(const error& why) {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending) {
    sys_->pending_count_.fetch_sub(1, std::memory_order_relaxed);
    sys_->timers_.cancel(p.timer);
    p.cont(nullptr, &why);
  }
}

void actor::cancel_all_timers() {
  for (auto& [id, periodic] : timers_) sys_->timers_.cancel(id);
  timers_.clear();
}

}  // namespace tessera::actors
