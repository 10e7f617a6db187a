// The engine's intake (engine_impl.hpp), on the engine thread: a request from the client port
// becomes a session, a duplicate's answer, or an error that names the problem; sessions wait,
// start and make way by the fair-share rules (fair_share.hpp); a cancel or an unread stream ends
// one. The rules themselves are pure (intake.hpp, ledger.hpp, fair_share.hpp); this is their use.
#include "mesh/serving/engine_impl.hpp"

namespace tessera::mesh::serving {

void engine::impl::send(const response& r) {
  const std::string topic = response_topic(r.id);
  const std::string body = encode(r);
  (void)push.send(zmq::buffer(topic), zmq::send_flags::sndmore);
  (void)push.send(zmq::buffer(body), zmq::send_flags::none);
}

response engine::impl::base(const request& q, std::string_view kind) const {
  response r;
  r.kind = std::string(kind);
  r.id = q.id;
  r.attempt = q.attempt;
  r.node = opt.node_hex;
  return r;
}

response engine::impl::accepted_of(const session& s) const {
  auto r = base(s.req, "accepted");
  r.prompt_tokens = static_cast<std::uint32_t>(s.prompt.size());
  return r;
}

void engine::impl::send_error(const request& q, std::string_view code, std::string message) {
  auto r = base(q, "error");
  r.code = std::string(code);
  r.message = std::move(message);
  remember(q.id, q.attempt, r);
  send(r);
}

session* engine::impl::find_session(const std::string& id) {
  if (auto it = active.find(id); it != active.end()) return it->second.get();
  for (auto& s : queued)
    if (s->req.id == id) return s.get();
  return nullptr;
}

void engine::impl::cut_unread_streams(clock_type::time_point now) {
  const auto cut = port->take_unread(now, kUnreadStreamCut);
  for (const auto& id : cut) {
    session* s = find_session(id);
    if (s == nullptr) continue;
    ++unread_streams_cut;
    const request q = s->req;
    drop_session(id);
    send_error(q, error_code::unavailable,
               fmt::format(
                   "nobody subscribed to the stream on peer {} for {} s: cut; resume", opt.node_hex,
                   std::chrono::duration_cast<std::chrono::seconds>(kUnreadStreamCut).count()));
  }
}

void engine::impl::on_cancel(const request& q) {
  if (!valid_id(q.id)) return;
  session* s = find_session(q.id);
  if (!cancel_applies(q, opt.node_hex, s ? std::optional(s->req.attempt) : std::nullopt)) return;
  auto r = base(s->req, "error");
  r.code = std::string(error_code::cancelled);
  r.message = "the client cancelled the request";
  remember(q.id, q.attempt, r);
  drop_session(q.id);
  ++cancelled;
}

void engine::impl::drop_session(const std::string& id) {
  if (auto it = active.find(id); it != active.end()) release(*it->second);
  active.erase(id);
  std::erase_if(queued, [&](const auto& s) { return s->req.id == id; });
}

std::optional<group_host*> engine::impl::group_for(const request& q, const placement::plan& p,
                                                   std::size_t group) {
  const auto& mp = *std::find_if(p.models.begin(), p.models.end(),
                                 [&](const auto& m) { return m.spec.name == q.model; });
  const auto& g = mp.groups.at(group);
  if (g.ranks.size() <= 1) return nullptr;
  group_host* h = held->host(group_key(q.model, g));
  // Still forming (or the plan just arrived): stay silent, the client re-publishes.
  if (h == nullptr || h->current() == group_host::state::forming) return std::nullopt;
  if (h->current() == group_host::state::failed) {
    // A group that lost a peer: the leader re-plans once membership notices; until then stay
    // silent (the client re-publishes). So does one that will form again (a peer was late). A
    // group that never formed and never will: an error.
    if (h->was_ready() || h->may_form_later()) return std::nullopt;
    ++rejected;
    send_error(q, error_code::no_capacity,
               fmt::format("model '{}': its group of {} peers cannot form: {}", q.model,
                           g.ranks.size(), h->failure()));
    return std::nullopt;
  }
  return h;
}

void engine::impl::on_request(request q) {
  if (q.cancel) return on_cancel(q);
  std::shared_ptr<const placement::plan> p;
  std::vector<member_id> members;
  {
    std::lock_guard lock(mu);
    p = plan;
    members = live;
  }
  // Duplicates first: the client re-publishes until it hears "accepted", and after silence it
  // re-publishes with a higher attempt.
  session* running = find_session(q.id);
  switch (admit(q, running ? std::optional(running->req.attempt) : std::nullopt, finished)) {
    case admission::running_duplicate:
      ++duplicates;
      send(accepted_of(*running));
      return;
    case admission::supersedes:
      ++superseded;
      drop_session(q.id);
      break;
    case admission::finished_duplicate:
      ++duplicates;
      send(finished.find(q.id)->final_msg);
      return;
    case admission::stale:
      ++duplicates;
      return;
    case admission::fresh:
      break;
  }
  auto d = decide(q, p.get(), members, opt.self, held->model_names(), held->fetching());
  if (d.action == intake_action::ignore) return;
  if (d.action == intake_action::reject) {
    ++rejected;
    send_error(q, d.code, d.message);
    return;
  }
  const auto host = group_for(q, *p, d.group);
  if (!host) return;
  loaded* lm = held->find(q.model);
  TESSERA_ASSERT(lm != nullptr, "intake accepted model '{}' that is not loaded", q.model);
  auto built = build_session(std::move(q), *lm, opt.max_context);
  if (!built.s) {
    send_error(q, built.code, std::move(built.message));  // q was not moved from
    return;
  }
  auto s = std::move(built.s);
  s->started = clock_type::now();
  s->host = *host;
  s->client = s->req.client;
  // A resumed stream is refused last: it may use the headroom too (an `overloaded` ends it).
  const std::size_t bound =
      opt.max_active + opt.max_queued + (s->req.attempt > 0 ? opt.resume_headroom : 0);
  if (active.size() + queued.size() >= bound && !make_way_for(*s)) {
    ++rejected;
    send_error(
        s->req, error_code::overloaded,
        fmt::format("peer {} has {} streams running and {} waiting (bounds {} and {}), {} of "
                    "them this client's",
                    opt.node_hex, active.size(), queued.size(), opt.max_active, opt.max_queued,
                    count_clients()[s->client].total()));
    return;
  }
  ++accepted;
  stats.accepted(s->req.model, s->prompt.size());
  send(accepted_of(*s));
  s->last_sent = clock_type::now();
  // A resumed stream (its serving peer died or its group moved) goes ahead of new requests:
  // its client has waited already, and it is behind the others only because of a fault.
  // Among resumed ones, first come first served.
  if (s->req.attempt > 0) {
    auto at = std::find_if(queued.begin(), queued.end(),
                           [](const auto& w) { return w->req.attempt == 0; });
    if (at != queued.end()) ++resumed_first;
    queued.insert(at, std::move(s));
  } else {
    queued.push_back(std::move(s));
  }
}

client_counts engine::impl::count_clients() const {
  client_counts counts;
  for (const auto& [id, s] : active)
    ++counts[s->client].running;
  for (const auto& s : queued)
    ++counts[s->client].waiting;
  return counts;
}

bool engine::impl::make_way_for(const session& newcomer) {
  const auto counts = count_clients();
  const auto from = makes_way_for(counts, newcomer.client);
  if (!from) return false;
  for (auto it = queued.rbegin(); it != queued.rend(); ++it) {
    session& w = **it;
    if (w.client != *from || w.sent_any) continue;
    ++made_way;
    send_error(
        w.req, error_code::overloaded,
        fmt::format(
            "peer {} is full: this client holds {} of its streams, and its "
            "newest waiting one made way for a client holding {}; retry later",
            opt.node_hex, counts.at(*from).total(),
            counts.contains(newcomer.client) ? counts.find(newcomer.client)->second.total() : 0));
    queued.erase(std::next(it).base());
    return true;
  }
  return false;
}

void engine::impl::drop_unservable() {
  for (auto q = queued.begin(); q != queued.end();) {
    session& w = **q;
    if (w.host != nullptr || waits_for_weights(w) || w.model->state == loaded::weights::ready) {
      ++q;
      continue;
    }
    if (w.model->state == loaded::weights::failed)
      send_error(w.req, error_code::no_capacity,
                 fmt::format("model '{}' did not load on peer {}: {}", w.req.model, opt.node_hex,
                             w.model->failure));
    else
      send_error(w.req, error_code::unavailable,
                 fmt::format("the plan no longer serves model '{}' on peer {}; resume", w.req.model,
                             opt.node_hex));
    q = queued.erase(q);
  }
}

void engine::impl::start_waiting() {
  if (queued.empty()) return;  // most rounds: no map of clients to build
  auto counts = count_clients();
  while (!queued.empty()) {
    const auto i = next_to_start(waiting_view(false), counts);
    if (!i) break;
    auto s = std::move(queued[*i]);
    queued.erase(queued.begin() + static_cast<std::ptrdiff_t>(*i));
    auto& c = counts[s->client];
    --c.waiting;
    if (auto a = activate(*s); !a) {
      // A split group that failed after it accepted the stream (a rank declared dead, a link
      // cut) is being re-planned: the client resumes, and its next attempt waits, silent,
      // for the group that replaces this one. Only a full group is out of capacity.
      const bool group_down = s->host != nullptr && s->host->current() == group_host::state::failed;
      send_error(s->req, group_down ? error_code::unavailable : error_code::no_capacity,
                 group_down ? fmt::format("{}; resume", a.error().message) : a.error().message);
      continue;
    }
    ++c.running;
    s->ran_since = clock_type::now();
    s->took_slot = ++slots_taken;
    const std::string id = s->req.id;
    active[id] = std::move(s);
  }
}

void engine::impl::preempt_for_fairness() {
  if (active.size() < opt.max_active || queued.empty()) return;
  if (next_to_start(waiting_view(false), {})) return;  // one can start without (the headroom)
  const auto counts = count_clients();
  const auto next = next_to_start(waiting_view(true), counts);
  if (!next) return;
  const auto from = preempted_for(counts, queued[*next]->client);
  if (!from) return;
  const auto now = clock_type::now();
  auto victim = active.end();
  for (auto it = active.begin(); it != active.end(); ++it) {
    const session& a = *it->second;
    if (a.client != *from || now - a.ran_since < kPreemptQuantum) continue;
    if (victim == active.end() || a.ran_since < victim->second->ran_since) victim = it;
  }
  if (victim == active.end()) return;
  auto s = std::move(victim->second);
  active.erase(victim);
  release(*s);
  s->ctx.reset();
  s->n_ctx = 0;
  s->fed = 0;  // prompt and generated tokens are read again when it runs again
  s->have_logits = false;
  ++preempted;
  queued.push_front(std::move(s));
}

std::vector<waiting_stream> engine::impl::waiting_view(bool ignore_slots) const {
  std::vector<waiting_stream> w;
  w.reserve(queued.size());
  for (const auto& q : queued) {
    const bool slot = ignore_slots || active.size() < opt.max_active ||
                      (q->req.attempt > 0 && active.size() < opt.max_active + opt.resume_headroom);
    w.push_back({q->client, slot && !waits_for_weights(*q)});
  }
  return w;
}

}  // namespace tessera::mesh::serving
