#include "mesh/sim/mesh_node.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <msgpack.hpp>

#include "actors/base/msgpack_bounded.hpp"
#include "mesh/serving/intake.hpp"
#include "mesh/serving/planning.hpp"

namespace tessera::mesh::sim {

template <class T>
bytes encode(const T& value) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, value);
  return bytes(buf.data(), buf.data() + buf.size());
}

template <class T>
std::optional<T> decode(const bytes& data) {
  auto r = tessera::bounded_decode<T>(data.data(), data.size());
  if (!r) return std::nullopt;
  return std::move(*r);
}

template bytes encode(const membership_message&);
template bytes encode(const election_message&);
template bytes encode(const durable_election_state&);
template std::optional<membership_message> decode(const bytes&);
template std::optional<election_message> decode(const bytes&);
template std::optional<durable_election_state> decode(const bytes&);
template std::optional<topology::row_report> decode(const bytes&);
template std::optional<topology::view> decode(const bytes&);
template std::optional<placement::plan> decode(const bytes&);

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

mesh_node::mesh_node(member_id self, const mesh_node_options& options, std::uint64_t seed)
    : self_(self), options_(options) {
  options_.membership.self = self;
  options_.membership.rng_seed = seed * 31 + self;
  options_.election.self = self;
  options_.election.rng_seed = seed * 37 + self;
  options_.membership.self_address = fmt::format("sim:{}", self);
  std::erase_if(options_.seeds, [&](const member_update& s) { return s.id == self; });
}

void mesh_node::on_start(node_context& ctx) {
  durable_election_state restored;
  if (!ctx.durable().empty()) {
    auto d = decode<durable_election_state>(ctx.durable());
    TESSERA_ASSERT(d.has_value(), "sim node {}: durable state does not decode", self_);
    restored = *d;
  }
  auto m = mesh::membership::create(options_.membership);
  TESSERA_ASSERT(m.has_value(), "sim node {}: {}", self_, m.error().describe());
  membership_.emplace(std::move(m).value());
  auto e = mesh::election::create(options_.election, restored);
  TESSERA_ASSERT(e.has_value(), "sim node {}: {}", self_, e.error().describe());
  election_.emplace(std::move(e).value());
  const std::uint64_t now = ctx.now_ms();
  if (options_.serving) {
    topology::topology_config tc;
    tc.self = self_;
    topo_.emplace(tc);
    plan_.reset();
    next_report_ms_ = now;
    next_view_resend_ms_ = 0;
    refresh_members(ctx);
  }
  apply(ctx, election_->step(election_tick{}, now));
  apply(ctx, membership_->step(membership_join{options_.seeds}, now));
}

void mesh_node::on_message(node_context& ctx, const envelope& msg) {
  const std::uint64_t now = ctx.now_ms();
  if (msg.channel == membership_channel) {
    auto m = decode<membership_message>(msg.payload);
    if (!m) {
      ++undecodable_;
      return;
    }
    apply(ctx, membership_->step(membership_receive{std::move(*m)}, now));
  } else if (msg.channel == election_channel) {
    auto m = decode<election_message>(msg.payload);
    if (!m) {
      ++undecodable_;
      return;
    }
    apply(ctx, election_->step(election_receive{std::move(*m)}, now));
  } else if (topo_ && msg.channel == report_channel) {
    auto r = decode<topology::row_report>(msg.payload);
    if (!r || r->from != msg.from) {
      ++undecodable_;
      return;
    }
    if (topo_->is_leader()) {
      topo_->on_report(*r);
      publish_if_leader(ctx);
    }
  } else if (topo_ && msg.channel == view_channel) {
    auto v = decode<topology::view>(msg.payload);
    if (!v) {
      ++undecodable_;
      return;
    }
    // As the runtime: views only from the leader this node follows, naming itself leader.
    if (v->leader != msg.from || msg.from != election_->leader()) return;
    topo_->on_view(*v);
  } else if (topo_ && options_.serve_requests && msg.channel == request_channel) {
    auto q = serving::decode_request(std::string_view(
        reinterpret_cast<const char*>(msg.payload.data()), msg.payload.size()));
    if (!q) {
      ++undecodable_;
      return;
    }
    on_request(ctx, msg.from, std::move(*q));
  } else if (topo_ && msg.channel == plan_channel) {
    auto p = decode<placement::plan>(msg.payload);
    if (!p) {
      ++undecodable_;
      return;
    }
    // As the runtime: plans only from the leader this node follows (a stale leader must not
    // adopt its successor's plan and then issue epochs in that term).
    if (msg.from != election_->leader()) return;
    auto a = serving::should_adopt(plan_.get(), *p);
    if (!a) {
      ++plans_refused_;
      return;
    }
    if (*a) adopt(std::make_shared<const placement::plan>(std::move(*p)));
  } else {
    ++undecodable_;
  }
}

