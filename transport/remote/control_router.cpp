#include "transport/remote/control_router.hpp"

#include <algorithm>
#include <bit>

#include "actors/base/log.hpp"
#include "actors/system_messages.hpp"

namespace tessera::transport::remote {

using actors::actor_ref;
using actors::envelope;
using actors::message_kind;
using actors::node_id;

namespace {

/// The body of a kRemoteWatchType message.
struct watch_request {
  TESSERA_MESSAGE("tessera.remote.watch");
  actor_ref target;
  actor_ref watcher;
  MSGPACK_DEFINE(target, watcher);
};

std::span<const std::byte> as_bytes(const std::vector<char>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}

void bump(std::atomic<std::uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

/// Counts one rejected input; true when it should be logged (the 1st, 2nd, 4th, 8th, ...), so a
/// peer sending garbage cannot flood the log.
bool count_reject(std::atomic<std::uint64_t>& c) {
  return std::has_single_bit(c.fetch_add(1, std::memory_order_relaxed) + 1);
}

}  // namespace

control_router::control_router(actors::actor_system& sys, router_options opts)
    : sys_(sys), opts_(opts) {}

control_router::~control_router() = default;

void control_router::bind(control::control_node* node) {
  std::unique_lock lock(node_mutex_);
  node_ = node;
}

result<void> control_router::map_node(node_id node, std::string peer_id) {
  if (node == sys_.node()) {
    return make_error(errc::invalid_argument, "node {} is this node; it needs no route", node);
  }
  if (peer_id.empty()) {
    return make_error(errc::invalid_argument, "node {}: empty control peer id", node);
  }
  std::lock_guard lock(mutex_);
  if (auto it = peers_.find(peer_id); it != peers_.end() && it->second != node) {
    return make_error(errc::invalid_argument, "control peer '{}' already carries node {}", peer_id,
                      it->second);
  }
  auto& st = nodes_[node];
  if (!st.peer_id.empty() && st.peer_id != peer_id) peers_.erase(st.peer_id);
  st.peer_id = peer_id;
  peers_[std::move(peer_id)] = node;
  return ok();
}

result<void> control_router::send_frame(const std::string& peer, std::uint16_t type,
                                        const std::vector<char>& body) {
  std::shared_lock lock(node_mutex_);
  if (node_ == nullptr) {
    return make_error(errc::closed, "remote actors: control plane detached (node {} stopping)",
                      sys_.node());
  }
  return node_->send(peer, type, as_bytes(body));
}

result<void> control_router::route(envelope&& env) {
  const node_id to = env.receiver.node();
  std::string peer;
  const bool is_request = env.kind == message_kind::request;
  {
    std::lock_guard lock(mutex_);
    auto it = nodes_.find(to);
    if (it == nodes_.end()) {
      bump(ctr_.send_refused);
      return make_error(errc::not_found, "no route to node {} (not mapped to a control peer)", to);
    }
    if (it->second.lost) {
      bump(ctr_.send_refused);
      return make_error(errc::closed, "node {} unreachable: {}", to, it->second.lost_why);
    }
    peer = it->second.peer_id;
    if (is_request) {
      if (requests_.size() >= opts_.max_tracked_requests) {
        requests_.erase(requests_.begin());
        bump(ctr_.tracked_requests_evicted);
      }
      requests_[env.request_id] = tracked_request{to, env.sender, env.receiver};
    }
  }
  const std::uint64_t request_id = env.request_id;
  auto sent = send_frame(peer, static_cast<std::uint16_t>(control::msg_type::actor_envelope),
                         actors::encode_envelope(env));
  if (!sent) {
    bump(ctr_.send_refused);
    if (is_request) {
      std::lock_guard lock(mutex_);
      requests_.erase(request_id);
    }
    return make_error(sent.error().code, "to {}: {}", env.receiver, sent.error().message);
  }
  bump(ctr_.envelopes_sent);
  return ok();
}

result<void> control_router::monitor(const actor_ref& target, const actor_ref& watcher) {
  if (!watcher.valid() || watcher.node() != sys_.node()) {
    return make_error(errc::invalid_argument, "remote monitor of {}: watcher {} is not local",
                      target, watcher);
  }
  std::string peer;
  std::optional<std::string> down_now;
  {
    std::lock_guard lock(mutex_);
    auto it = nodes_.find(target.node());
    if (it == nodes_.end()) {
      down_now = fmt::format("no route to node {}", target.node());
    } else if (it->second.lost) {
      down_now = fmt::format("node {} lost: {}", target.node(), it->second.lost_why);
    } else if (watch_total_ >= opts_.max_watches) {
      return make_error(errc::no_capacity, "remote monitor of {}: {} watches is the limit", target,
                        opts_.max_watches);
    } else {
      peer = it->second.peer_id;
      watches_[target.node()].push_back(watch{target, watcher});
      ++watch_total_;
    }
  }
  if (down_now) {
    // Like a local monitor of an actor that never existed: the watcher hears at once.
    deliver_down(target, watcher, actors::exit_reason{actors::exit_kind::unknown, *down_now});
    return ok();
  }
  auto sent = send_frame(peer, kRemoteWatchType, actors::pack_message(watch_request{target, watcher}));
  if (!sent) {
    std::lock_guard lock(mutex_);
    auto& v = watches_[target.node()];
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it->target == target && it->watcher == watcher) {
        v.erase(it);
        --watch_total_;
        break;
      }
    }
    return make_error(sent.error().code, "remote monitor of {}: {}", target, sent.error().message);
  }
  bump(ctr_.watches_sent);
  return ok();
}

