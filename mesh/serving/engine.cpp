#include "mesh/serving/engine.hpp"

#include "mesh/serving/engine_impl.hpp"

namespace tessera::mesh::serving {

void engine::impl::to_inbox(request&& r) {
  {
    std::lock_guard lock(mu);
    if (inbox.size() >= opt.max_inbox) {
      ++dropped_inbox;
      return;
    }
    inbox.push_back(std::move(r));
  }
  cv.notify_all();
}

result<void> engine::impl::activate(session& s) {
  const std::int64_t cap = std::min<std::int64_t>(s.model->hp.n_ctx_train, opt.max_context);
  const std::int64_t n_ctx =
      std::min<std::int64_t>(cap, static_cast<std::int64_t>(s.prompt.size()) + s.req.max_tokens);
  s.logits.resize(static_cast<std::size_t>(s.model->hp.n_vocab));
  if (s.host != nullptr) {
    auto* ru = s.host->runner();
    if (ru == nullptr)
      return make_error(errc::no_capacity, "model '{}': its group is not ready ({})", s.req.model,
                        s.host->failure());
    auto& used = used_seqs[s.host->key()];
    std::uint32_t seq = 0;
    while (used.contains(seq))
      ++seq;
    if (seq >= inference::sharded::max_sequences)
      return make_error(errc::no_capacity, "model '{}': its group runs {} sequences already",
                        s.req.model, used.size());
    if (auto o = ru->open(seq, n_ctx); !o) {
      s.host->fail(o.error().describe());
      return o.error();
    }
    used.insert(seq);
    s.seq = seq;
    s.n_ctx = n_ctx;  // set last: release() frees only what was opened
    return ok();
  }
  auto ctx =
      mdl::context::create(*s.model->m, {n_ctx, opt.prefill_chunk, pool.get(), {}, opt.kv_cache});
  if (!ctx) return ctx.error();
  s.ctx = std::move(*ctx);
  s.n_ctx = n_ctx;
  return ok();
}

void engine::impl::finish(session& s, std::string_view stop) {
  auto r = base(s.req, "done");
  r.tokens = s.next_index;
  r.prompt_tokens = static_cast<std::uint32_t>(s.prompt.size());
  r.stop = std::string(stop);
  ++completed;
  stats.finished(s.req.model, std::chrono::duration<double>(clock_type::now() - s.started).count());
  remember(s.req.id, s.req.attempt, r);
  send(r);
}

void engine::impl::release(session& s) {
  if (s.host == nullptr || s.n_ctx == 0) return;
  if (auto* ru = s.host->runner()) (void)ru->close(s.seq);
  used_seqs[s.host->key()].erase(s.seq);
  s.n_ctx = 0;
}

bool engine::impl::share_prefix(session& s, std::size_t feed_size) {
  const std::size_t want = feed_size - 1;
  if (s.fed >= want) return false;
  session* best = nullptr;
  std::size_t best_ready = s.fed;
  bool wait = false;
  for (const auto& [id, dp] : active) {
    session& d = *dp;
    if (&d == &s || d.model != s.model || !d.ctx) continue;
    const std::size_t limit = std::min(want, d.history.size());
    std::size_t common = 0;
    while (common < limit && d.history[common] == s.history[common])
      ++common;
    if (common <= s.fed) continue;
    const auto ready = std::min(common, static_cast<std::size_t>(d.ctx->pos()));
    if (ready > best_ready) {
      best = &d;
      best_ready = ready;
    }
    // Ahead in line and still reading tokens `s` needs: a chunk scheduled and not yet
    // evaluated, or more of its prompt to schedule (this round, if its turn comes after this).
    const auto evaluated = static_cast<std::size_t>(d.ctx->pos());
    if (d.took_slot < s.took_slot && evaluated < common &&
        (d.fed > evaluated || d.fed < d.history.size()))
      wait = true;
  }
  if (best != nullptr) {
    if (auto c = s.ctx->copy_prefix(*best->ctx, static_cast<std::int64_t>(best_ready)); c) {
      shared_prefix_tokens += best_ready - s.fed;
      s.fed = best_ready;
    }
  }
  return wait;
}

bool engine::impl::step(session& s) {
  // The prompt plus the tokens the client already has (a resumed stream re-prefills them).
  const std::size_t feed_size = s.history.size();
  if (s.fed < feed_size && s.ctx && share_prefix(s, feed_size)) return true;  // waits a round
  if (s.fed < feed_size) {
    const std::size_t n = std::min<std::size_t>(opt.prefill_chunk, feed_size - s.fed);
    const bool last = s.fed + n == feed_size;
    auto r = passes->eval(s, std::span(s.history).subspan(s.fed, n), last);
    if (!r) {
      fail_stream(s, r.error());
      return false;
    }
    s.fed += n;
    s.have_logits = last;
    return true;
  }
  if (s.next_index >= s.req.max_tokens) {
    finish(s, "max_tokens");
    return false;
  }
  // Reseeded per index: a stream resumed on another peer draws what this one would have.
  s.work = s.logits;
  if (s.json) {
    if (!s.model->json_vocab)
      s.model->json_vocab = std::make_unique<inf::tokenizer::json_vocab>(*s.model->tok);
    if (s.model->json_vocab->mask(*s.json, s.work) == 0) {
      send_error(s.req, error_code::invalid_request,
                 fmt::format("model '{}': no token of its vocabulary continues the JSON answer "
                             "after {} tokens (format {})",
                             s.req.model, s.next_index, s.req.format));
      return false;
    }
  }
  const auto t = s.sampler->sample_at(s.work, s.history, s.next_index);
  if (s.model->tok->is_end_of_generation(t)) {
    finish(s, "end_of_generation");
    return false;
  }
  auto r = base(s.req, "token");
  r.index = s.next_index++;
  r.token = t;
  const std::string bytes = s.model->tok->token_bytes(t);
  r.text.assign(bytes.begin(), bytes.end());
  if (s.req.top_logprobs >= 0) {
    // Under the model's own distribution (the logits before penalties and temperature).
    const auto lp = mdl::logprobs_of(s.logits, t, s.req.top_logprobs);
    r.logprob = lp.chosen;
    for (const auto& [id, v] : lp.top) {
      const std::string alt = s.model->tok->token_bytes(id);
      r.alt_tokens.push_back(id);
      r.alt_text.emplace_back(alt.begin(), alt.end());
      r.alt_logprobs.push_back(v);
    }
  }
  send(r);
  ++tokens_out;
  const auto now = clock_type::now();
  stats.token(s.req.model, !s.sent_any,
              std::chrono::duration<double>(now - (s.sent_any ? s.last_sent : s.started)).count());
  s.sent_any = true;
  s.last_sent = now;
  s.history.push_back(t);
  s.fed = s.history.size();
  // The mask let only tokens through that continue the object: the feed cannot fail.
  if (s.json && s.json->feed(bytes) && s.json->complete()) {
    finish(s, "end_of_generation");
    return false;
  }
  if (s.next_index >= s.req.max_tokens) {
    finish(s, "max_tokens");
    return false;
  }
  // `t` is in the history but not evaluated yet: it needs one more position.
  if (static_cast<std::int64_t>(s.history.size()) > s.n_ctx) {
    finish(s, "context_full");
    return false;
  }
  if (auto e = passes->eval(s, std::span(s.history).last(1), true); !e) {
    fail_stream(s, e.error());
    return false;
  }
  return true;
}

void engine::impl::keepalive(session& s) {
  const auto now = clock_type::now();
  if (now - s.last_sent <= std::chrono::milliseconds(opt.keepalive_ms)) return;
  send(accepted_of(s));
  s.last_sent = now;
}

void engine::impl::publish_active_view() {
  std::vector<json> v;
  for (const auto& [id, s] : active)
    v.push_back({{"id", id},
                 {"model", s->req.model},
                 {"attempt", s->req.attempt},
                 {"prompt_tokens", s->prompt.size()},
                 {"tokens", s->next_index},
                 {"context", s->n_ctx},
                 {"client", s->client}});
  for (const auto& s : queued)
    v.push_back({{"id", s->req.id},
                 {"model", s->req.model},
                 {"queued", true},
                 {"tokens", s->next_index},
                 {"client", s->client}});
  std::vector<json> g;
  for (const auto& [key, h] : held->hosts()) {
    const auto st = h->current();
    json one = {{"key", key},
                {"ranks", h->size()},
                {"state", st == group_host::state::ready     ? "ready"
                          : st == group_host::state::forming ? "forming"
                                                             : "failed"},
                {"failure", h->failure()}};
    // An MoE group: this rank's experts and the rows routed to each (every layer's choices).
    if (auto load = h->expert_load())
      one["experts"] = {{"first", load->first}, {"load", load->second}};
    g.push_back(std::move(one));
  }
  // The same for the MoE models this peer holds whole (replicas).
  std::vector<json> replicas = held->replicas_view();
  std::lock_guard lock(mu);
  active_view = std::move(v);
  groups_view = std::move(g);
  replicas_view = std::move(replicas);
}

void engine::impl::engine_loop() {
  // Forward passes run here (rank 0 of split groups too): the compute class.
  name_this_thread("engine");
  set_this_thread_nice(opt.compute_nice);
  auto last_view = clock_type::now();
  while (true) {
    std::deque<request> batch;
    {
      std::unique_lock lock(mu);
      // Idle: no stream runs, and the queued ones (if any) wait for weights being loaded.
      if (active.empty() && std::all_of(queued.begin(), queued.end(),
                                        [](const auto& q) { return waits_for_weights(*q); }))
        cv.wait_for(lock, std::chrono::milliseconds(200), [&] {
          return stopping.load() || !inbox.empty() || !link_inbox.empty() || held->needs_tending();
        });
      batch.swap(inbox);
    }
    if (stopping.load()) break;
    {
      std::shared_ptr<const placement::plan> p;
      {
        std::lock_guard lock(mu);
        p = plan;
      }
      const bool again = held->refresh();
      if (p.get() != reconciled || again) {
        std::map<member_id, peer_facts> facts;
        {
          std::lock_guard lock(mu);
          facts = peers;
        }
        held->reconcile(p.get(), facts);
        reconciled = p.get();
        current_plan = p;  // keeps `reconciled` alive
      }
    }
    std::deque<group_link_message> links;
    {
      std::lock_guard lock(mu);
      links.swap(link_inbox);
    }
    held->route_links(std::move(links));
    held->ping_groups();
    for (auto& q : batch)
      on_request(std::move(q));
    held->tend_weights();
    drop_unservable();
    preempt_for_fairness();
    start_waiting();
    // One round: every active session advances by one unit. A session quiet for keepalive_ms
    // says it is alive first, so a slow round never looks like a dead peer to its client. The
    // local streams' units then run together, a forward pass per model (continuous batching):
    // a long prompt's prefill chunk and the other streams' next tokens share one pass.
    for (auto it = active.begin(); it != active.end();) {
      keepalive(*it->second);
      if (!step(*it->second)) {
        release(*it->second);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [s, why] : passes->run()) {
      fail_stream(*s, why);
      const std::string id = s->req.id;
      release(*s);
      active.erase(id);
    }
    const auto now = clock_type::now();
    cut_unread_streams(now);
    for (auto& s : queued)
      if (now - s->last_sent > std::chrono::milliseconds(opt.keepalive_ms)) {
        send(accepted_of(*s));
        s->last_sent = now;
      }
    if (now - last_view > std::chrono::milliseconds(200) || active.empty()) {
      publish_active_view();
      last_view = now;
    }
  }
  // Shutdown: every stream still open ends with an explicit error.
  for (auto& [id, s] : active)
    release(*s);
  for (auto& [id, s] : active)
    send_error(s->req, error_code::unavailable,
               fmt::format("peer {} is shutting down; resume on another peer", opt.node_hex));
  for (auto& s : queued)
    send_error(s->req, error_code::unavailable,
               fmt::format("peer {} is shutting down; resume on another peer", opt.node_hex));
  active.clear();
  queued.clear();
  held->stop_groups();
}

void engine::impl::on_host_dropped(group_host& h, std::string_view why) {
  for (auto a = active.begin(); a != active.end();) {
    if (a->second->host == &h) {
      release(*a->second);
      send_error(a->second->req, error_code::unavailable,
                 fmt::format("model '{}': {}; resume", a->second->req.model, why));
      a = active.erase(a);
    } else {
      ++a;
    }
  }
  std::erase_if(queued, [&](const auto& q) {
    if (q->host != &h) return false;
    send_error(q->req, error_code::unavailable, fmt::format("{}; resume", why));
    return true;
  });
  used_seqs.erase(h.key());
}

bool engine::impl::uses_weights(const loaded& lm) const {
  const auto uses = [&](const session& s) { return s.model == &lm && s.host == nullptr; };
  return std::any_of(active.begin(), active.end(),
                     [&](const auto& a) { return uses(*a.second); }) ||
         std::any_of(queued.begin(), queued.end(), [&](const auto& q) { return uses(*q); });
}

engine::engine(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

engine::~engine() {
  stop();
}

result<std::unique_ptr<engine>> engine::start(engine_options options) {
  auto p = std::make_unique<impl>();
  p->opt = std::move(options);
  if (p->opt.max_active == 0 || p->opt.prefill_chunk == 0 || p->opt.max_batch_streams == 0)
    return make_error(errc::invalid_argument,
                      "serving: max_active, prefill_chunk and max_batch_streams must be > 0");
  auto* raw = p.get();
  auto pool =
      inf::thread_pool::create(static_cast<int>(std::max(1u, p->opt.threads)),
                               {.pin = false, .nice = p->opt.compute_nice, .gate = p->gate});
  if (!pool) return pool.error();
  p->pool = std::move(*pool);
  p->passes = std::make_unique<round_passes>(p->opt.max_batch_streams, *p->pool);
  p->held = std::make_unique<holdings>(
      p->opt, *p->pool, p->gate,
      holdings::hooks{.wake =
                          [raw] {
                            // Under the lock: the engine's wait sees the change or this wake-up.
                            { std::lock_guard lock(raw->mu); }
                            raw->cv.notify_all();
                          },
                      .host_dropped = [raw](group_host& h,
                                            std::string_view why) { raw->on_host_dropped(h, why); },
                      .in_use = [raw](const loaded& lm) { return raw->uses_weights(lm); }});
  for (const auto& path : p->opt.model_paths)
    if (auto added = p->held->add_own(path); !added) return added.error();
  client_port_options po;
  po.node_hex = p->opt.node_hex;
  po.bind_address = p->client_address();
  po.request_port = p->opt.request_port;
  po.response_port = p->opt.response_port;
  po.limits = {p->opt.client_connections_per_address, p->opt.client_connections_total};
  po.client_auth = p->opt.client_auth;
  auto port = client_port::open(std::move(po), [raw](request&& r) { raw->to_inbox(std::move(r)); });
  if (!port) return port.error();
  p->port = std::move(*port);
  p->push = p->port->sender();
  p->port->start();
  p->engine_thread = std::thread([raw] { raw->engine_loop(); });
  return std::unique_ptr<engine>(new engine(std::move(p)));
}

void engine::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  impl_->cv.notify_all();
  if (impl_->engine_thread.joinable()) impl_->engine_thread.join();
  impl_->held->stop_sharing();
  // Only now the io thread stops: its last pass forwards what the engine queued last (the
  // shutdown errors), which it could miss if it stopped together with the engine. Then the
  // engine's socket closes, before the port's context ends (it waits for every socket made in it:
  // the context ends with the port, when the engine goes). The port itself stays: the control
  // actor still reads status() and sets peer lists while a leaving node announces its leave.
  impl_->port->stop();
  impl_->push.close();
}

const std::vector<local_model>& engine::models() const {
  return impl_->held->own();
}
std::vector<placement::model_spec> engine::held_specs() const {
  return impl_->held->held_specs();
}

std::uint16_t engine::request_port() const {
  return impl_->port->request_port();
}
std::uint16_t engine::response_port() const {
  return impl_->port->response_port();
}

void engine::set_plan(std::shared_ptr<const placement::plan> plan, std::vector<member_id> live,
                      std::vector<std::string> client_endpoints,
                      std::map<member_id, peer_facts> peers) {
  // First, and on this thread: a rank waiting on a member that left, or in a group the plan
  // dropped, waits no longer (the engine thread may be that rank, inside a forward pass).
  impl_->held->registry().abort_without(live);
  if (plan != nullptr) {
    std::set<std::string> planned;
    for (const auto& mp : plan->models)
      for (const auto& g : mp.groups)
        if (g.ranks.size() > 1) planned.insert(group_key(mp.spec.name, g));
    impl_->held->registry().abort_unplanned(
        planned, fmt::format("{}.{}", plan->epoch.term, plan->epoch.version));
  }
  {
    impl_->port->set_peer_list(std::move(client_endpoints),
                               peer_list_nodes(plan != nullptr, impl_->opt.self,
                                               impl_->opt.node_hex, live, [&](member_id id) {
                                                 auto it = peers.find(id);
                                                 return it != peers.end() ? it->second.hex
                                                                          : std::string();
                                               }));
    std::lock_guard lock(impl_->mu);
    impl_->plan = std::move(plan);
    impl_->live = std::move(live);
    impl_->peers = std::move(peers);
  }
  impl_->cv.notify_all();
}

void engine::on_group_link(member_id from, std::string_view body) {
  auto m = tessera::bounded_decode<group_link_message>(body.data(), body.size());
  if (!m) {
    ++impl_->malformed;
    return;
  }
  m->sender = from;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->link_inbox.size() >= kMaxLinkMessages) return;  // the sender re-sends
    impl_->link_inbox.push_back(std::move(*m));
  }
  impl_->cv.notify_all();
}

