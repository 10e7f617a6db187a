#include "mesh/serving/client_port.hpp"

#include <malloc.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/base/thread.hpp"

namespace tessera::mesh::serving {

namespace {

/// Largest message a client may send to the response port (XPUB): a subscription is 1 + topic
/// bytes, the longest topic `<id>:` is max_id_bytes + 1. The bound also applies to the CURVE
/// handshake under --client-auth (INITIATE with its vouch and metadata is ~300 bytes; 256 refused
/// every keyed client) and to each encrypted frame's overhead: 1 KiB covers both.
inline constexpr std::size_t kMaxSubscriptionBytes = 1024;
static_assert(kMaxSubscriptionBytes >= 2 + max_id_bytes && 128 >= 2 + max_id_bytes);
/// Response topics a peer honours subscriptions to at once (`:peers` aside): the in-flight
/// requests of every client connected to it (a peer runs 8 streams and queues 64; clients
/// subscribe on every peer), while a flood of distinct topics is refused (counted).
inline constexpr std::size_t kMaxSubscribedTopics = 512;
/// Subscription bytes (topics + 1) libzmq may hold for the response port's connections. libzmq
/// keeps every subscription a connection sends, honoured or refused, in a trie of one node per
/// byte (~100-200x the topic bytes, measured: 10 MB of topics once cost the peer 860 MB, and a
/// budget of 64 KiB bounded a flood to +6-8 MB of peak RSS). Honest clients hold `:peers` and
/// their requests' topics (<= 66 bytes each): kMaxSubscribedTopics of them are 34 KB.
inline constexpr std::size_t kMaxSubscriptionTrieBytes = 64 * 1024;
/// A request read before its topic's subscription waits this long for it (the two travel on
/// different connections), at most this many at once (the oldest make way: a flood of requests
/// nobody subscribes to only ever costs this much).
inline constexpr auto kAwaitSubscriber = std::chrono::milliseconds(250);
inline constexpr std::size_t kMaxAwaitingSubscriber = 256;

}  // namespace

client_port::client_port(client_port_options options, request_sink on_request)
    : opt_(std::move(options)), on_request_(std::move(on_request)) {}

client_port::~client_port() {
  stop();
}

result<std::unique_ptr<client_port>> client_port::open(client_port_options options,
                                                       request_sink on_request) {
  std::unique_ptr<client_port> p(new client_port(std::move(options), std::move(on_request)));
  try {
    auto bind = [&](zmq::socket_t& s, std::uint16_t port) -> std::uint16_t {
      s.set(zmq::sockopt::linger, 200);
      s.bind(
          fmt::format("tcp://{}:{}", p->opt_.bind_address, port == 0 ? "*" : std::to_string(port)));
      const std::string ep = s.get(zmq::sockopt::last_endpoint);
      return static_cast<std::uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
    };
    // The ZAP handler must be bound before the endpoints accept their first connection. It
    // names each request connection (the identity of fair shares) and, under --client-auth,
    // admits only the cluster's client key.
    p->zap_.emplace(p->zctx_, zmq::socket_type::rep);
    p->zap_->set(zmq::sockopt::linger, 0);
    p->zap_->bind("inproc://zeromq.zap.01");
    p->guard_ = std::make_unique<connection_guard>(p->zctx_, p->opt_.limits, p->opt_.node_hex);
    p->guard_->watch(0, p->sub_);
    p->sub_.set(zmq::sockopt::zap_domain, "tessera-clients");
    if (p->opt_.client_auth) {
      const std::string secret =
          transport::control::z85_key(p->opt_.client_auth->client_endpoint.secret_key);
      p->sub_.set(zmq::sockopt::curve_server, 1);
      p->sub_.set(zmq::sockopt::curve_secretkey, secret);
    }
    p->sub_.set(zmq::sockopt::rcvhwm, 10000);
    p->sub_.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_message_bytes + 1024));
    p->sub_.set(zmq::sockopt::subscribe, request_topic);
    p->req_port_ = bind(p->sub_, p->opt_.request_port);
    p->configure_response_port();
    p->guard_->watch(1, p->xpub_);
    p->resp_port_ = bind(p->xpub_, p->opt_.response_port);
    p->inproc_ = fmt::format("inproc://serving-{}", static_cast<void*>(p.get()));
    p->pull_.bind(p->inproc_);
  } catch (const zmq::error_t& e) {
    return make_error(errc::io,
                      "serving: cannot bind the client endpoints on {} (ports {}, {}): {}",
                      p->opt_.bind_address, p->opt_.request_port, p->opt_.response_port, e.what());
  }
  return p;
}