bool control_router::on_message(const control::inbound_message& m) {
  const bool is_envelope = m.type == static_cast<std::uint16_t>(control::msg_type::actor_envelope);
  if (!is_envelope && m.type != kRemoteWatchType) return false;
  node_id from = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = peers_.find(m.sender);
    if (it != peers_.end()) from = it->second;
  }
  if (from == 0) {
    if (count_reject(ctr_.rejected_inbound)) {
      SPDLOG_WARN("node {}: remote actor message from control peer '{}' that carries no node "
                  "({} rejected so far)", sys_.node(), m.sender, ctr_.rejected_inbound.load());
    }
    return true;
  }
  if (is_envelope) {
    handle_envelope(m, from);
  } else {
    handle_watch(m, from);
  }
  return true;
}

void control_router::handle_envelope(const control::inbound_message& m, node_id from) {
  auto env = actors::decode_envelope(std::span<const char>(m.body.data(), m.body.size()));
  if (!env) {
    if (count_reject(ctr_.rejected_inbound)) {
      SPDLOG_WARN("node {}: envelope from node {}: {} ({} rejected so far)", sys_.node(), from,
                  env.error().message, ctr_.rejected_inbound.load());
    }
    return;
  }
  // A peer speaks only for its own node's actors (the sender is who gets answers and downs).
  if (env->sender.valid() && env->sender.node() != from) {
    if (count_reject(ctr_.rejected_inbound)) {
      SPDLOG_WARN("node {}: envelope from node {} claims sender {} ({} rejected so far)",
                  sys_.node(), from, env->sender, ctr_.rejected_inbound.load());
    }
    return;
  }
  bump(ctr_.envelopes_received);
  if (env->kind == message_kind::response || env->kind == message_kind::error_response) {
    std::lock_guard lock(mutex_);
    requests_.erase(env->request_id);
  } else if (env->kind == message_kind::message && env->type_id == actors::down::type_id) {
    // The real down for a remote watch: forget the watch (the envelope goes on to the watcher).
    auto d = actors::unpack_message<actors::down>(env->body);
    if (d) {
      std::lock_guard lock(mutex_);
      auto& v = watches_[from];
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (it->target == d->who && it->watcher == env->receiver) {
          v.erase(it);
          --watch_total_;
          break;
        }
      }
    }
  }
  auto r = sys_.deliver_remote(std::move(*env));
  if (!r) bump(ctr_.deliver_failed);  // deliver_remote logged, counted and answered a request
}

void control_router::handle_watch(const control::inbound_message& m, node_id from) {
  auto w = actors::unpack_message<watch_request>(std::span<const char>(m.body.data(), m.body.size()));
  if (!w || w->watcher.node() != from || !w->watcher.valid() || w->target.node() != sys_.node()) {
    if (count_reject(ctr_.rejected_inbound)) {
      SPDLOG_WARN("node {}: malformed remote watch from node {} ({} rejected so far)", sys_.node(),
                  from, ctr_.rejected_inbound.load());
    }
    return;
  }
  bump(ctr_.watches_received);
  // The runtime sends the down (now, if the target is gone) to the remote watcher through route().
  auto r = sys_.monitor(w->target, w->watcher);
  if (!r) {
    SPDLOG_WARN("node {}: remote watch of {} by {}: {}", sys_.node(), w->target, w->watcher,
                r.error().message);
  }
}

void control_router::on_peer_event(const control::peer_event& e) {
  node_id node = 0;
  bool lose = false;
  {
    std::lock_guard lock(mutex_);
    auto it = peers_.find(e.peer);
    if (it == peers_.end()) return;
    node = it->second;
    auto& st = nodes_[node];
    switch (e.kind) {
      case control::peer_event_kind::up:
        st.lost = false;
        st.lost_why.clear();
        break;
      case control::peer_event_kind::down:
        st.lost = true;
        st.lost_why = e.reason.empty() ? "peer down" : e.reason;
        lose = true;
        break;
      case control::peer_event_kind::restarted:
        // A new process: the old one's actors are gone, though the link stays up.
        lose = true;
        break;
    }
  }
  if (lose) {
    node_lost(node, e.kind == control::peer_event_kind::restarted
                        ? std::string("restarted (new incarnation)")
                        : (e.reason.empty() ? std::string("peer down") : e.reason));
  }
}

