// actor_system: the actor runtime of one node — spawning, sending, requests, timers, names,
// monitors, the remote seam, deterministic mode and shutdown.
//
//   actor_system sys(config{.workers = 2});                       // threaded
//   actor_system sim(config{.mode = run_mode::deterministic, .seed = 42});
//   auto ref = sys.spawn<counter>();
//   (void)sys.send(*ref, add{5});
//   auto total = sys.ask<total_reply>(*ref, get{}, std::chrono::seconds(1));
//
// Threading: every public function is thread-safe in threaded mode. In deterministic mode the
// system has no threads; every call comes from the one thread that owns it, and actors run only
// inside run_until_idle() / advance() / ask().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "actors/actor.hpp"
#include "actors/actor_ref.hpp"
#include "actors/base/result.hpp"
#include "actors/clock.hpp"
#include "actors/envelope.hpp"
#include "actors/registry.hpp"
#include "actors/remote_router.hpp"
#include "actors/rng.hpp"
#include "actors/scheduler.hpp"
#include "actors/timer_service.hpp"

namespace tessera::actors {

enum class run_mode { threaded, deterministic };

/// One message about to be handled (config::trace). In threaded mode the hook is called from
/// several workers at once and must be thread-safe.
struct trace_event {
  clock::time_point time;
  actor_id receiver = 0;
  actor_ref sender;
  std::uint32_t type_id = 0;
  message_kind kind = message_kind::message;
};

struct config {
  run_mode mode = run_mode::threaded;
  /// Worker threads (threaded mode); 0 = one per hardware thread.
  unsigned workers = 0;
  /// Seeds the scheduling order (deterministic mode) and every actor's random stream.
  std::uint64_t seed = 0;
  /// This node's id in actor_refs and envelopes.
  node_id node = 1;
  /// Most messages an actor handles per turn before others get the worker (fairness).
  std::size_t max_batch = 32;
  /// Default mailbox bounds (spawn_options may override per actor).
  std::size_t data_capacity = 4096;
  std::size_t control_capacity = 1024;
  /// Most requests one actor may wait on at once (also bounds responses in its mailbox).
  std::size_t max_pending_requests = 4096;
  /// How long an idle worker spins (yielding between checks) before it parks; 0 = park at once.
  std::chrono::microseconds spin{50};
  /// Called before each message is handled (optional; deterministic traces, debugging).
  std::function<void(const trace_event&)> trace;
};

struct spawn_options {
  /// Registers the actor under this name (removed when it stops). Empty: no name.
  std::string name;
  /// Re-bind the name if another actor holds it (supervisors restarting a child).
  bool replace_name = false;
  /// Mailbox bounds; 0 = the system default.
  std::size_t data_capacity = 0;
  std::size_t control_capacity = 0;
  /// Pin to this worker (threaded mode); -1 = any worker.
  int worker = -1;
  /// Receives child_exit when this actor stops (its supervisor).
  actor_ref parent;
};

/// Counters of everything the runtime refused or dropped — nothing vanishes silently.
struct system_stats {
  std::uint64_t late_replies = 0;        ///< responses that came after their timeout
  std::uint64_t rejected_envelopes = 0;  ///< bad version / receiver / kind / type id / body
  std::uint64_t unhandled = 0;           ///< local messages with no handler at the receiver
  std::uint64_t dropped_on_stop = 0;     ///< messages queued when their receiver stopped
  std::uint64_t control_overflow = 0;    ///< control-lane pushes refused at the bound
  std::uint64_t handler_failures = 0;    ///< handlers that threw
  std::uint64_t cancelled_timer_drops = 0;  ///< timer messages dropped after cancel_timer
};

/// One named actor as status pages show it.
struct actor_info {
  std::string name;
  actor_id id = 0;
  std::size_t queued = 0;     ///< messages waiting in its mailbox
  std::uint64_t handled = 0;  ///< messages handled since it started
};

namespace detail {
/// The actor behind actor_system::request / ask: sends one request, reports, quits.
template <message Resp>
class ask_actor final : public actor {
 public:
  using done_fn = std::function<void(result<Resp>)>;
  ask_actor(actor_ref target, std::unique_ptr<message_node> req, clock::duration timeout,
            done_fn done)
      : target_(std::move(target)), req_(std::move(req)), timeout_(timeout),
        done_(std::move(done)) {}
  void on_start() override {
    auto r = send_request(target_, std::move(req_), timeout_,
                          [this](message_node* n, const error* e) {
                            finish(e != nullptr ? result<Resp>(*e) : read_response<Resp>(*n));
                          });
    if (!r) finish(std::move(r).error());
  }
  void on_stop(const exit_reason& why) override {
    if (done_) finish(make_error(errc::closed, "request ended before an answer: {}", why.describe()));
  }

