#include "mesh/serving/client.hpp"

#include <charconv>
#include <chrono>
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

errc errc_of(std::string_view code) {
  if (code == error_code::unknown_model) return errc::not_found;
  if (code == error_code::no_capacity) return errc::no_capacity;
  if (code == error_code::invalid_request) return errc::invalid_argument;
  if (code == error_code::overloaded) return errc::overloaded;
  return errc::internal;
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
  std::set<std::string> connected;  // "host:request_port:response_port"

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
                            const std::atomic<bool>* cancel) {
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

  outcome out;
  const auto t0 = clock_type::now();
  const auto deadline = t0 + std::chrono::milliseconds(s.opt.deadline_ms);
  r.attempt = 0;
  r.resume.clear();
  bool accepted = false;
  std::uint32_t republish_ms = std::min<std::uint32_t>(25, s.opt.republish_ms);
  auto last_publish = t0;
  auto last_heard = t0;
  s.publish(r);

  const auto resume = [&](std::string_view why) -> result<void> {
    if (r.attempt + 1 >= s.opt.max_attempts)
      return make_error(errc::timeout, "request {}: gave up after {} attempts (last: {})", r.id,
                        r.attempt + 1, why);
    ++r.attempt;
    r.resume = out.tokens;
    accepted = false;
    republish_ms = std::min<std::uint32_t>(25, s.opt.republish_ms);
    last_publish = last_heard = clock_type::now();
    s.publish(r);
    return ok();
  };

  while (true) {
    const auto now = clock_type::now();
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      // Tell the serving peer, so that it stops generating for nobody (docs/PROTOCOL.md).
      request c;
      c.id = r.id;
      c.attempt = r.attempt;
      c.cancel = true;
      s.publish(c);
      return make_error(errc::cancelled, "request {}: cancelled after {} tokens", r.id,
                        out.tokens.size());
    }
    if (now >= deadline)
      return make_error(errc::timeout, "request {}: {} after {} ms ({} tokens received)", r.id,
                        accepted ? "the stream stalled" : "no peer accepted it", s.opt.deadline_ms,
                        out.tokens.size());
    if (!accepted && now - last_publish >= std::chrono::milliseconds(republish_ms)) {
      // Not accepted yet: the peers may not have connected (a PUB drops what it sends before the
      // connection is up), or the plan may be moving. Early retries are quick, then back off.
      last_publish = now;
      republish_ms = std::min(republish_ms * 2, s.opt.republish_ms);
      s.publish(r);
    }
    if (accepted && now - last_heard >= std::chrono::milliseconds(s.opt.stall_ms))
      TESSERA_TRY(resume("the serving peer went silent"));

    zmq::pollitem_t item{s.sub.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
    } catch (const zmq::error_t& e) {
      return make_error(errc::internal, "client: poll: {}", e.what());
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;
    zmq::message_t t, body;
    if (!s.sub.recv(t, zmq::recv_flags::dontwait)) continue;
    if (!t.more()) continue;
    (void)s.sub.recv(body, zmq::recv_flags::none);
    while (body.more())
      (void)s.sub.recv(body, zmq::recv_flags::none);
    if (t.to_string_view() == peers_topic) {
      if (auto pm = decode_response(body.to_string_view()); pm && pm->kind == "peers")
        s.learn_peers(*pm);
      continue;
    }
    if (t.to_string_view() != topic) continue;
    auto m = decode_response(body.to_string_view());
    if (!m || m->id != r.id || m->attempt != r.attempt) continue;  // stale attempts are dropped
    last_heard = clock_type::now();
    if (m->kind == "accepted") {
      if (!accepted && (out.nodes.empty() || out.nodes.back() != m->node))
        out.nodes.push_back(m->node);
      accepted = true;
    } else if (m->kind == "token") {
      accepted = true;
      if (m->index < out.tokens.size()) continue;  // a duplicate
      if (m->index > out.tokens.size()) {
        TESSERA_TRY(
            resume(fmt::format("index {} arrived while {} was due", m->index, out.tokens.size())));
        continue;
      }
      if (out.tokens.empty())
        out.first_token_s = std::chrono::duration<double>(last_heard - t0).count();
      if (out.nodes.empty() || out.nodes.back() != m->node) out.nodes.push_back(m->node);
      out.tokens.push_back(m->token);
      const std::string_view text(m->text.data(), m->text.size());
      out.text.append(text);
      if (on_token) on_token({m->index, m->token, text, m->node});
    } else if (m->kind == "done") {
      if (m->tokens != out.tokens.size()) {
        TESSERA_TRY(
            resume(fmt::format("done after {} tokens, {} received", m->tokens, out.tokens.size())));
        continue;
      }
      out.stop = m->stop;
      out.prompt_tokens = m->prompt_tokens;
      out.attempts = r.attempt + 1;
      out.total_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      return out;
    } else if (m->kind == "error") {
      if (m->code == error_code::unavailable) {
        TESSERA_TRY(resume(m->message));
        continue;
      }
      return make_error(errc_of(m->code), "{} ({}, from peer {})", m->message, m->code, m->node);
    }
  }
}

}  // namespace tessera::mesh::serving
