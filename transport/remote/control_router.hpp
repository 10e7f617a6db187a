// Remote actors over the authenticated ZeroMQ control plane (issue 3).
//
// control_router implements actors::remote_router: an envelope for an actor on node N is encoded
// (actors::encode_envelope) and sent as one msg_type::actor_envelope frame to the control peer that
// node N is mapped to; an envelope arriving from a peer is decoded, checked (its sender must be
// on the node that peer is mapped to) and handed to actor_system::deliver_remote.
//
// Remote monitors: monitoring an actor on node N records (target, watcher) here and sends a
// kRemoteWatchType message to N, whose router calls actor_system::monitor(target, remote watcher)
// there; when the target stops, N's runtime sends the real `down` back as an ordinary envelope.
// When the control plane reports peer N down (heartbeat silence, disconnect) or restarted, every
// local watcher of an actor on N gets `down` with reason "node <N> lost: <why>" and every request
// still waiting on N fails at once with errc::closed instead of waiting for its deadline.
//
//   auto node = remote_node::start(sys, control_cfg);      // control node + router, installed
//   (*node)->add_node(2, "node-2", "tcp://10.0.0.2:7000");  // actor node 2 = control peer node-2
//   actor_ref r(2, id);                                    // sys.send(r, msg) now crosses nodes
//
// Threading: route() and monitor() run on actor workers; on_message() / on_peer_event() on the
// control node's I/O thread. Everything is thread-safe; no lock is held while calling into the
// actor system or the control node's send (both may call back into the router).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/remote_router.hpp"
#include "actors/system.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::transport::remote {

/// Control-plane type of a remote watch registration (application range, owned by this module).
/// Body: msgpack [target, watcher] (two actor_refs).
inline constexpr std::uint16_t kRemoteWatchType = 80;

struct router_options {
  /// Requests to remote nodes remembered so that peer loss can fail them at once. Beyond the
  /// bound the oldest entry is forgotten (that request then ends by its own deadline; counted).
  std::size_t max_tracked_requests = 65536;
  /// Remote watches held at once; beyond, monitor() returns errc::no_capacity.
  std::size_t max_watches = 65536;
};

/// Counters: nothing is dropped without one.
struct router_stats {
  std::uint64_t envelopes_sent = 0;
  std::uint64_t envelopes_received = 0;
  std::uint64_t send_refused = 0;          ///< route() errors (overloaded, unreachable, ...)
  std::uint64_t rejected_inbound = 0;      ///< undecodable, unknown peer, spoofed sender node
  std::uint64_t deliver_failed = 0;        ///< deliver_remote refused (actor gone, mailbox full)
  std::uint64_t watches_sent = 0;
  std::uint64_t watches_received = 0;
  std::uint64_t downs_for_lost_nodes = 0;  ///< downs made up here because a peer was lost
  std::uint64_t requests_failed_on_loss = 0;
  std::uint64_t tracked_requests_evicted = 0;
};

class control_router final : public actors::remote_router {
 public:
  control_router(actors::actor_system& sys, router_options opts = {});
  ~control_router() override;

  /// The control node to send through (null: detach; sends then fail with errc::closed). Waits
  /// for sends in flight, so the node may be destroyed once this returns.
  void bind(control::control_node* node);

  /// Maps actor node `node` to control peer `peer_id` (which must be added to the control node,
  /// see remote_node::add_node). Errors: invalid_argument (self, empty id), and re-mapping a peer
  /// id to another node.
  [[nodiscard]] result<void> map_node(actors::node_id node, std::string peer_id);

  [[nodiscard]] result<void> route(actors::envelope&& env) override;
  [[nodiscard]] result<void> monitor(const actors::actor_ref& target,
                                     const actors::actor_ref& watcher) override;

  /// Feed from the control node's handlers. on_message returns false for types it does not own
  /// (the caller may hand those to other modules).
  bool on_message(const control::inbound_message& m);
  void on_peer_event(const control::peer_event& e);

  [[nodiscard]] router_stats stats() const;
  /// Remote watches and tracked requests currently held (tests, diagnostics).
  [[nodiscard]] std::size_t watch_count() const;
  [[nodiscard]] std::size_t tracked_requests() const;

 private:
  struct peer_state {
    std::string peer_id;
    bool lost = false;       // a down event came and no up since
    std::string lost_why;
  };
  struct watch {
    actors::actor_ref target;
    actors::actor_ref watcher;
  };
  struct tracked_request {
    actors::node_id node = 0;
    actors::actor_ref requester;
    actors::actor_ref target;
  };

  result<void> send_frame(const std::string& peer, std::uint16_t type,
                          const std::vector<char>& body);
  void handle_envelope(const control::inbound_message& m, actors::node_id from);
  void handle_watch(const control::inbound_message& m, actors::node_id from);
  void node_lost(actors::node_id node, const std::string& why);
  void deliver_down(const actors::actor_ref& target, const actors::actor_ref& watcher,
                    actors::exit_reason reason);
  void fail_request(const tracked_request& t, std::uint64_t request_id, const std::string& why);

  actors::actor_system& sys_;
  router_options opts_;

  std::shared_mutex node_mutex_;  // guards node_ against bind(nullptr) during a send
  control::control_node* node_ = nullptr;

  mutable std::mutex mutex_;  // everything below
  std::unordered_map<actors::node_id, peer_state> nodes_;
  std::unordered_map<std::string, actors::node_id> peers_;  // control peer id -> actor node
  std::unordered_map<actors::node_id, std::vector<watch>> watches_;
  std::size_t watch_total_ = 0;
  std::map<std::uint64_t, tracked_request> requests_;  // by request id: begin() is the oldest

  struct counters {
    std::atomic<std::uint64_t> envelopes_sent{0}, envelopes_received{0}, send_refused{0},
        rejected_inbound{0}, deliver_failed{0}, watches_sent{0}, watches_received{0},
        downs_for_lost_nodes{0}, requests_failed_on_loss{0}, tracked_requests_evicted{0};
  };
  counters ctr_;
};

/// A control node and a control_router wired together and installed as `sys`'s router.
/// Destroy it (or call stop()) before the actor system: stop() detaches the router first.
class remote_node {
 public:
  /// Starts the control node with handlers feeding the router and installs the router in `sys`.
  /// `handlers` receive what the router does not own (other application types, every peer event).
  [[nodiscard]] static result<std::unique_ptr<remote_node>> start(
      actors::actor_system& sys, control::node_config cfg, router_options opts = {},
      control::node_handlers handlers = {});
  ~remote_node();
  remote_node(const remote_node&) = delete;
  remote_node& operator=(const remote_node&) = delete;

  /// Maps actor node `node` to control peer `peer_id` at `endpoint` and connects to it.
  [[nodiscard]] result<void> add_node(actors::node_id node, const std::string& peer_id,
                                      const std::string& endpoint);

  [[nodiscard]] control::control_node& control() { return *control_; }
  [[nodiscard]] control_router& router() { return *router_; }
  [[nodiscard]] const std::string& endpoint() const { return control_->endpoint(); }

  /// Uninstalls the router from the system, detaches it and stops the control node. Idempotent.
  void stop();

 private:
  remote_node(actors::actor_system& sys, std::shared_ptr<control_router> router)
      : sys_(sys), router_(std::move(router)) {}
  actors::actor_system& sys_;
  std::shared_ptr<control_router> router_;
  std::unique_ptr<control::control_node> control_;
  bool stopped_ = false;
};

}  // namespace tessera::transport::remote