 private:
  void finish(result<Resp> r) {
    auto done = std::move(done_);
    done_ = nullptr;
    quit();
    done(std::move(r));
  }
  actor_ref target_;
  std::unique_ptr<message_node> req_;
  clock::duration timeout_;
  done_fn done_;
};
}  // namespace detail

class actor_system {
 public:
  explicit actor_system(config cfg = {});
  /// Shuts down (see shutdown()) if that has not happened yet.
  ~actor_system();
  actor_system(const actor_system&) = delete;
  actor_system& operator=(const actor_system&) = delete;

  /// Starts an actor. Errors: closed (shutting down), invalid_argument (name taken).
  result<actor_ref> spawn(std::unique_ptr<actor> a, spawn_options opts = {});
  template <class A, class... Args>
  result<actor_ref> spawn(Args&&... args) {
    return spawn(std::make_unique<A>(std::forward<Args>(args)...), spawn_options{});
  }
  template <class A, class... Args>
  result<actor_ref> spawn_with(spawn_options opts, Args&&... args) {
    return spawn(std::make_unique<A>(std::forward<Args>(args)...), std::move(opts));
  }

  /// Sends from outside any actor (the receiver sees an invalid sender). Same errors as
  /// actor::send.
  template <message T>
  result<void> send(const actor_ref& to, T msg) {
    return post(to, new typed_node<T>(std::move(msg)));
  }

  /// Sends a request from outside any actor; `on_result(result<Resp>)` runs on a runtime thread
  /// (deterministic mode: inside run_until_idle / advance) exactly once.
  template <message Resp, message Req, class F>
  result<void> request(const actor_ref& to, Req msg, clock::duration timeout, F on_result) {
    auto asker = std::make_unique<detail::ask_actor<Resp>>(
        to, std::make_unique<typed_node<Req>>(std::move(msg)), timeout,
        typename detail::ask_actor<Resp>::done_fn(std::move(on_result)));
    auto r = spawn(std::move(asker));
    if (!r) return std::move(r).error();
    return ok();
  }

  /// Request and wait for the answer (never call it from inside an actor: use request there).
  /// Deterministic mode: runs the system (and its virtual clock) until the answer is in.
  template <message Resp, message Req>
  result<Resp> ask(const actor_ref& to, Req msg, clock::duration timeout) {
    if (mode_ == run_mode::deterministic) {
      std::optional<result<Resp>> out;
      auto sent = request<Resp>(to, std::move(msg), timeout,
                                [&out](result<Resp> v) { out.emplace(std::move(v)); });
      if (!sent) return std::move(sent).error();
      run_until([&out] { return out.has_value(); });
      if (!out) return error{errc::internal, "ask: the system went idle without an answer"};
      return std::move(*out);
    }
    TESSERA_ASSERT(!on_worker_thread(), "ask() would block a worker; use actor::request");
    auto promise = std::make_shared<std::promise<result<Resp>>>();
    auto future = promise->get_future();
    auto sent = request<Resp>(to, std::move(msg), timeout,
                              [promise](result<Resp> v) { promise->set_value(std::move(v)); });
    if (!sent) return std::move(sent).error();
    return future.get();
  }

  /// Asks `target` to stop (control lane). Errors: not_found, closed (already stopped).
  result<void> stop(const actor_ref& target,
                    exit_reason reason = {exit_kind::killed, "stopped by request"});
  /// `watcher` receives `down` when `target` stops (at once if it already did or never existed).
  result<void> monitor(const actor_ref& target, const actor_ref& watcher);

  /// Named actors.
  result<void> register_name(std::string_view name, const actor_ref& ref);
  [[nodiscard]] result<actor_ref> lookup(std::string_view name) const;
  bool unregister_name(std::string_view name);