zmq::socket_t client_port::sender() {
  zmq::socket_t push(zctx_, zmq::socket_type::push);
  push.set(zmq::sockopt::sndhwm, 100000);
  push.connect(inproc_);
  return push;
}

void client_port::start() {
  if (!io_thread_.joinable()) io_thread_ = std::thread([this] { io_loop(); });
}

void client_port::stop() {
  if (stopping_.exchange(true)) return;
  if (io_thread_.joinable()) io_thread_.join();
  if (guard_) {  // the monitors stop while their sockets are open (see connection_guard::forget)
    guard_->forget(0);
    guard_->forget(1);
  }
  sub_.close();
  xpub_.close();
  pull_.close();
  if (zap_) zap_->close();
  guard_.reset();  // its monitor sockets, before the context ends
}

void client_port::set_peer_list(std::vector<std::string> endpoints,
                                std::vector<std::string> nodes) {
  std::lock_guard lock(mu_);
  if (nodes != nodes_) {
    nodes_ = std::move(nodes);
    peers_changed_ = true;
  }
  endpoints_ = std::move(endpoints);
}

std::vector<std::string> client_port::take_unread(clock_type::time_point now,
                                                  clock_type::duration after) {
  std::vector<std::string> out;
  std::lock_guard lock(mu_);
  for (auto it = unsubscribed_since_.begin(); it != unsubscribed_since_.end();) {
    if (now - it->second < after) {
      ++it;
      continue;
    }
    out.push_back(it->first);
    it = unsubscribed_since_.erase(it);
  }
  return out;
}

nlohmann::ordered_json client_port::status() const {
  nlohmann::ordered_json j;
  j["client_auth"] = {{"required", opt_.client_auth.has_value()},
                      {"admitted", auth_allowed_.load()},
                      {"refused", auth_denied_.load()}};
  j["unread"] = {{"subscriptions_refused", subscriptions_refused_.load()},
                 {"response_port_resets", response_port_resets_.load()},
                 {"requests_ignored", unread_requests_.load()}};
  j["connections"] = {{"open", connections_open_.load()},
                      {"refused", connections_refused_.load()},
                      {"per_address_bound", opt_.limits.per_address},
                      {"bound", opt_.limits.total}};
  j["connections_seen"] = connections_seen_.load();
  return j;
}

