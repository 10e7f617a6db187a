#include "mesh/sim/mesh_node.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <msgpack.hpp>

#include "actors/base/msgpack_bounded.hpp"

namespace tessera::mesh::sim {

template <class T>
bytes encode(const T& value) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, value);
  return bytes(buf.data(), buf.data() + buf.size());
}

template <class T>
std::optional<T> decode(const bytes& data) {
  // msgpack-cxx reports malformed input by exception; this is the adapter that catches it.
  try {
    msgpack::object_handle oh =
        tessera::bounded_unpack(reinterpret_cast<const char*>(data.data()), data.size());
    return oh.get().as<T>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

template bytes encode(const membership_message&);
template bytes encode(const election_message&);
template bytes encode(const durable_election_state&);
template std::optional<membership_message> decode(const bytes&);
template std::optional<election_message> decode(const bytes&);
template std::optional<durable_election_state> decode(const bytes&);

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
  } else {
    ++undecodable_;
  }
}

void mesh_node::on_timer(node_context& ctx) {
  const std::uint64_t now = ctx.now_ms();
  if (membership_timer_ && now >= *membership_timer_)
    apply(ctx, membership_->step(membership_tick{}, now));
  if (election_timer_ && now >= *election_timer_) apply(ctx, election_->step(election_tick{}, now));
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
  rearm(ctx);
}

void mesh_node::apply(node_context& ctx, election_output out) {
  // Durable first, then messages: a vote must be on disk before anyone can learn of it.
  if (out.persist) ctx.durable() = encode(election_->durable());
  for (auto& m : out.messages)
    ctx.send(m.to, election_channel, encode(m));
  election_timer_ = out.timer_at_ms;
  rearm(ctx);
}

void mesh_node::rearm(node_context& ctx) {
  std::optional<std::uint64_t> t = membership_timer_;
  if (election_timer_) t = t ? std::min(*t, *election_timer_) : *election_timer_;
  ctx.set_timer(t);
}

mesh_node_options cluster_options(std::size_t n) {
  mesh_node_options o;
  for (std::size_t i = 1; i <= n; ++i)
    o.seeds.push_back(member_update{i, 0, 0, fmt::format("sim:{}", i)});
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
