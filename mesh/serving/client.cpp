#include "mesh/serving/client.hpp"

#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>
#include <zmq.hpp>

namespace tessera::mesh::serving {

using clock_type = std::chrono::steady_clock;

namespace {

std::optional<std::uint16_t> port_of(std::string_view s) {
  unsigned v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v == 0 || v > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(v);
}

}  // namespace

result<peer_endpoint> parse_peer(std::string_view text) {
  const auto bad = [&] {
    return make_error(errc::invalid_argument,
                      "peer '{}': expected host:request_port or host:request_port:response_port",
                      text);
  };
  const auto c1 = text.find(':');
  if (c1 == std::string_view::npos || c1 == 0) return bad();
  peer_endpoint e;
  e.host = std::string(text.substr(0, c1));
  const auto rest = text.substr(c1 + 1);
  const auto c2 = rest.find(':');
  auto req = port_of(rest.substr(0, c2));
  if (!req) return bad();
  e.request_port = *req;
  if (c2 == std::string_view::npos) {
    if (*req == 65535) return bad();
    e.response_port = static_cast<std::uint16_t>(*req + 1);
  } else {
    auto resp = port_of(rest.substr(c2 + 1));
    if (!resp) return bad();
    e.response_port = *resp;
  }
  return e;
}

struct client::impl {
  client_options opt;
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  // Handshake events of `sub` (it connects to every peer, with the same keys as `pub`): a peer
  // that refuses us is otherwise silent, and the request would only time out.
  zmq::socket_t monitor{ctx, zmq::socket_type::pair};
  std::set<std::string> connected;  // "host:request_port:response_port"
  // Why each endpoint's last handshake failed (until it succeeds), and those that succeeded.
  std::map<std::string, std::string> refused;
  std::set<std::string> shook_hands;

  ~impl() { (void)zmq_socket_monitor(sub.handle(), nullptr, 0); }

  void watch_handshakes() {
    const std::string addr = fmt::format("inproc://client-monitor-{}", static_cast<void*>(this));
    if (zmq_socket_monitor(sub.handle(), addr.c_str(),
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0) {
      throw zmq::error_t();
    }
    monitor.connect(addr);
  }

  void read_handshake_events() {
    for (int n = 0; n < 64; ++n) {
      zmq::message_t head, where;
      if (!monitor.recv(head, zmq::recv_flags::dontwait)) return;
      if (!head.more() || !monitor.recv(where, zmq::recv_flags::none) || head.size() < 6) continue;
      std::uint16_t event = 0;
      std::uint32_t value = 0;
      std::memcpy(&event, head.data(), 2);
      std::memcpy(&value, static_cast<const char*>(head.data()) + 2, 4);
      const std::string ep = where.to_string();
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        shook_hands.insert(ep);
        refused.erase(ep);
        continue;
      }
      refused[ep] = why_refused(ep, event, value);
    }
  }

  std::string why_refused(const std::string& ep, std::uint16_t event, std::uint32_t value) const {
    namespace ctl = transport::control;
    // A peer that cannot decrypt our CURVE hello (another cluster's server key), or that speaks
    // CURVE to our plain hello, only drops the connection (no detail reaches us): the message
    // then says what we were, which is what decides the fix.
    if (!opt.access) {
      return fmt::format(
          "peer {} refused the connection: it requires client authentication "
          "(--client-auth): pass --client-key FILE or set {}",
          ep, ctl::kClientKeyEnv);
    }
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
      return fmt::format(
          "peer {} does not use client authentication but this client has a "
          "client key: leave out --client-key / {}",
          ep, ctl::kClientKeyEnv);
    }
    return fmt::format(
        "peer {} refused this client's key{}: it admits only its own cluster's "
        "client access key (`tessera keygen --client-key FILE` on a host that has "
        "the cluster key writes it)",
        ep,
        event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? ""
                                                 : " (or it does not use "
                                                   "client authentication)");
  }

  /// Every peer this client connects to refused its handshake, and none ever accepted one:
  /// nothing will ever answer. (A peer killed in the middle of a handshake fails it once too;
  /// as long as another peer is up, that one accepts, and the request goes on.)
  std::optional<std::string> all_refused() const {
    if (refused.empty() || !shook_hands.empty() || refused.size() < connected.size())
      return std::nullopt;
    return refused.begin()->second;
  }

  void connect_to(const peer_endpoint& e) {
    const auto key = fmt::format("{}:{}:{}", e.host, e.request_port, e.response_port);
    if (connected.size() >= max_peers || !connected.insert(key).second) return;
    pub.connect(fmt::format("tcp://{}:{}", e.host, e.request_port));
    sub.connect(fmt::format("tcp://{}:{}", e.host, e.response_port));
  }

  /// A peer list: connect to the peers not known yet (the requests they must see reach them on
  /// the next re-publish).
  void learn_peers(const response& m) {
    for (const auto& text : m.peers) {
      auto e = parse_peer(text);
      if (!e) continue;
      try {
        connect_to(*e);
      } catch (const zmq::error_t&) {
        // An address this machine cannot connect to: the other peers still can be used.
      }
    }
  }

  void publish(const request& r) {
    const std::string body = encode(r);
    (void)pub.send(zmq::buffer(request_topic), zmq::send_flags::sndmore);
    (void)pub.send(zmq::buffer(body), zmq::send_flags::none);
  }
};