void client_port::io_loop() {
  name_this_thread("serve-io");
  zmq::pollitem_t items[] = {{sub_.handle(), 0, ZMQ_POLLIN, 0},
                             {pull_.handle(), 0, ZMQ_POLLIN, 0},
                             {xpub_.handle(), 0, ZMQ_POLLIN, 0},
                             {zap_->handle(), 0, ZMQ_POLLIN, 0},
                             {guard_->monitor_handle(0), 0, ZMQ_POLLIN, 0},
                             {guard_->monitor_handle(1), 0, ZMQ_POLLIN, 0}};
  auto next_peers = clock_type::now();
  while (!stopping_.load()) {
    try {
      items[2].socket = xpub_.handle();  // a reset replaces the socket and its monitor
      items[5].socket = guard_->monitor_handle(1);
      zmq::poll(items, 6, std::chrono::milliseconds(response_unbound_ ? 10 : 100));
      if (response_unbound_) bind_response_port();
      // Connections first: one past a bound is shut down before it is read from.
      for (int slot = 0; slot < 2; ++slot)
        if (items[4 + slot].revents & ZMQ_POLLIN) guard_->drain(slot);
      connections_open_ = guard_->ledger().open();
      connections_refused_ = guard_->refused();
      if (items[3].revents & ZMQ_POLLIN) answer_zap();
      // Subscriptions first: a client subscribes to a request's topic before it publishes the
      // request, and the request must find that subscription here.
      if (items[2].revents & ZMQ_POLLIN && drain_subscriptions()) next_peers = clock_type::now();
      if (items[0].revents & ZMQ_POLLIN) on_request_frames();
      expire_awaiting();
      if (items[1].revents & ZMQ_POLLIN) forward_responses();
      if (peers_changed_.exchange(false) || clock_type::now() >= next_peers) {
        publish_peers();
        next_peers = clock_type::now() + std::chrono::seconds(2);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::warn("serving {}: client endpoint: {}", opt_.node_hex, e.what());
    }
  }
  // Last messages (the shutdown errors) go out before the sockets close.
  try {
    forward_responses();
  } catch (const zmq::error_t&) {
  }
}

/// ZAP (RFC 27) for the client endpoints: admits a CURVE client presenting the cluster's client
/// access key, refuses everything else (counted; logged at most once a second).
void client_port::answer_zap() {
  for (int n = 0; n < 64; ++n) {
    std::vector<zmq::message_t> parts;
    zmq::message_t m;
    if (!zap_->recv(m, zmq::recv_flags::dontwait)) return;
    parts.push_back(std::move(m));
    while (parts.back().more() && parts.size() < 16) {
      zmq::message_t next;
      (void)zap_->recv(next, zmq::recv_flags::none);
      parts.push_back(std::move(next));
    }
    // version, request id, domain, address, identity, mechanism[, credentials (the key)].
    // Open endpoints ask only for the user id (the NULL mechanism); keyed ones for CURVE with
    // the cluster's client key.
    const bool allow =
        parts.size() >= 6 && parts[0].to_string_view() == "1.0" &&
        (opt_.client_auth
             ? parts.size() == 7 && parts[5].to_string_view() == "CURVE" && parts[6].size() == 32 &&
                   std::memcmp(parts[6].data(), opt_.client_auth->allowed_client.data(), 32) == 0
             : parts[5].to_string_view() == "NULL");
    if (allow) {
      if (opt_.client_auth) auth_allowed_.fetch_add(1);
    } else {
      auth_denied_.fetch_add(1);
      const auto now = clock_type::now();
      if (now - last_auth_log_ >= std::chrono::seconds(1)) {
        last_auth_log_ = now;
        spdlog::warn(
            "serving {}: refused a client from {}: not the cluster's client access key "
            "({} refused so far)",
            opt_.node_hex, parts.size() > 3 ? parts[3].to_string() : "?", auth_denied_.load());
      }
    }
    const std::string request_id = parts.size() > 1 ? parts[1].to_string() : std::string();
    zap_->send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(request_id), zmq::send_flags::sndmore);
    zap_->send(allow ? zmq::str_buffer("200") : zmq::str_buffer("400"), zmq::send_flags::sndmore);
    zap_->send(allow ? zmq::str_buffer("OK") : zmq::str_buffer("not this cluster's client key"),
               zmq::send_flags::sndmore);
    // The user id names the connection: every message it carries has it as "User-Id", the
    // identity fair_share counts by. Clients share one access key, so the key cannot tell
    // them apart; a connection can (and connections per address are bounded).
    const std::string user =
        fmt::format("{}#{}", parts.size() > 3 ? parts[3].to_string() : "?", ++connections_seen_);
    zap_->send(zmq::buffer(user), zmq::send_flags::sndmore);
    zap_->send(zmq::str_buffer(""), zmq::send_flags::none);  // metadata
  }
}

void client_port::on_request_frames() {
  for (int n = 0; n < 256; ++n) {  // bounded batch: the forward path is served in between
    std::vector<zmq::message_t> parts;
    zmq::message_t m;
    if (!sub_.recv(m, zmq::recv_flags::dontwait)) return;
    parts.push_back(std::move(m));
    while (parts.back().more() && parts.size() < 4) {
      zmq::message_t more;
      (void)sub_.recv(more, zmq::recv_flags::none);
      parts.push_back(std::move(more));
    }
    // Discard the rest of an over-long message.
    while (parts.back().more()) {
      zmq::message_t rest;
      (void)sub_.recv(rest, zmq::recv_flags::none);
      if (!rest.more()) break;
    }
    if (parts.size() != 2 || parts[0].to_string_view() != request_topic) {
      note_malformed("expected 2 frames [\"req\"][msgpack request]");
      continue;
    }
    auto r = decode_request(parts[1].to_string_view());
    if (!r) {
      note_malformed(r.error().message);
      continue;
    }
    // Set by ZAP for the connection (see answer_zap): the client's identity, not its word.
    const char* user = zmq_msg_gets(parts[1].handle(), "User-Id");
    r->client = user != nullptr ? user : "";
    // Only a request whose answer someone subscribed to reaches the engine: serving one nobody
    // reads would only hold a slot (a flood of them starved every client who reads). Its
    // subscription may still be on its way (a client subscribes, then publishes, over two
    // connections): held here briefly rather than dropped to wait for a re-publication.
    if (!r->cancel && !topic_subscribers_.contains(r->id)) {
      if (awaiting_subscriber_.size() >= kMaxAwaitingSubscriber) {
        awaiting_subscriber_.pop_front();
        ++unread_requests_;
      }
      awaiting_subscriber_.push_back({clock_type::now() + kAwaitSubscriber, std::move(*r)});
      continue;
    }
    to_engine(std::move(*r));
  }
}