  /// The remote seam: where messages for other nodes go (null: they fail with not_found).
  void set_router(std::shared_ptr<remote_router> router);
  /// Entry point for an envelope that arrived from the network. Rejects (with an error, counted
  /// in stats().rejected_envelopes; a rejected request is answered with an error_response) a
  /// wrong version, a receiver on another node or not alive, a node-local kind, an oversized
  /// body; a type id the receiver has no handler for is rejected the same way when it is handled.
  result<void> deliver_remote(envelope env);

  /// Deterministic mode: runs actors until none is runnable (at most `max_turns` turns); returns
  /// the number of turns run.
  std::size_t run_until_idle(std::size_t max_turns = 100'000'000);
  /// Deterministic mode: moves the virtual clock forward by `d`, firing timers in order and
  /// running actors to idle after each.
  void advance(clock::duration d);

  /// Stops accepting (send / request / spawn fail with errc::closed; responses still flow), lets
  /// queued messages drain for at most `drain`, then stops every actor: each fails its pending
  /// requests with errc::closed ("shutting down") before on_stop. Joins the threads. Idempotent.
  void shutdown(clock::duration drain = std::chrono::seconds(2));

  [[nodiscard]] const actors::clock& clock() const noexcept { return *clock_; }
  /// The system's rng (deterministic mode: the scheduling order; owner thread only).
  [[nodiscard]] actors::rng& random() noexcept { return rng_; }
  [[nodiscard]] node_id node() const noexcept { return node_; }
  [[nodiscard]] run_mode mode() const noexcept { return mode_; }
  [[nodiscard]] bool accepting() const noexcept { return accepting_.load(); }
  [[nodiscard]] system_stats stats() const noexcept;
  /// Every named, running actor: name, mailbox depth, messages handled (any thread).
  [[nodiscard]] std::vector<actor_info> named_actors() const;
  [[nodiscard]] std::size_t live_actors() const;
  /// Requests waiting for an answer, over all actors.
  [[nodiscard]] std::size_t pending_requests() const noexcept { return pending_count_.load(); }
  [[nodiscard]] std::size_t active_timers() const { return timers_.size(); }
  [[nodiscard]] bool on_worker_thread() const noexcept;
  /// Worker threads parked right now (threaded mode; 0 in deterministic mode). Diagnostics and
  /// tests: once nothing is runnable every worker parks after config::spin.
  [[nodiscard]] unsigned parked_workers() const noexcept {
    return pool_ != nullptr ? pool_->parked_workers() : 0;
  }

 private:
  friend class actor;
  friend class actor_cell;
  friend result<void> detail::post_response(actor_system*, const actor_ref&, std::uint64_t,
                                            message_node*);
  struct counters {
    std::atomic<std::uint64_t> late_replies{0}, rejected_envelopes{0}, unhandled{0},
        dropped_on_stop{0}, control_overflow{0}, handler_failures{0}, cancelled_timer_drops{0};
  };

  result<void> post(const actor_ref& to, message_node* node);
  result<void> route_remote(const actor_ref& to, std::unique_ptr<message_node> node);
  void reject_remote_request(const envelope& env, const error& why);
  cell_ptr find_cell(actor_id id) const;
  void cell_stopped(actor_cell& cell, const actor_ref& self, const exit_reason& reason,
                    std::vector<actor_ref> watchers, const actor_ref& parent);
  void run_until(const std::function<bool()>& done);
  bool quiescent() const;
  void trace(const trace_event& e) const { if (config_.trace) config_.trace(e); }

  config config_;
  run_mode mode_;
  node_id node_;
  actors::rng rng_;
  std::unique_ptr<actors::clock> clock_;
  virtual_clock* virtual_clock_ = nullptr;
  timer_service timers_;
  std::unique_ptr<scheduler> scheduler_;
  deterministic_scheduler* det_ = nullptr;
  thread_pool_scheduler* pool_ = nullptr;
  registry names_;
  std::atomic<actor_id> next_id_{1};
  std::atomic<std::uint64_t> next_request_id_{1};
  std::atomic<std::size_t> pending_count_{0};
  std::atomic<bool> accepting_{true};
  std::atomic<bool> shut_down_{false};
  mutable std::mutex table_mutex_;
  std::condition_variable table_cv_;
  std::unordered_map<actor_id, cell_ptr> table_;
  std::mutex router_mutex_;
  std::shared_ptr<remote_router> router_;
  counters counters_;
};

}  // namespace tessera::actors
