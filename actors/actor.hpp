// actor: the base class of every actor. An actor owns its state and handles one message at a time;
// the runtime never runs two of its handlers concurrently, so its members need no locks.
//
//   class counter : public tessera::actors::actor {
//    public:
//     counter() {
//       on<add>([this](add& m) { total_ += m.n; });                  // one-way message
//       on<get>([this](get&) { return total_reply{total_}; });        // request -> response
//     }
//    private:
//     std::int64_t total_ = 0;
//   };
//
// A handler takes the message by reference and returns either nothing, a message struct (sent as
// the response when the message was a request), or result<message> (an error becomes an
// error_response). A handler that throws fails the actor: it stops with exit_kind::failed and its
// supervisor (if any) restarts it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/actor_ref.hpp"
#include "actors/base/result.hpp"
#include "actors/clock.hpp"
#include "actors/envelope.hpp"
#include "actors/mailbox.hpp"
#include "actors/message.hpp"
#include "actors/rng.hpp"
#include "actors/system_messages.hpp"
#include "actors/timer_service.hpp"

namespace tessera::actors {

class actor_system;
class actor_cell;
struct spawn_options;

namespace detail {
template <class T>
struct is_result : std::false_type {};
template <class T>
struct is_result<result<T>> : std::true_type {
  using value_type = T;
};

/// Reads a response node as `Resp` (typed locally, msgpack from the network, or an error reply).
template <message Resp>
result<Resp> read_response(message_node& n) {
  if (n.kind == message_kind::error_response) {
    error_reply reply;
    if (auto* p = static_cast<error_reply*>(n.payload())) {
      reply = *p;
    } else {
      auto decoded = unpack_message<error_reply>(n.bytes());
      if (!decoded) return std::move(decoded).error();
      reply = std::move(*decoded);
    }
    return error{static_cast<errc>(reply.code), std::move(reply.message)};
  }
  if (n.type_id != Resp::type_id) {
    return make_error(errc::protocol, "response has type id {:#x}, expected {} ({:#x})", n.type_id,
                      Resp::type_name, Resp::type_id);
  }
  if (auto* p = static_cast<Resp*>(n.payload())) return std::move(*p);
  return unpack_message<Resp>(n.bytes());
}
}  // namespace detail

namespace detail {
/// Posts a response (or error_response) node for request `request_id` to `to`. Owns `node`.
result<void> post_response(actor_system* sys, const actor_ref& to, std::uint64_t request_id,
                           message_node* node);
}  // namespace detail

/// Continuation of a request: exactly one of (response node, error) is non-null.
using request_continuation = std::function<void(message_node* response, const error* failure)>;

/// A promise to answer the request being handled later (see actor::defer_reply). Move-only.
/// Dropping it unanswered sends errc::cancelled to the requester, so nobody waits forever.
template <message R>
class reply_promise {
 public:
  reply_promise() = default;
  reply_promise(actor_system* sys, actor_ref to, std::uint64_t request_id)
      : sys_(sys), to_(std::move(to)), request_id_(request_id) {}
  reply_promise(reply_promise&& o) noexcept
      : sys_(std::exchange(o.sys_, nullptr)), to_(std::move(o.to_)), request_id_(o.request_id_) {}
  reply_promise& operator=(reply_promise&& o) noexcept {
    if (this != &o) {
      abandon();
      sys_ = std::exchange(o.sys_, nullptr);
      to_ = std::move(o.to_);
      request_id_ = o.request_id_;
    }
    return *this;
  }
  ~reply_promise() { abandon(); }

  /// True until deliver() or fail() was called.
  [[nodiscard]] bool pending() const noexcept { return sys_ != nullptr; }
  result<void> deliver(R value);
  result<void> fail(error err);

 private:
  void abandon() {
    if (sys_) (void)fail(error{errc::cancelled, "reply promise dropped without an answer"});
  }
  actor_system* sys_ = nullptr;
  actor_ref to_;
  std::uint64_t request_id_ = 0;
};

class actor {
 public:
  actor() = default;
  actor(const actor&) = delete;
  actor& operator=(const actor&) = delete;
  virtual ~actor() = default;