/// Hands a request to the engine: its queue is bounded (a request beyond it is dropped and counted
/// there; the client re-publishes, so that is a loss, never a wrong answer).
void client_port::to_engine(request&& r) {
  on_request_(std::move(r));
}

/// Requests whose subscription did not come within kAwaitSubscriber: nobody reads them.
void client_port::expire_awaiting() {
  const auto now = clock_type::now();
  while (!awaiting_subscriber_.empty() && awaiting_subscriber_.front().until <= now) {
    awaiting_subscriber_.pop_front();
    ++unread_requests_;
  }
}

void client_port::note_malformed(const std::string& why) {
  const auto n = ++malformed_;
  // Logged for the first few and then every 1000th: a flood must not flood the log too.
  if (n <= 10 || n % 1000 == 0)
    spdlog::warn("serving {}: malformed client message #{} dropped: {}", opt_.node_hex, n, why);
}

void client_port::forward_responses() {
  for (int n = 0; n < 1024; ++n) {
    zmq::message_t topic, body;
    if (!pull_.recv(topic, zmq::recv_flags::dontwait)) return;
    (void)pull_.recv(body, zmq::recv_flags::none);
    (void)xpub_.send(topic, zmq::send_flags::sndmore);
    (void)xpub_.send(body, zmq::send_flags::none);
  }
}

/// The response port's options (at start, and when it is reset).
void client_port::configure_response_port() {
  if (opt_.client_auth) {
    xpub_.set(zmq::sockopt::curve_server, 1);
    xpub_.set(zmq::sockopt::curve_secretkey,
              transport::control::z85_key(opt_.client_auth->client_endpoint.secret_key));
    xpub_.set(zmq::sockopt::zap_domain, "tessera-clients");
  }
  xpub_.set(zmq::sockopt::linger, 200);
  xpub_.set(zmq::sockopt::sndhwm, 100000);
  // libzmq moves subscriptions from a connection into its trie as we read the socket; a small
  // inbound bound makes it take them a batch at a time, so the budget check below sees them
  // before libzmq holds much more than the budget.
  xpub_.set(zmq::sockopt::rcvhwm, 256);
  // Every subscription reaches us (not only a topic's first): each new client asking for the
  // peer list gets it at once.
  xpub_.set(zmq::sockopt::xpub_verbose, 1);
  // Manual: we decide which subscriptions take effect (drain_subscriptions()).
  xpub_.set(zmq::sockopt::xpub_manual, 1);
  // What a client sends to the response port is subscriptions: one byte and a topic of at most
  // max_id_bytes + 1. Anything longer closes the connection before it is buffered (without the
  // bound one frame of N bytes cost the peer ~2N of memory, before any authentication).
  // Without CURVE nothing longer than a subscription needs to pass (the NULL handshake's
  // READY is ~40 bytes): 128 keeps a refused topic's cost to the trie small as well.
  xpub_.set(zmq::sockopt::maxmsgsize,
            static_cast<std::int64_t>(opt_.client_auth ? kMaxSubscriptionBytes : 128));
}

/// The subscriptions libzmq holds exceeded their budget: close the response port and bind it
/// again, which drops every connection and with it every subscription libzmq kept (refused
/// ones too: there is no way to drop one connection's). Clients reconnect by themselves and
/// send their subscriptions again (ZeroMQ does both); a stream's tokens published meanwhile
/// are a gap its client resumes over. The flooder's subscriptions come back only to be
/// dropped again: the peer's memory stays bounded.
void client_port::reset_response_port() {
  ++response_port_resets_;
  spdlog::warn(
      "serving {}: the response port held {} bytes of subscriptions (budget {}): reset, every "
      "client reconnects (reset #{})",
      opt_.node_hex, subscription_bytes_, kMaxSubscriptionTrieBytes, response_port_resets_.load());
  const auto now = clock_type::now();
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, n] : topic_subscribers_)
      unsubscribed_since_.try_emplace(id, now);
  }
  topic_subscribers_.clear();
  subscription_bytes_ = 0;
  guard_->forget(1);
  xpub_.close();
  xpub_ = zmq::socket_t(zctx_, zmq::socket_type::xpub);
  configure_response_port();
  guard_->watch(1, xpub_);
  response_unbound_ = true;
  unbound_since_ = clock_type::now();
  unbound_logged_ = false;
  bind_response_port();
}

