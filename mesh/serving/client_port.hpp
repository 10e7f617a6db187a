// The client endpoints of one peer (docs/PROTOCOL.md): the request SUB, the response XPUB, their
// ZAP handler and connection bounds, and the io thread ("serve-io") that owns all of them.
//
// One concern: bytes in and out of client connections. Requests are decoded here and handed to
// the engine through `on_request` (the engine's bounded inbox), only once someone subscribed to
// their answer; the engine publishes through its own PUSH socket (sender()), which this thread
// forwards to the XPUB. The subscription rules (exact topics only, a budget of trie bytes, a
// bound on topics), the peer list, and which topics lost their last reader live here too, since
// only the thread reading the XPUB sees subscriptions. Nothing here knows models or sessions.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "actors/base/result.hpp"
#include "mesh/serving/client_auth.hpp"
#include "mesh/serving/connection_guard.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::serving {

struct client_port_options {
  std::string node_hex;                ///< in log lines and the peer list
  std::string bind_address;            ///< where both endpoints bind
  std::uint16_t request_port = 7402;   ///< SUB; 0 = any free port
  std::uint16_t response_port = 7403;  ///< XPUB; 0 = any free port
  connection_limits limits;
  std::optional<client_auth_keys> client_auth;  ///< empty: open endpoints (NULL mechanism)
};

class client_port {
 public:
  using clock_type = std::chrono::steady_clock;
  /// Called on the io thread with each decoded request whose response topic has a subscriber
  /// here (cancels at once). Must not block: the engine queues it (bounded) and returns.
  using request_sink = std::function<void(request&&)>;

  /// Binds both endpoints (errors name the address and ports); the io thread starts in start().
  [[nodiscard]] static result<std::unique_ptr<client_port>> open(client_port_options options,
                                                                 request_sink on_request);
  ~client_port();
  client_port(const client_port&) = delete;
  client_port& operator=(const client_port&) = delete;

  /// A PUSH socket whose messages ([topic][body]) this port publishes on the XPUB. For one
  /// thread (the engine's); close it after stop() and before this port is destroyed (its
  /// context waits for every socket made in it).
  [[nodiscard]] zmq::socket_t sender();
  void start();
  /// Forwards what the senders queued last (the shutdown errors), then closes every socket.
  void stop();

  [[nodiscard]] std::uint16_t request_port() const { return req_port_; }
  [[nodiscard]] std::uint16_t response_port() const { return resp_port_; }

  /// The peer list clients get (`:peers`): the members' client endpoints and node ids. Published
  /// at once when `nodes` changed (a client whose serving peer left resumes now), else every 2 s.
  /// Any thread.
  void set_peer_list(std::vector<std::string> endpoints, std::vector<std::string> nodes);
  /// Request ids whose response topic has had no subscriber here for at least `after`; each is
  /// returned once (and forgotten). Any thread.
  [[nodiscard]] std::vector<std::string> take_unread(clock_type::time_point now,
                                                     clock_type::duration after);

  /// malformed messages, connections, authentication, subscriptions: for `tessera status`.
  [[nodiscard]] std::uint64_t malformed() const { return malformed_.load(); }
  /// {"client_auth", "unread", "connections", "connections_seen"} fields of the engine's status.
  [[nodiscard]] nlohmann::ordered_json status() const;

 private:
  client_port(client_port_options options, request_sink on_request);
  void io_loop();
  void answer_zap();
  void on_request_frames();
  void to_engine(request&& r);
  void expire_awaiting();
  void note_malformed(const std::string& why);
  void forward_responses();
  void configure_response_port();
  void reset_response_port();
  void bind_response_port();
  bool drain_subscriptions();
  void publish_peers();

  client_port_options opt_;
  request_sink on_request_;
  zmq::context_t zctx_{1};
  zmq::socket_t sub_{zctx_, zmq::socket_type::sub};
  zmq::socket_t xpub_{zctx_, zmq::socket_type::xpub};
  zmq::socket_t pull_{zctx_, zmq::socket_type::pull};
  std::string inproc_;  // pull_'s address, for sender()
  // The ZAP handler of this context (bound before the endpoints).
  std::optional<zmq::socket_t> zap_;
  // Bounds the endpoints' connections (slot 0: the request port, 1: the response port).
  std::unique_ptr<connection_guard> guard_;
  std::uint16_t req_port_ = 0, resp_port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread io_thread_;

  // --- shared with other threads (under mu_) ---
  mutable std::mutex mu_;
  std::vector<std::string> endpoints_, nodes_;
  std::atomic<bool> peers_changed_{false};
  // Request ids whose response topic lost its last subscriber here, and since when. At most
  // kMaxSubscribedTopics entries: only a topic that was subscribed can lose its subscriber.
  std::unordered_map<std::string, clock_type::time_point> unsubscribed_since_;

  // --- io thread only ---
  // Subscribers per response topic (request id), and the bytes of every subscription libzmq
  // holds for the XPUB's connections (kMaxSubscriptionTrieBytes).
  std::unordered_map<std::string, std::uint32_t> topic_subscribers_;
  std::size_t subscription_bytes_ = 0;
  // Requests read before their topic's subscription, oldest first (kMaxAwaitingSubscriber).
  struct awaiting {
    clock_type::time_point until;
    request req;
  };
  std::deque<awaiting> awaiting_subscriber_;
  clock_type::time_point last_auth_log_{};
  // A reset's new response port waits for the old listener to close (libzmq closes it on its
  // own threads): until it is bound, the io loop tries again every 10 ms, answering ZAP and
  // requests meanwhile (a loop here that waited for it could wait for the very handshakes
  // whose ZAP answers it held up).
  bool response_unbound_ = false;
  clock_type::time_point unbound_since_{};
  bool unbound_logged_ = false;

  // --- counters: written by the io thread, read by status() ---
  std::atomic<std::uint64_t> malformed_{0}, subscriptions_refused_{0}, unread_requests_{0},
      response_port_resets_{0}, auth_allowed_{0}, auth_denied_{0}, connections_open_{0},
      connections_refused_{0};
  // Numbers the request connections' user ids (the identity fair shares count by).
  std::atomic<std::uint64_t> connections_seen_{0};
};

}  // namespace tessera::mesh::serving