void mesh_node::on_timer(node_context& ctx) {
  const std::uint64_t now = ctx.now_ms();
  if (membership_timer_ && now >= *membership_timer_)
    apply(ctx, membership_->step(membership_tick{}, now));
  if (election_timer_ && now >= *election_timer_) apply(ctx, election_->step(election_tick{}, now));
  if (topo_ && now >= next_report_ms_) {
    next_report_ms_ = now + 1000;
    report(ctx);
  }
  if (topo_ && topo_->is_leader() && topo_->current() && now >= next_view_resend_ms_) {
    broadcast_view(ctx);
    replan(ctx);
    broadcast_plan(ctx);
  }
  generate(ctx);
  rearm(ctx);
}

void mesh_node::leave(node_context& ctx) {
  const std::uint64_t now = ctx.now_ms();
  apply(ctx, election_->step(election_leave{}, now));
  apply(ctx, membership_->step(membership_leave{}, now));
}

void mesh_node::apply(node_context& ctx, membership_output out) {
  for (auto& m : out.messages)
    ctx.send(m.to, membership_channel, encode(m));
  membership_timer_ = out.timer_at_ms;
  for (auto& ev : out.events) {
    member_events_.push_back(observed_member_event{ctx.now_ms(), ev});
    apply(ctx, election_->step(peer_status_changed{ev.id, ev.status}, ctx.now_ms()));
  }
  if (topo_ && !out.events.empty()) refresh_members(ctx);
  rearm(ctx);
}

void mesh_node::apply(node_context& ctx, election_output out) {
  // Durable first, then messages: a vote must be on disk before anyone can learn of it.
  if (out.persist) ctx.durable() = encode(election_->durable());
  for (auto& m : out.messages)
    ctx.send(m.to, election_channel, encode(m));
  election_timer_ = out.timer_at_ms;
  if (topo_)
    for (const auto& ev : out.events)
      if (ev.kind == election_event_kind::leader_changed) {
        if (ev.leader == self_ && !topo_->is_leader()) leading_since_ms_ = ctx.now_ms();
        topo_->on_leader(ev.term, ev.leader);
        next_report_ms_ = ctx.now_ms();  // the new leader needs our row at once
        publish_if_leader(ctx);
      }
  rearm(ctx);
}

// ------------------------------------------------------------------ serving layer

void mesh_node::refresh_members(node_context& ctx) {
  std::vector<topology::member_fact> facts;
  facts.push_back({self_, static_cast<std::uint8_t>(member_status::alive), options_.membership.self_address});
  if (membership_)
    for (const auto& [id, m] : membership_->members())
      facts.push_back({id, static_cast<std::uint8_t>(m.status), m.address});
  topo_->on_members(std::move(facts));
  publish_if_leader(ctx);
}