void engine::on_share(const std::string& from_hex, std::string_view body) {
  auto m = tessera::bounded_decode<share_setup>(body.data(), body.size());
  if (!m) {
    ++impl_->malformed;
    return;
  }
  impl_->held->on_share(from_hex, *m);
}

json engine::status() const {
  json j;
  impl_->held->status(j);
  const auto port = impl_->port->status();
  j["request_port"] = impl_->port->request_port();
  j["response_port"] = impl_->port->response_port();
  j["client_auth"] = port["client_auth"];
  {
    std::lock_guard lock(impl_->mu);
    j["streams"] = impl_->active_view;
    j["groups"] = impl_->groups_view;
    j["replicas"] = impl_->replicas_view;
    j["inbox_dropped"] = impl_->dropped_inbox;
  }
  j["accepted"] = impl_->accepted.load();
  j["completed"] = impl_->completed.load();
  j["rejected"] = impl_->rejected.load();
  j["superseded"] = impl_->superseded.load();
  j["compute_gate_waits"] = impl_->gate->waits();
  j["duplicates"] = impl_->duplicates.load();
  j["cancelled"] = impl_->cancelled.load();
  j["resumed_first"] = impl_->resumed_first.load();
  j["tokens"] = impl_->tokens_out.load();
  // Client messages the port could not decode, and control-plane ones the engine could not.
  j["malformed"] = impl_->malformed.load() + impl_->port->malformed();
  j["unread"] = port["unread"];
  j["unread"]["streams_cut"] = impl_->unread_streams_cut.load();
  // fair_share.hpp: clients are request connections (numbered as they connect).
  j["connections"] = port["connections"];
  j["fair_share"] = {{"connections", port["connections_seen"]},
                     {"made_way", impl_->made_way.load()},
                     {"preempted", impl_->preempted.load()}};
  j["shared_prefix_tokens"] = impl_->shared_prefix_tokens.load();
  j["passes"] = impl_->passes->passes();
  j["pass_streams"] = impl_->passes->pass_streams();
  j["stream_stats"] = impl_->stats.to_json();
  return j;
}

}  // namespace tessera::mesh::serving