/// Binds the response port again after a reset; left unbound (tried again by the io loop) while
/// the old listener still holds the port. An unbound port 5 s on is logged once: clients cannot
/// subscribe to this peer meanwhile (they resume their streams elsewhere).
void client_port::bind_response_port() {
  const std::string ep = fmt::format("tcp://{}:{}", opt_.bind_address, resp_port_);
  try {
    xpub_.bind(ep);
  } catch (const zmq::error_t& e) {
    const auto waited = clock_type::now() - unbound_since_;
    if (!unbound_logged_ && waited > std::chrono::seconds(5)) {
      unbound_logged_ = true;
      spdlog::error("serving {}: the response port {} is not bound again after 5 s ({}); trying on",
                    opt_.node_hex, ep, e.what());
    }
    return;
  }
  response_unbound_ = false;
  if (unbound_logged_)
    spdlog::info("serving {}: the response port {} is bound again", opt_.node_hex, ep);
  ::malloc_trim(0);  // give the dropped tries' pages back
}

/// Reads the subscription messages; true when someone subscribed to the peer list (it gets
/// the list at once instead of within 2 s).
///
/// The XPUB is in manual mode: a subscription reaches clients only when we honour it here,
/// right after reading it (libzmq applies it to the connection it came from). We honour the
/// peer list and exact response topics `<id>:` only, so nobody can subscribe to a prefix (""
/// would be every stream on the port) and read other clients' request ids and tokens: a
/// request's id is the capability to read, cancel and resume it (docs/PROTOCOL.md).
bool client_port::drain_subscriptions() {
  bool wants_peers = false;
  for (int n = 0; n < 1024; ++n) {
    zmq::message_t m;
    if (!xpub_.recv(m, zmq::recv_flags::dontwait)) break;
    const auto v = m.to_string_view();
    if (v.empty() || (v[0] != '\x00' && v[0] != '\x01')) continue;
    const bool subscribe = v[0] == '\x01';
    const auto topic = v.substr(1);
    // What libzmq keeps of it: every subscription, honoured or not, until an unsubscription
    // or the connection's end (which sends us one per topic).
    if (subscribe)
      subscription_bytes_ += topic.size() + 1;
    else
      subscription_bytes_ -= std::min(subscription_bytes_, topic.size() + 1);
    if (topic == peers_topic) {
      if (subscribe)
        xpub_.set(zmq::sockopt::subscribe, topic);
      else
        xpub_.set(zmq::sockopt::unsubscribe, topic);
      wants_peers = wants_peers || subscribe;
      continue;
    }
    const bool response_topic =
        topic.size() >= 2 && topic.back() == ':' && valid_id(topic.substr(0, topic.size() - 1));
    const std::string id(response_topic ? topic.substr(0, topic.size() - 1) : "");
    if (subscribe) {
      if (!response_topic ||
          (topic_subscribers_.size() >= kMaxSubscribedTopics && !topic_subscribers_.contains(id))) {
        ++subscriptions_refused_;
        continue;
      }
      xpub_.set(zmq::sockopt::subscribe, topic);
      if (topic_subscribers_[id]++ == 0) {
        {
          std::lock_guard lock(mu_);
          unsubscribed_since_.erase(id);
        }
        // Requests that arrived before their subscription go ahead now.
        for (auto it = awaiting_subscriber_.begin(); it != awaiting_subscriber_.end();) {
          if (it->req.id != id) {
            ++it;
            continue;
          }
          to_engine(std::move(it->req));
          it = awaiting_subscriber_.erase(it);
        }
      }
      continue;
    }
    // An unsubscription: the client's own, or libzmq's for each topic of a connection that
    // closed (then no connection is current and the call below changes nothing).
    auto it = response_topic ? topic_subscribers_.find(id) : topic_subscribers_.end();
    if (it == topic_subscribers_.end()) continue;  // one we refused
    xpub_.set(zmq::sockopt::unsubscribe, topic);
    if (--it->second == 0) {
      topic_subscribers_.erase(it);
      std::lock_guard lock(mu_);
      unsubscribed_since_[id] = clock_type::now();
    }
  }
  if (subscription_bytes_ > kMaxSubscriptionTrieBytes) reset_response_port();
  return wants_peers;
}

void client_port::publish_peers() {
  response r;
  r.kind = "peers";
  r.node = opt_.node_hex;
  {
    std::lock_guard lock(mu_);
    r.peers = endpoints_;
    r.nodes = nodes_;
  }
  if (r.nodes.size() > max_peers) r.nodes.resize(max_peers);
  if (r.peers.size() > max_peers) r.peers.resize(max_peers);
  const std::string body = encode(r);
  (void)xpub_.send(zmq::buffer(peers_topic), zmq::send_flags::sndmore);
  (void)xpub_.send(zmq::buffer(body), zmq::send_flags::none);
}

}  // namespace tessera::mesh::serving