  /// Runs on the actor's thread before its first message (handlers may be registered here too).
  virtual void on_start() {}
  /// Runs on the actor's thread when it stops, after its pending requests were failed.
  virtual void on_stop(const exit_reason& /*reason*/) {}

  /// This actor's ref.
  [[nodiscard]] const actor_ref& self() const noexcept { return self_; }
  [[nodiscard]] actor_system& system() const noexcept { return *sys_; }

 protected:
  /// Registers the handler for message type T (replaces an earlier one for T).
  template <message T, class F>
  void on(F handler);

  /// Sends a one-way message. Errors: overloaded (receiver's data lane full), closed (receiver
  /// stopped or system shutting down), not_found (no such actor / no route to its node).
  template <message T>
  result<void> send(const actor_ref& to, T msg);

  /// Sends a request; `on_result(result<Resp>)` runs later on this actor with the response, the
  /// error reply, errc::timeout once `timeout` passed (a later reply is dropped and counted), or
  /// errc::closed when this actor stops first. An immediate failure (overloaded, closed, too many
  /// pending requests) is returned here and on_result never runs.
  template <message Resp, message Req, class F>
  result<void> request(const actor_ref& to, Req msg, clock::duration timeout, F on_result);

  /// Delivers `msg` to this actor (control lane) after `delay`, or every `delay` if periodic.
  template <message T>
  timer_id after(clock::duration delay, T msg) { return start_timer(delay, std::move(msg), false); }
  template <message T>
  timer_id every(clock::duration period, T msg) { return start_timer(period, std::move(msg), true); }
  /// Cancels a timer of this actor; its message is not delivered after this returns.
  bool cancel_timer(timer_id id);

  /// Watches `target`: a `down` message arrives when it stops (at once if it is already dead).
  result<void> monitor(const actor_ref& target);

  /// Answers the current request later: the handler returns nothing and keeps the promise.
  template <message R>
  reply_promise<R> defer_reply();

  /// Stops this actor after the current message (reason normal unless given).
  void quit(exit_reason reason = {});
  /// Stops this actor as failed (its supervisor restarts it).
  void fail(std::string why) { quit(exit_reason{exit_kind::failed, std::move(why)}); }

  /// Sender of the message being handled (invalid outside a handler or for outside senders).
  [[nodiscard]] const actor_ref& current_sender() const noexcept {
    static const actor_ref nobody;
    return current_ != nullptr ? current_->sender : nobody;
  }

  [[nodiscard]] clock::time_point now() const;
  /// This actor's random stream (seeded from the system seed and the actor id).
  [[nodiscard]] actors::rng& random() noexcept { return rng_; }
  /// Number of requests this actor is waiting on.
  [[nodiscard]] std::size_t pending_requests() const noexcept { return pending_.size(); }

  /// Low level: sends a request node built elsewhere (used by the system's ask).
  result<void> send_request(const actor_ref& to, std::unique_ptr<message_node> node,
                            clock::duration timeout, request_continuation cont);

 private:
  friend class actor_cell;
  friend class actor_system;

  using handler_fn = std::function<void(actor&, message_node&)>;
  struct handler_entry {
    std::uint32_t type_id;
    std::string_view type_name;
    handler_fn fn;
  };
  struct pending_request {
    timer_id timer;
    request_continuation cont;
  };

  void add_handler(std::uint32_t type_id, std::string_view type_name, handler_fn fn);
  result<void> post(const actor_ref& to, message_node* node);
  /// `self_` for a node's sender field, its count paid from self_credit_.
  actor_ref lend_self() noexcept;
  /// Gives the unused credit back (actor_cell, when the actor stops).
  void return_self_credit() noexcept;
  timer_id start_timer_node(clock::duration delay, bool periodic,
                            std::function<message_node*()> make);
  template <message T>
  timer_id start_timer(clock::duration delay, T msg, bool periodic) {
    return start_timer_node(delay, periodic, [m = std::move(msg)]() -> message_node* {
      return new typed_node<T>(m);
    });
  }
  template <message R>
  void reply(message_node& request, R value) {
    if (request.kind != message_kind::request) return;  // a one-way send ignores the result
    (void)detail::post_response(sys_, request.sender, request.request_id,
                                new typed_node<R>(std::move(value)));
  }
  void reply_error(message_node& request, const error& err);
  void after_void_handler(message_node& n);
  void reject_body(message_node& n, const error& err);