void mesh_node::report(node_context& ctx) {
  topology::row_report r;
  r.from = self_;
  r.caps.node_id = fmt::format("{:032x}", self_);
  r.caps.cores = 2;
  r.caps.memory_total_mb = options_.memory_mb;
  r.caps.memory_free_mb = options_.memory_mb;
  r.caps.model_specs.push_back(options_.model);
  if (membership_)
    for (const auto& [id, m] : membership_->members())
      if (m.status == member_status::alive || m.status == member_status::suspect)
        r.links.push_back({self_, id, 500, 1000, 1});
  if (topo_->is_leader()) {
    topo_->on_report(r);
    publish_if_leader(ctx);
    return;
  }
  const member_id leader = election_->leader();
  if (leader != no_member && leader != self_) ctx.send(leader, report_channel, encode(r));
}

void mesh_node::publish_if_leader(node_context& ctx) {
  if (!topo_ || !topo_->is_leader()) return;
  if (!topo_->maybe_publish(ctx.now_ms())) return;
  broadcast_view(ctx);
  replan(ctx);
}

void mesh_node::replan(node_context& ctx) {
  if (!topo_->is_leader() || !topo_->current()) return;
  if (!serving::ready_to_plan(*topo_->current(), ctx.now_ms() - leading_since_ms_)) return;
  auto p = serving::plan_from_view(*topo_->current(), plan_.get(), election_->term());
  if (!p || (plan_ && p->epoch == plan_->epoch)) return;
  adopt(std::make_shared<const placement::plan>(std::move(*p)));
  broadcast_plan(ctx);
}

void mesh_node::broadcast_view(node_context& ctx) {
  const bytes body = encode(*topo_->current());
  for (const auto& m : topo_->current()->members)
    if (m.id != self_ && topology::is_live_status(m.status)) ctx.send(m.id, view_channel, body);
  next_view_resend_ms_ = ctx.now_ms() + 2000;
}

void mesh_node::broadcast_plan(node_context& ctx) {
  if (!plan_ || !topo_->current()) return;
  const bytes body = encode(*plan_);
  for (const auto& m : topo_->current()->members)
    if (m.id != self_ && topology::is_live_status(m.status)) ctx.send(m.id, plan_channel, body);
}

void mesh_node::adopt(std::shared_ptr<const placement::plan> p) {
  plan_ = std::move(p);
}

// ------------------------------------------------------------------ requests (the engine's part)

serving::response mesh_node::base(const serving::request& q, std::string_view kind) const {
  serving::response r;
  r.kind = std::string(kind);
  r.id = q.id;
  r.attempt = q.attempt;
  r.node = fmt::format("{:016x}", self_);
  return r;
}

void mesh_node::respond(node_context& ctx, member_id client, const serving::response& r) {
  const std::string body = serving::encode(r);  // the client protocol's own codec
  ctx.send(client, response_channel, bytes(body.begin(), body.end()));
}

void mesh_node::on_request(node_context& ctx, member_id client, serving::request q) {
  if (q.cancel) return;  // the simulated clients never cancel
  auto running = streams_.find(q.id);
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
  std::vector<member_id> live{self_};
  for (const auto& [id, m] : membership_->members())
    if (m.status == member_status::alive || m.status == member_status::suspect) live.push_back(id);
  const std::vector<std::string> models{options_.model.name};
  auto d = serving::decide(q, plan_.get(), live, self_, models);
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
  std::optional<std::uint64_t> t = membership_timer_;
  if (election_timer_) t = t ? std::min(*t, *election_timer_) : *election_timer_;
  if (topo_) {
    t = t ? std::min(*t, next_report_ms_) : next_report_ms_;
    if (topo_->is_leader() && topo_->current()) t = std::min(*t, next_view_resend_ms_);
  }
  for (const auto& [id, st] : streams_)
    t = t ? std::min(*t, st.next_ms) : st.next_ms;
  ctx.set_timer(t);
}

mesh_node_options cluster_options(std::size_t n) {
  mesh_node_options o;
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
