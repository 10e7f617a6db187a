#include "actors/actor_cell.hpp"

#include "actors/base/log.hpp"

#include <array>
#include <exception>
#include <thread>

#include "actors/system.hpp"

namespace tessera::actors {

void intrusive_add_ref(actor_cell* cell) noexcept {
  cell->refs.fetch_add(1, std::memory_order_relaxed);
}

void intrusive_release(actor_cell* cell) noexcept {
  if (cell->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete cell;
}

actor_cell::actor_cell(actor_system& sys, actor_id id, std::unique_ptr<actor> behaviour,
                       std::size_t data_capacity, std::size_t control_capacity,
                       int pinned_worker, actor_ref parent)
    : sys_(sys), id_(id), behaviour_(std::move(behaviour)),
      mailbox_(data_capacity, control_capacity), pinned_worker_(pinned_worker),
      parent_(std::move(parent)) {}

actor_cell::~actor_cell() = default;

namespace {
// Sends batched by one handler turn (per worker thread: a turn runs on one thread). A handler
// that sends many messages to one actor pays for the mailbox's shared line (the counter and the
// queue head, which every sender writes) once per batch instead of once per message, and marks
// each node with a later one so the receiver can fetch ahead through the chain (see
// message_node::request_id). Messages of a batch are delivered when the handler returns, when
// `send_batch_limit` of them are waiting, or before the handler's next send that is not added to
// it (another actor, a response, the control lane, another node): so the order of one handler's
// sends is kept across all of them.
struct send_batch {
  actor_cell* dest = nullptr;  // holds a count while the batch is open
  message_node* first = nullptr;
  message_node* last = nullptr;
  std::uint32_t size = 0;
  std::uint32_t credits = 0;  // slots reserved in dest's data lane and not used yet
  // The last `prefetch_distance` nodes: each gets the address of the node that many later.
  std::array<message_node*, actor_cell::prefetch_distance> window{};
};
thread_local send_batch tl_batch;
thread_local bool tl_in_turn = false;
// The actor this turn last sent to without a batch; a second send to it opens one (a handler
// that sends one message, the common case, pays nothing for the batching: no count, no
// reservation). Compared, never dereferenced.
thread_local const actor_cell* tl_last_eager = nullptr;
}  // namespace

void actor_cell::flush_sends() noexcept {
  send_batch& b = tl_batch;
  if (b.dest == nullptr) return;
  actor_cell* d = std::exchange(b.dest, nullptr);
  d->mailbox_.unreserve_data(std::exchange(b.credits, 0));
  if (b.size != 0) {
    d->mailbox_.push_admitted_chain(b.first, b.last);
    b.first = b.last = nullptr;
    b.size = 0;
    d->make_runnable();
  }
  intrusive_release(d);
}

void actor_cell::begin_turn() noexcept {
  tl_in_turn = true;
}

void actor_cell::end_turn() noexcept {
  tl_in_turn = false;
  tl_last_eager = nullptr;
  if (tl_batch.dest != nullptr) flush_sends();
}

void actor_cell::make_runnable() noexcept {
  // Most sends find the actor already scheduled: a plain seq_cst load then avoids an RMW on a
  // line the consumer also writes. Safe: the push's seq_cst exchange of the queue head precedes
  // this load, and resume() clears the flag before it looks at the queue again.
  if (scheduled_.load(std::memory_order_seq_cst)) return;
  if (!scheduled_.exchange(true, std::memory_order_seq_cst)) {
    intrusive_add_ref(this);
    sys_.scheduler_->schedule(this);
  }
}

result<void> actor_cell::add_to_batch(message_node* node) noexcept {
  send_batch& b = tl_batch;
  if (b.dest != this) {
    intrusive_add_ref(this);
    b.dest = this;
    // The rest of a full batch at once, when the lane has room for it and as much again;
    // else one slot per message (exact at the bound).
    b.credits = mailbox_.reserve_data(send_batch_limit);
  }
  if (b.credits > 0) {
    --b.credits;
  } else {
    TESSERA_TRY(mailbox_.admit_data());
  }
  node->next.store(nullptr, std::memory_order_relaxed);
  if (b.last != nullptr) {
    b.last->next.store(node, std::memory_order_relaxed);
  } else {
    b.first = node;
  }
  b.last = node;
  message_node*& back = b.window[b.size % prefetch_distance];
  if (b.size >= prefetch_distance && back->kind == message_kind::message) {
    back->request_id = reinterpret_cast<std::uintptr_t>(node);
  }
  back = node;
  if (++b.size == send_batch_limit) flush_sends();
  return ok();
}

result<void> actor_cell::enqueue(message_node* node, bool bypass_bound) noexcept {
  if (tl_in_turn) {
    send_batch& b = tl_batch;
    if (node->lane_ == lane::data && !bypass_bound) {
      if (b.dest == this) return add_to_batch(node);
      if (b.dest != nullptr) flush_sends();  // keeps this handler's sends in order
      if (tl_last_eager == this) return add_to_batch(node);
      tl_last_eager = this;
    } else if (b.dest != nullptr) {
      flush_sends();
    }
  }
  TESSERA_TRY(mailbox_.push(node, bypass_bound));
  make_runnable();
  return ok();
}

void actor_cell::start() {
  // The ref is published (table, name) before start(): a message sent in between has scheduled
  // the cell already, and scheduling it again ran one actor on two workers at once (TSan in CI:
  // RestartBoundExceededEscalatesToTheParentSupervisor). Its first resume runs on_start either way.
  if (!scheduled_.exchange(true, std::memory_order_seq_cst)) {
    intrusive_add_ref(this);
    sys_.scheduler_->schedule(this);
  }
}

bool actor_cell::quiescent() const noexcept {
  return mailbox_.size() == 0 && !scheduled_.load(std::memory_order_seq_cst);
}

bool actor_cell::add_watcher(const actor_ref& watcher, exit_reason& reason_if_dead) {
  std::lock_guard lock(watch_mutex_);
  if (stopped_.load(std::memory_order_relaxed)) {
    reason_if_dead = exit_reason_;
    return false;
  }
  watchers_.push_back(watcher);
  return true;
}

namespace {
/// Drops `n` counts at once (one RMW on a line the sender keeps writing, instead of n).
void release_counts(actor_cell* cell, std::uint32_t n) noexcept {
  if (cell != nullptr && cell->refs.fetch_sub(n, std::memory_order_acq_rel) == n) delete cell;
}
}  // namespace

actor_cell* actor_cell::process(message_node* node) {
  std::unique_ptr<message_node> owned(node);
  handled_.store(handled_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (sys_.config_.trace) {
    sys_.trace(trace_event{sys_.clock().now(), id_, node->sender, node->type_id, node->kind});
  }
  try {
    behaviour_->dispatch(*node);
  } catch (const std::exception& e) {
    sys_.counters_.handler_failures.fetch_add(1, std::memory_order_relaxed);
    behaviour_->current_ = nullptr;
    behaviour_->quit(exit_reason{
        exit_kind::failed, fmt::format("handler of {} threw: {}", node->type_name(), e.what())});
  } catch (...) {
    sys_.counters_.handler_failures.fetch_add(1, std::memory_order_relaxed);
    behaviour_->current_ = nullptr;
    behaviour_->quit(exit_reason{exit_kind::failed,
                                 fmt::format("handler of {} threw a non-exception",
                                             node->type_name())});
  }
  return owned->sender.take_cell().detach();
}

resume_result actor_cell::resume(std::size_t max_batch) {
  if (stopped_.load(std::memory_order_acquire)) return resume_result::done;
  if (!started_) {
    started_ = true;
    try {
      behaviour_->on_start();
    } catch (const std::exception& e) {
      behaviour_->quit(exit_reason{exit_kind::failed, fmt::format("on_start threw: {}", e.what())});
    }
  }
  for (std::size_t i = 0; i < max_batch && !behaviour_->quitting_; ++i) {
    message_node* node = mailbox_.pop();
    if (node == nullptr) break;
    begin_turn();
    actor_cell* s = process(node);
    end_turn();
    if (s == nullptr) continue;
    if (s == held_sender_ && held_counts_ < held_counts_limit) {
      ++held_counts_;
      continue;
    }
    release_counts(held_sender_, held_counts_);
    held_sender_ = s;
    held_counts_ = 1;
  }
  mailbox_.settle();
  if (behaviour_->quitting_) {
    finalize(behaviour_->quit_reason_);
    return resume_result::done;
  }
  // The queue, not the counter: the counter also holds slots that another handler's open send
  // batch has admitted (and will push, and schedule us, when it is flushed); waiting on those
  // here would spin this actor for as long as that handler runs. The queue's owner-side half is
  // read now, while this worker still owns the actor: once the flag is clear another worker may
  // be popping (TSan caught the read after it).
  const bool unpopped = mailbox_.has_unpopped();
  // Dekker with enqueue(): clear the flag, then look again, so a push that saw the flag still
  // set is not stranded.
  scheduled_.store(false, std::memory_order_seq_cst);
  if ((unpopped || mailbox_.pushed()) && !scheduled_.exchange(true, std::memory_order_seq_cst)) {
    return resume_result::again;
  }
  return resume_result::idle;
}

void actor_cell::drain_after_close() {
  while (mailbox_.size() > 0) {
    message_node* node = mailbox_.pop();
    mailbox_.settle();  // size() must count exactly what is left
    if (node == nullptr) {
      std::this_thread::yield();  // a push that passed the closed check is still linking
      continue;
    }
    std::unique_ptr<message_node> owned(node);
    if (node->kind == message_kind::request) {
      behaviour_->reply_error(*node, make_error(errc::closed, "{} stopped before handling {} ({})",
                                                behaviour_->self(), node->type_name(),
                                                exit_reason_.describe()));
    } else if (node->kind == message_kind::message) {
      sys_.counters_.dropped_on_stop.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void actor_cell::finalize(exit_reason reason) {
  actor& b = *behaviour_;
  b.stopping_ = true;
  exit_reason_ = reason;
  auto guarded = [&](auto&& fn, const char* what) {
    try {
      fn();
    } catch (const std::exception& e) {
      SPDLOG_WARN("{}: {} threw while stopping: {}", b.self(), what, e.what());
    }
  };
  guarded([&] {
    b.fail_pending(make_error(errc::closed, "{} stopped before the answer came ({})", b.self(),
                              reason.describe()));
  }, "a request continuation");
  guarded([&] { b.on_stop(reason); }, "on_stop");
  b.cancel_all_timers();
  mailbox_.close();
  drain_after_close();
  std::vector<actor_ref> watchers;
  {
    std::lock_guard lock(watch_mutex_);
    stopped_.store(true, std::memory_order_release);
    watchers = std::move(watchers_);
    watchers_.clear();
  }
  actor_ref self = b.self();
  b.return_self_credit();  // before self_ goes: then the counts can reach zero
  release_counts(std::exchange(held_sender_, nullptr), std::exchange(held_counts_, 0));
  behaviour_.reset();  // the state dies on its own thread; this also drops self's cycle
  sys_.cell_stopped(*this, self, reason, std::move(watchers), parent_);
}

}  // namespace tessera::actors