  // Called by actor_cell on the actor's thread.
  void dispatch(message_node& n);
  void dispatch_user(message_node& n);
  void fail_pending(const error& why);
  void cancel_all_timers();

  actor_system* sys_ = nullptr;
  actor_ref self_;
  // Counts on our own cell taken in advance, a batch at a time: every message carries a counted
  // sender, and one atomic increment per send on a line the receivers keep writing (they drop
  // the counts) was a fifth of a fan-in's time. Kept across turns (self_ keeps the cell alive
  // until the actor stops anyway) and given back when it stops. Only the actor's turns touch it.
  std::uint32_t self_credit_ = 0;
  actors::rng rng_;
  std::vector<handler_entry> handlers_;
  std::unordered_map<std::uint64_t, pending_request> pending_;
  std::unordered_map<timer_id, bool> timers_;  // id -> periodic
  message_node* current_ = nullptr;
  bool current_deferred_ = false;
  bool quitting_ = false;
  bool stopping_ = false;  // set while the actor stops: no new requests
  exit_reason quit_reason_;
};

template <message R>
result<void> reply_promise<R>::deliver(R value) {
  TESSERA_ASSERT(sys_ != nullptr, "reply_promise<{}>: answered twice", R::type_name);
  auto* sys = std::exchange(sys_, nullptr);
  return detail::post_response(sys, to_, request_id_, new typed_node<R>(std::move(value)));
}

template <message R>
result<void> reply_promise<R>::fail(error err) {
  TESSERA_ASSERT(sys_ != nullptr, "reply_promise<{}>: answered twice", R::type_name);
  auto* sys = std::exchange(sys_, nullptr);
  auto* node = new typed_node<error_reply>(
      error_reply{static_cast<std::uint16_t>(err.code), std::move(err.message)});
  node->kind = message_kind::error_response;
  return detail::post_response(sys, to_, request_id_, node);
}

template <message T, class F>
void actor::on(F handler) {
  using R = std::invoke_result_t<F&, T&>;
  add_handler(T::type_id, T::type_name, [h = std::move(handler)](actor& self, message_node& n) mutable {
    T* value = static_cast<T*>(n.payload());
    std::optional<T> decoded;
    if (value == nullptr) {
      auto r = unpack_message<T>(n.bytes());
      if (!r) {
        self.reject_body(n, r.error());
        return;
      }
      decoded.emplace(std::move(*r));
      value = &*decoded;
    }
    if constexpr (std::is_void_v<R>) {
      h(*value);
      self.after_void_handler(n);
    } else if constexpr (detail::is_result<R>::value) {
      auto r = h(*value);
      if (r) {
        self.reply(n, std::move(*r));
      } else {
        self.reply_error(n, r.error());
      }
    } else {
      static_assert(message<R>, "a handler returns void, a message struct or result<message>");
      self.reply(n, h(*value));
    }
  });
}

template <message T>
result<void> actor::send(const actor_ref& to, T msg) {
  return post(to, new typed_node<T>(std::move(msg)));
}

template <message Resp, message Req, class F>
result<void> actor::request(const actor_ref& to, Req msg, clock::duration timeout, F on_result) {
  request_continuation cont = [f = std::move(on_result)](message_node* n,
                                                          const error* e) mutable {
    if (e != nullptr) {
      f(result<Resp>(*e));
      return;
    }
    f(detail::read_response<Resp>(*n));
  };
  return send_request(to, std::make_unique<typed_node<Req>>(std::move(msg)), timeout,
                      std::move(cont));
}

template <message R>
reply_promise<R> actor::defer_reply() {
  TESSERA_ASSERT(current_ != nullptr && current_->kind == message_kind::request,
                 "defer_reply<{}> outside the handler of a request", R::type_name);
  current_deferred_ = true;
  return reply_promise<R>(sys_, current_->sender, current_->request_id);
}

}  // namespace tessera::actors
