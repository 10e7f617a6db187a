#include "mesh/sim/client_node.hpp"

#include <algorithm>


namespace tessera::mesh::sim {

client_node::client_node(std::vector<member_id> peers, std::vector<scheduled_request> schedule,
                         serving::follower_options options)
    : peers_(std::move(peers)), schedule_(std::move(schedule)), options_(options) {}

void client_node::on_start(node_context& ctx) { rearm(ctx); }

bool client_node::all_done() const {
  return next_ == schedule_.size() && followers_.empty();
}

void client_node::publish(node_context& ctx, const serving::request& r) {
  const std::string wire = serving::encode(r);  // the client protocol's own codec
  const bytes body(wire.begin(), wire.end());
  for (member_id p : peers_)
    ctx.send(p, request_channel, body);
  if (auto it = records_.find(r.id); it != records_.end()) ++it->second.publications;
}

void client_node::apply(node_context& ctx, const std::string& id, serving::follower_step step) {
  if (step.publish) publish(ctx, *step.publish);
  if (step.done) {
    auto& rec = records_.at(id);
    ++rec.outcomes;
    rec.outcome = std::move(step.done);
    rec.ended_ms = ctx.now_ms();
    followers_.erase(id);
  }
}

void client_node::on_message(node_context& ctx, const envelope& msg) {
  if (msg.channel != response_channel) {
    ++undecodable_;
    return;
  }
  auto m = serving::decode_response(std::string_view(
      reinterpret_cast<const char*>(msg.payload.data()), msg.payload.size()));
  if (!m) {
    ++undecodable_;
    return;
  }
  if (m->kind == "peers") {
    // A peer's list of the live members: every stream whose serving peer it leaves out may
    // resume (stream_follower::on_peers, as the C++ client does).
    std::vector<std::string> ids;
    for (const auto& [id, f] : followers_)
      ids.push_back(id);
    for (const auto& id : ids)
      apply(ctx, id, followers_.at(id).on_peers(*m, ctx.now_ms() * 1000));
    rearm(ctx);
    return;
  }
  auto it = followers_.find(m->id);
  if (it == followers_.end()) return;  // a late message of a request that ended
  auto step = it->second.on_response(*m, ctx.now_ms() * 1000);
  if (step.token) {
    auto& rec = records_.at(m->id);
    rec.indices.push_back(m->index);
    rec.tokens.push_back(m->token);
    rec.token_ms.push_back(ctx.now_ms());
    rec.token_nodes.push_back(m->node);
  }
  apply(ctx, m->id, std::move(step));
  rearm(ctx);
}

void client_node::on_timer(node_context& ctx) {
  const std::uint64_t now = ctx.now_ms();
  while (next_ < schedule_.size() && schedule_[next_].at_ms <= now) {
    const auto& s = schedule_[next_++];
    request_record rec;
    rec.req = s.req;
    rec.issued_ms = now;
    records_[s.req.id] = std::move(rec);
    auto [it, fresh] =
        followers_.emplace(s.req.id, serving::stream_follower(s.req, options_, now * 1000));
    TESSERA_ASSERT(fresh, "sim client: request id {} scheduled twice", s.req.id);
    publish(ctx, it->second.first_publication());
  }
  std::vector<std::string> ids;
  for (const auto& [id, f] : followers_)
    if (f.wake_at_us() <= now * 1000) ids.push_back(id);
  for (const auto& id : ids)
    apply(ctx, id, followers_.at(id).on_tick(now * 1000));
  rearm(ctx);
}

void client_node::rearm(node_context& ctx) {
  std::optional<std::uint64_t> t;
  if (next_ < schedule_.size()) t = schedule_[next_].at_ms;
  for (const auto& [id, f] : followers_) {
    const std::uint64_t w = (f.wake_at_us() + 999) / 1000;
    t = t ? std::min(*t, w) : w;
  }
  ctx.set_timer(t);
}

std::unique_ptr<world> make_request_world(std::uint64_t seed, std::size_t n,
                                          const mesh_node_options& options,
                                          std::vector<std::vector<scheduled_request>> schedules,
                                          serving::follower_options follower) {
  TESSERA_ASSERT(options.serving && options.serve_requests, "sim: requests need the serving layer");
  std::vector<member_id> peers;
  for (std::size_t i = 1; i <= n; ++i)
    peers.push_back(i);
  auto shared = std::make_shared<std::vector<std::vector<scheduled_request>>>(std::move(schedules));
  auto w = std::make_unique<world>(
      seed, [options, seed, n, peers, shared, follower](member_id id) -> std::unique_ptr<sim_node> {
        if (id <= n) return std::make_unique<mesh_node>(id, options, seed);
        return std::make_unique<client_node>(peers, (*shared)[id - n - 1], follower);
      });
  for (std::size_t i = 1; i <= n + shared->size(); ++i)
    w->add_node(i);
  // The clients' sockets are TCP streams: a stream's messages may be lost, never reordered.
  w->set_fifo(request_channel);
  w->set_fifo(response_channel);
  return w;
}

}  // namespace tessera::mesh::sim