client::client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
client::~client() = default;

result<std::unique_ptr<client>> client::connect(client_options options) {
  if (options.peers.empty())
    return make_error(errc::invalid_argument, "client: no peers to connect to");
  auto p = std::make_unique<impl>();
  p->opt = std::move(options);
  try {
    p->pub.set(zmq::sockopt::linger, 500);
    p->sub.set(zmq::sockopt::linger, 0);
    p->monitor.set(zmq::sockopt::linger, 0);
    if (p->opt.access) {
      namespace ctl = transport::control;
      for (zmq::socket_t* s : {&p->pub, &p->sub}) {
        s->set(zmq::sockopt::curve_serverkey, ctl::z85_key(p->opt.access->server_public));
        s->set(zmq::sockopt::curve_publickey, ctl::z85_key(p->opt.access->client.public_key));
        s->set(zmq::sockopt::curve_secretkey, ctl::z85_key(p->opt.access->client.secret_key));
      }
    }
    p->watch_handshakes();
    p->sub.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_message_bytes));
    p->sub.set(zmq::sockopt::subscribe, peers_topic);
    for (const auto& e : p->opt.peers)
      p->connect_to(e);
  } catch (const zmq::error_t& e) {
    return make_error(errc::invalid_argument, "client: cannot connect: {}", e.what());
  }
  return std::unique_ptr<client>(new client(std::move(p)));
}

result<outcome> client::ask(request r, const std::function<void(const token_event&)>& on_token,
                            const std::atomic<bool>* cancel, const std::atomic<bool>* stop) {
  if (auto v = validate(r); !v) return v.error();
  auto& s = *impl_;
  const std::string topic = response_topic(r.id);
  try {
    s.sub.set(zmq::sockopt::subscribe, topic);
  } catch (const zmq::error_t& e) {
    return make_error(errc::internal, "client: subscribe: {}", e.what());
  }
  struct unsubscribe_at_end {
    zmq::socket_t& sub;
    const std::string& topic;
    ~unsubscribe_at_end() {
      try {
        sub.set(zmq::sockopt::unsubscribe, topic);
      } catch (const zmq::error_t&) {
      }
    }
  } guard{s.sub, topic};

  const auto t0 = clock_type::now();
  const auto now_us = [&t0] {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - t0).count());
  };
  follower_options fo;
  fo.republish_ms = s.opt.republish_ms;
  fo.stall_ms = s.opt.stall_ms;
  fo.deadline_ms = s.opt.deadline_ms;
  fo.max_attempts = s.opt.max_attempts;
  stream_follower f(std::move(r), fo, now_us());
  s.publish(f.first_publication());

  while (true) {
    follower_step step;
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      step = f.cancel(now_us());
    } else if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
      step = f.stop_early(now_us());
    } else {
      step = f.on_tick(now_us());
    }
    if (step.publish) s.publish(*step.publish);
    if (step.done) return std::move(*step.done);

    // Wake for the follower's next deadline, or every 50 ms to look at `cancel`.
    const auto wait_us = std::min<std::uint64_t>(
        50'000, f.wake_at_us() > now_us() ? f.wake_at_us() - now_us() : 0);
    zmq::pollitem_t items[] = {{s.sub.handle(), 0, ZMQ_POLLIN, 0},
                               {s.monitor.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds((wait_us + 999) / 1000));
    } catch (const zmq::error_t& e) {
      return make_error(errc::internal, "client: poll: {}", e.what());
    }
    if (items[1].revents & ZMQ_POLLIN) {
      s.read_handshake_events();
      if (auto why = s.all_refused()) return error{errc::unauthorized, *why};
    }
    if (s.opt.unreachable_ms > 0 && s.shook_hands.empty() && !f.accepted() &&
        now_us() > std::uint64_t{s.opt.unreachable_ms} * 1000) {
      std::string where;
      for (const auto& p : s.opt.peers)
        where += fmt::format("{}{}:{}", where.empty() ? "" : ", ", p.host, p.request_port);
      return make_error(errc::timeout,
                        "no peer answers at {}: none accepted a connection within {} ms (is a "
                        "node running there, with these client ports?)",
                        where, s.opt.unreachable_ms);
    }
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    zmq::message_t t, body;
    if (!s.sub.recv(t, zmq::recv_flags::dontwait)) continue;
    if (!t.more()) continue;
    (void)s.sub.recv(body, zmq::recv_flags::none);
    while (body.more())
      (void)s.sub.recv(body, zmq::recv_flags::none);
    if (t.to_string_view() == peers_topic) {
      if (auto pm = decode_response(body.to_string_view()); pm && pm->kind == "peers") {
        s.learn_peers(*pm);
        step = f.on_peers(*pm, now_us());
        if (step.publish) s.publish(*step.publish);
        if (step.done) return std::move(*step.done);
      }
      continue;
    }
    if (t.to_string_view() != topic) continue;
    auto m = decode_response(body.to_string_view());
    if (!m) continue;
    step = f.on_response(*m, now_us());
    if (step.token && on_token) {
      const std::string_view text(m->text.data(), m->text.size());
      on_token({m->index, m->token, text, m->node, f.last_logprob()});
    }
    if (step.publish) s.publish(*step.publish);
    if (step.done) return std::move(*step.done);
  }
}

}  // namespace tessera::mesh::serving
