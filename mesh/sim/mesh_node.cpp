#include "mesh/sim/mesh_node.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/logger.h>

#include "mesh/serving/intake.hpp"
#include "mesh/serving/planning.hpp"

namespace tessera::mesh::sim {

// The node's own msgpack helpers (mesh/runtime/messages.hpp), over the world's byte vectors.
template <class T>
bytes encode(const T& value) {
  const std::string s = runtime::pack(value);
  return bytes(s.begin(), s.end());
}

template <class T>
std::optional<T> decode(const bytes& data) {
  return runtime::unpack<T>(
      std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
}

// What tests read and edit in a node's durable bytes.
template bytes encode(const durable_election_state&);
template std::optional<durable_election_state> decode(const bytes&);

std::int32_t sim_token(const serving::request& r, std::int32_t prev, std::uint32_t index,
                       std::uint32_t vocab) {
  const std::uint64_t h = mix64(fnv1a64(r.prompt) ^ mix64(r.seed + 1) ^
                                mix64(static_cast<std::uint64_t>(prev + 2) << 20 | index));
  return static_cast<std::int32_t>(h % vocab);
}

std::vector<std::int32_t> sim_reference(const serving::request& r, std::uint32_t vocab) {
  std::vector<std::int32_t> out;
  std::int32_t prev = -1;
  for (std::uint32_t i = 0; i < r.max_tokens; ++i)
    out.push_back(prev = sim_token(r, prev, i, vocab));
  return out;
}

namespace {

/// The simulated nodes' logger: the core logs as in the node, but thousands of seeds must not
/// print every election (level off: nothing is even formatted).
std::shared_ptr<spdlog::logger> quiet_logger() {
  static const auto log = [] {
    auto l = std::make_shared<spdlog::logger>("sim-node");
    l->set_level(spdlog::level::off);
    return l;
  }();
  return log;
}

/// The simulated wall clock at global time 0 (a node's membership incarnation starts at its
/// wall-clock ms, as in `tessera node`).
constexpr std::uint64_t kSimEpochMs = 1'800'000'000'000;

}  // namespace

mesh_node::mesh_node(member_id self, const mesh_node_options& options, std::uint64_t seed)
    : self_(self), seed_(seed), options_(options) {}

void mesh_node::on_start(node_context& ctx) {
  ctx_ = &ctx;
  runtime::core_options o;
  o.self = self_;
  o.self_address = fmt::format("sim:{}", self_);
  o.hex = fmt::format("{:032x}", self_);
  o.settings = options_.control;
  o.membership_seed = seed_ * 31 + self_;
  o.election_seed = seed_ * 37 + self_;
  o.incarnation = kSimEpochMs + ctx.global_ms();
  if (!ctx.durable().empty()) {
    auto d = decode<durable_election_state>(ctx.durable());
    TESSERA_ASSERT(d.has_value(), "sim node {}: durable state does not decode", self_);
    o.restored = *d;
  }
  o.caps.node_id = o.hex;
  o.caps.cores = 2;
  o.caps.memory_total_mb = options_.memory_mb;
  o.caps.memory_free_mb = options_.memory_mb;
  if (options_.serving) o.caps.model_specs.push_back(options_.model);
  o.log = quiet_logger();
  auto c = runtime::control_core::create(std::move(o), *this);
  TESSERA_ASSERT(c.has_value(), "sim node {}: {}", self_, c.error().describe());
  core_ = std::move(c).value();
  facts_ = {};
  const std::uint64_t now = ctx.now_ms();
  core_->start(now);
  core_->join(options_.seeds, now);
  rearm(ctx);
  ctx_ = nullptr;
}

void mesh_node::on_message(node_context& ctx, const envelope& msg) {
  ctx_ = &ctx;
  const std::uint64_t now = ctx.now_ms();
  if (msg.channel == request_channel) {
    auto q = serving::decode_request(std::string_view(
        reinterpret_cast<const char*>(msg.payload.data()), msg.payload.size()));
    if (!q) {
      ++undecodable_;
    } else if (options_.serve_requests) {
      on_request(ctx, msg.from, std::move(*q));
    }
  } else if (!core_->on_message(msg.from, {}, static_cast<runtime::runtime_msg>(msg.channel),
                                std::string_view(reinterpret_cast<const char*>(msg.payload.data()),
                                                 msg.payload.size()),
                                now)) {
    ++undecodable_;
  }
  rearm(ctx);
  ctx_ = nullptr;
}

void mesh_node::on_timer(node_context& ctx) {
  ctx_ = &ctx;
  core_->tick(ctx.now_ms());
  generate(ctx);
  rearm(ctx);
  ctx_ = nullptr;
}

void mesh_node::leave(node_context& ctx) {
  ctx_ = &ctx;
  core_->leave(ctx.now_ms());
  rearm(ctx);
  ctx_ = nullptr;
}

// ------------------------------------------------------------------ control_port

void mesh_node::send(member_id to, runtime::runtime_msg type, std::string body) {
  ctx_->send(to, static_cast<std::uint8_t>(type), bytes(body.begin(), body.end()));
}

void mesh_node::reply(member_id to, std::string_view, runtime::runtime_msg type, std::string body) {
  send(to, type, std::move(body));
}

bool mesh_node::persist(const std::string& data) {
  ctx_->durable() = bytes(data.begin(), data.end());
  return true;
}

std::int64_t mesh_node::mono_ns() {
  return static_cast<std::int64_t>(ctx_->now_ms()) * 1'000'000;
}

void mesh_node::on_member_event(const member_event& ev) {
  member_events_.push_back(observed_member_event{ctx_->now_ms(), ev});
}

// ------------------------------------------------------------------ requests (the engine's part)

std::string mesh_node::hex_of(member_id id) {
  return fmt::format("{:032x}", id);
}

void mesh_node::serving_changed(runtime::serving_facts facts) {
  facts_ = std::move(facts);
  if (!options_.peer_lists || ctx_ == nullptr) return;
  auto nodes = serving::peer_list_nodes(
      facts_.plan != nullptr, self_, hex_of(self_), facts_.live, [&](member_id id) {
        auto it = facts_.peers.find(id);
        return it != facts_.peers.end() ? it->second.hex : std::string();
      });
  if (nodes == peer_list_) return;
  peer_list_ = std::move(nodes);
  for (member_id c : clients_)
    publish_peers(*ctx_, c);
}

void mesh_node::publish_peers(node_context& ctx, member_id client) {
  serving::response r;
  r.kind = "peers";
  r.node = hex_of(self_);
  r.nodes = peer_list_;
  respond(ctx, client, r);
}

serving::response mesh_node::base(const serving::request& q, std::string_view kind) const {
  serving::response r;
  r.kind = std::string(kind);
  r.id = q.id;
  r.attempt = q.attempt;
  r.node = hex_of(self_);
  return r;
}

void mesh_node::respond(node_context& ctx, member_id client, const serving::response& r) {
  const std::string body = serving::encode(r);  // the client protocol's own codec
  ctx.send(client, response_channel, bytes(body.begin(), body.end()));
}

void mesh_node::on_request(node_context& ctx, member_id client, serving::request q) {
  if (options_.peer_lists &&
      std::find(clients_.begin(), clients_.end(), client) == clients_.end()) {
    clients_.push_back(client);  // its subscription to the peer list: the current one at once
    if (!peer_list_.empty()) publish_peers(ctx, client);
  }
  auto running = streams_.find(q.id);
  if (q.cancel) {
    // As the engine's on_cancel: the stream ends and is remembered as finished, so that a
    // re-publication still in flight does not start it again.
    if (!options_.cancels ||
        !serving::cancel_applies(
            q, hex_of(self_),
            running != streams_.end() ? std::optional(running->second.req.attempt) : std::nullopt))
      return;
    auto r = base(running->second.req, "error");
    r.code = std::string(serving::error_code::cancelled);
    r.message = "the client cancelled the request";
    finished_.remember(q.id, q.attempt, r);
    streams_.erase(running);
    ++cancelled_;
    return;
  }
  switch (serving::admit(q, running != streams_.end() ? std::optional(running->second.req.attempt)
                                                       : std::nullopt,
                         finished_)) {
    case serving::admission::running_duplicate:
      respond(ctx, client, base(running->second.req, "accepted"));
      return;
    case serving::admission::supersedes:
      streams_.erase(running);
      break;
    case serving::admission::finished_duplicate:
      respond(ctx, client, finished_.find(q.id)->final_msg);
      return;
    case serving::admission::stale:
      return;
    case serving::admission::fresh:
      break;
  }
  // What the real engine decides with: the plan and live members the core handed it.
  std::vector<member_id> live = facts_.live;
  if (live.empty()) live.push_back(self_);
  const std::vector<std::string> models{options_.model.name};
  auto d = serving::decide(q, facts_.plan.get(), live, self_, models);
  if (d.action == serving::intake_action::ignore) return;
  if (d.action == serving::intake_action::reject) {
    auto r = base(q, "error");
    r.code = d.code;
    r.message = d.message;
    finished_.remember(q.id, q.attempt, r);
    respond(ctx, client, r);
    return;
  }
  respond(ctx, client, base(q, "accepted"));
  stream st;
  st.client = client;
  st.index = static_cast<std::uint32_t>(q.resume.size());
  st.prev = q.resume.empty() ? -1 : q.resume.back();
  // Re-reading prompt + resume takes longer the more there is to read.
  st.next_ms = ctx.now_ms() + options_.prefill_ms + st.index;
  st.req = std::move(q);
  const std::string id = st.req.id;
  streams_[id] = std::move(st);
  rearm(ctx);
}

void mesh_node::generate(node_context& ctx) {
  const std::uint64_t now = ctx.now_ms();
  for (auto it = streams_.begin(); it != streams_.end();) {
    stream& st = it->second;
    if (st.next_ms > now) {
      ++it;
      continue;
    }
    if (st.index < st.req.max_tokens) {
      auto t = base(st.req, "token");
      t.index = st.index;
      t.token = sim_token(st.req, st.prev, st.index, options_.model.n_vocab);
      t.text = {static_cast<char>('a' + t.token % 26)};
      respond(ctx, st.client, t);
      ++tokens_sent_[st.req.id];
      st.prev = t.token;
      ++st.index;
      st.next_ms = now + options_.token_ms;
    }
    if (st.index >= st.req.max_tokens) {
      auto d = base(st.req, "done");
      d.tokens = st.index;
      d.prompt_tokens = 1;
      d.stop = "max_tokens";
      finished_.remember(st.req.id, st.req.attempt, d);
      respond(ctx, st.client, d);
      it = streams_.erase(it);
      continue;
    }
    ++it;
  }
}

void mesh_node::rearm(node_context& ctx) {
  std::uint64_t t = core_->next_wake();
  for (const auto& [id, st] : streams_)
    t = std::min(t, st.next_ms);
  ctx.set_timer(t);
}

mesh_node_options cluster_options(std::size_t n) {
  mesh_node_options o;
  o.control = runtime::control_settings_for(node_config{});
  for (std::size_t i = 1; i <= n; ++i)
    o.seeds.push_back(member_update{i, 0, 0, fmt::format("sim:{}", i)});
  return o;
}

mesh_node_options serving_cluster_options(std::size_t n) {
  auto o = cluster_options(n);
  o.serving = true;
  // A small model: every node can hold a replica.
  o.model.name = "sim";
  o.model.n_layers = 4;
  o.model.n_heads = 4;
  o.model.n_kv_heads = 2;
  o.model.dim = 256;
  o.model.ffn_size = 512;
  o.model.n_vocab = 1000;
  o.model.bytes_per_layer = 1u << 20;
  o.model.bytes_embeddings = 1u << 20;
  o.model.bytes_output = 1u << 20;
  o.model.kv_bytes_per_token = 4096;
  o.model.context_tokens = 256;
  o.model.content = "sim-content";
  return o;
}

std::unique_ptr<world> make_mesh_world(std::uint64_t seed, std::size_t n,
                                       const mesh_node_options& options) {
  auto w = std::make_unique<world>(seed, [options, seed](member_id id) {
    return std::make_unique<mesh_node>(id, options, seed);
  });
  for (std::size_t i = 1; i <= n; ++i)
    w->add_node(i);
  return w;
}

}  // namespace tessera::mesh::sim