void control_router::node_lost(node_id node, const std::string& why) {
  std::vector<watch> lost_watches;
  std::vector<std::pair<std::uint64_t, tracked_request>> lost_requests;
  {
    std::lock_guard lock(mutex_);
    if (auto it = watches_.find(node); it != watches_.end()) {
      lost_watches = std::move(it->second);
      watch_total_ -= lost_watches.size();
      watches_.erase(it);
    }
    for (auto it = requests_.begin(); it != requests_.end();) {
      if (it->second.node == node) {
        lost_requests.emplace_back(it->first, std::move(it->second));
        it = requests_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const std::string reason = fmt::format("node {} lost: {}", node, why);
  SPDLOG_WARN("node {}: {} ({} watches, {} pending requests)", sys_.node(), reason,
              lost_watches.size(), lost_requests.size());
  for (const auto& w : lost_watches) {
    bump(ctr_.downs_for_lost_nodes);
    deliver_down(w.target, w.watcher, actors::exit_reason{actors::exit_kind::unknown, reason});
  }
  for (const auto& [id, t] : lost_requests) {
    bump(ctr_.requests_failed_on_loss);
    fail_request(t, id, reason);
  }
}

void control_router::deliver_down(const actor_ref& target, const actor_ref& watcher,
                                  actors::exit_reason reason) {
  envelope env;
  env.sender = target;
  env.receiver = watcher;
  env.type_id = actors::down::type_id;
  env.kind = message_kind::message;
  env.lane_ = actors::lane::control;
  env.body = actors::pack_message(actors::down{target, std::move(reason)});
  auto r = sys_.deliver_remote(std::move(env));
  if (!r) {
    bump(ctr_.deliver_failed);
    SPDLOG_WARN("node {}: down of {} for {}: {}", sys_.node(), target, watcher, r.error().message);
  }
}

void control_router::fail_request(const tracked_request& t, std::uint64_t request_id,
                                  const std::string& why) {
  if (!t.requester.valid()) return;
  envelope env;
  env.sender = t.target;
  env.receiver = t.requester;
  env.type_id = actors::error_reply::type_id;
  env.request_id = request_id;
  env.kind = message_kind::error_response;
  env.lane_ = actors::lane::control;
  env.body = actors::pack_message(actors::error_reply{
      static_cast<std::uint16_t>(errc::closed),
      fmt::format("request to {} abandoned: {}", t.target, why)});
  // A requester that already timed out counts this as a late reply; one that stopped refuses it.
  if (!sys_.deliver_remote(std::move(env))) bump(ctr_.deliver_failed);
}

router_stats control_router::stats() const {
  router_stats s;
  s.envelopes_sent = ctr_.envelopes_sent.load();
  s.envelopes_received = ctr_.envelopes_received.load();
  s.send_refused = ctr_.send_refused.load();
  s.rejected_inbound = ctr_.rejected_inbound.load();
  s.deliver_failed = ctr_.deliver_failed.load();
  s.watches_sent = ctr_.watches_sent.load();
  s.watches_received = ctr_.watches_received.load();
  s.downs_for_lost_nodes = ctr_.downs_for_lost_nodes.load();
  s.requests_failed_on_loss = ctr_.requests_failed_on_loss.load();
  s.tracked_requests_evicted = ctr_.tracked_requests_evicted.load();
  return s;
}

std::size_t control_router::watch_count() const {
  std::lock_guard lock(mutex_);
  return watch_total_;
}

std::size_t control_router::tracked_requests() const {
  std::lock_guard lock(mutex_);
  return requests_.size();
}

// --- remote_node ---------------------------------------------------------------------------

result<std::unique_ptr<remote_node>> remote_node::start(actors::actor_system& sys,
                                                        control::node_config cfg,
                                                        router_options opts,
                                                        control::node_handlers handlers) {
  auto router = std::make_shared<control_router>(sys, opts);
  std::unique_ptr<remote_node> self(new remote_node(sys, router));
  control::node_handlers h;
  h.on_message = [router, next = handlers.on_message](control::inbound_message&& m) {
    if (router->on_message(m)) return;
    if (next) next(std::move(m));
  };
  h.on_peer_event = [router, next = handlers.on_peer_event](const control::peer_event& e) {
    router->on_peer_event(e);
    if (next) next(e);
  };
  auto node = control::control_node::start(std::move(cfg), std::move(h));
  if (!node) return std::move(node).error();
  self->control_ = std::move(*node);
  router->bind(self->control_.get());
  sys.set_router(router);
  return self;
}

remote_node::~remote_node() { stop(); }

result<void> remote_node::add_node(actors::node_id node, const std::string& peer_id,
                                   const std::string& endpoint) {
  TESSERA_TRY(router_->map_node(node, peer_id));
  return control_->add_peer(peer_id, endpoint);
}

void remote_node::stop() {
  if (stopped_) return;
  stopped_ = true;
  sys_.set_router(nullptr);
  router_->bind(nullptr);
  control_->stop();
}

}  // namespace tessera::transport::remote
