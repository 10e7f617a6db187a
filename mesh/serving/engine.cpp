#include "mesh/serving/engine.hpp"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "actors/base/assert.hpp"
#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"
#include "inference/gguf/gguf.hpp"
#include "inference/kernels/thread_pool.hpp"
#include "inference/model/model.hpp"
#include "inference/model/sampler.hpp"
#include "inference/tokenizer/chat.hpp"
#include "inference/tokenizer/json_grammar.hpp"
#include "inference/tokenizer/tokenizer.hpp"
#include "mesh/serving/client_port.hpp"
#include "mesh/serving/fair_share.hpp"
#include "mesh/serving/group_host.hpp"
#include "mesh/serving/holdings.hpp"
#include "mesh/serving/intake.hpp"
#include "mesh/serving/ledger.hpp"
#include "mesh/serving/model_share.hpp"
#include "mesh/serving/passes.hpp"
#include "mesh/serving/protocol.hpp"
#include "mesh/serving/session.hpp"
#include "mesh/serving/stream_stats.hpp"
#include "transport/faults/faulty_link.hpp"

namespace tessera::mesh::serving {

/// A stream whose topic has had no subscriber on this peer for this long is cut (its client
/// left or never listened): its slot goes to requests someone reads.
inline constexpr auto kUnreadStreamCut = std::chrono::seconds(5);
/// A running stream makes way for a client with fewer (fair_share.hpp, rule 3) only after it has
/// run this long since it took its slot: each turn pays for the re-read of its tokens so far.
inline constexpr auto kPreemptQuantum = std::chrono::milliseconds(500);

namespace inf = tessera::inference;
namespace mdl = tessera::inference::model;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

// group_link messages waiting for the engine thread.
constexpr std::size_t kMaxLinkMessages = 256;


struct engine::impl {
  engine_options opt;
  [[nodiscard]] const std::string& client_address() const {
    return opt.client_bind_address.empty() ? opt.bind_address : opt.client_bind_address;
  }
  std::unique_ptr<inf::thread_pool> pool;
  /// The node's compute budget, shared by this pool and every split group's (issue 31: compute
  /// threads never exceed --threads, split groups included).
  std::shared_ptr<inf::compute_gate> gate = std::make_shared<inf::compute_gate>();

  // The client endpoints and their io thread; the engine thread publishes through `push`.
  std::unique_ptr<client_port> port;
  zmq::socket_t push;

  std::atomic<bool> stopping{false};  // engine thread: stop
  std::thread engine_thread;

  // --- shared between the io / loop threads and the engine thread (under mu) ---
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<request> inbox;
  std::shared_ptr<const placement::plan> plan;
  std::vector<member_id> live;
  std::map<member_id, peer_facts> peers;
  std::deque<group_link_message> link_inbox;  // bounded by kMaxLinkMessages
  std::uint64_t dropped_inbox = 0;
  // counters, written by the engine / io threads
  std::atomic<std::uint64_t> malformed{0}, accepted{0}, completed{0}, rejected{0}, superseded{0},
      tokens_out{0}, duplicates{0}, cancelled{0},
      resumed_first{0},  // resumed streams queued ahead of new ones
      made_way{0},       // waiting streams refused for a newcomer of a client with fewer
      preempted{0},      // running streams sent back to the queue for a client with fewer
      unread_streams_cut{0},
      shared_prefix_tokens{0};  // prompt positions taken from another stream's KV cache
  std::vector<json> active_view;  // for status (under mu)
  stream_stats stats;             // per model: time to first token, between tokens, duration
  std::vector<json> groups_view;  // for status (under mu)
  std::vector<json> replicas_view;  // for status (under mu): MoE replicas' expert load

  // Models, weights, split groups and fetches (holdings.hpp): made after the pool, gone first.
  std::unique_ptr<holdings> held;
  std::unique_ptr<round_passes> passes;  // the engine loop's forward passes (after the pool)

  // --- engine thread only ---
  std::map<std::string, std::set<std::uint32_t>> used_seqs;  // split groups' sequence slots, by key
  const placement::plan* reconciled = nullptr;
  std::shared_ptr<const placement::plan> current_plan;
  std::map<std::string, std::unique_ptr<session>> active;  // by request id
  std::uint64_t slots_taken = 0;  // engine thread: numbers session::took_slot
  std::deque<std::unique_ptr<session>> queued;
  // Requests remembered after their stream ended, so that a duplicate of a finished attempt
  // gets its final message again instead of a second generation.
  finished_ledger finished;

  /// A request from the client port (its io thread): queued for the engine thread, or dropped
  /// and counted at the bound (the client re-publishes, so this is a loss, never a wrong answer).
  void to_inbox(request&& r) {
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

  // ------------------------------------------------------------------ engine thread
  void send(const response& r) {
    const std::string topic = response_topic(r.id);
    const std::string body = encode(r);
    (void)push.send(zmq::buffer(topic), zmq::send_flags::sndmore);
    (void)push.send(zmq::buffer(body), zmq::send_flags::none);
  }

  response base(const request& q, std::string_view kind) const {
    response r;
    r.kind = std::string(kind);
    r.id = q.id;
    r.attempt = q.attempt;
    r.node = opt.node_hex;
    return r;
  }

  /// "accepted" for a session: with its prompt's token count, so that a client that ends the
  /// stream early (a stop sequence) can still report usage.
  response accepted_of(const session& s) const {
    auto r = base(s.req, "accepted");
    r.prompt_tokens = static_cast<std::uint32_t>(s.prompt.size());
    return r;
  }

  void send_error(const request& q, std::string_view code, std::string message) {
    auto r = base(q, "error");
    r.code = std::string(code);
    r.message = std::move(message);
    remember(q.id, q.attempt, r);
    send(r);
  }

  void remember(const std::string& id, std::uint32_t attempt, const response& final_msg) {
    finished.remember(id, attempt, final_msg);
  }

  session* find_session(const std::string& id) {
    if (auto it = active.find(id); it != active.end()) return it->second.get();
    for (auto& s : queued)
      if (s->req.id == id) return s.get();
    return nullptr;
  }

  /// Streams whose topic has had no subscriber here for kUnreadStreamCut end with `unavailable`
  /// (remembered, so the client, if it comes back, resumes with a new attempt): nobody reads
  /// them, and their slots belong to clients who do.
  void cut_unread_streams(clock_type::time_point now) {
    const auto cut = port->take_unread(now, kUnreadStreamCut);
    for (const auto& id : cut) {
      session* s = find_session(id);
      if (s == nullptr) continue;
      ++unread_streams_cut;
      const request q = s->req;
      drop_session(id);
      send_error(
          q, error_code::unavailable,
          fmt::format("nobody subscribed to the stream on peer {} for {} s: cut; resume",
                      opt.node_hex,
                      std::chrono::duration_cast<std::chrono::seconds>(kUnreadStreamCut).count()));
    }
  }

  /// A cancel: the peer serving the id (any attempt up to the cancelled one) drops the stream and
  /// remembers it as finished, so a re-publication still in flight does not start it again. Every
  /// other peer has no session and does nothing.
  void on_cancel(const request& q) {
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

  void drop_session(const std::string& id) {
    if (auto it = active.find(id); it != active.end()) release(*it->second);
    active.erase(id);
    std::erase_if(queued, [&](const auto& s) { return s->req.id == id; });
  }

  void on_request(request q) {
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
    group_host* host = nullptr;
    {
      const auto& mp = *std::find_if(p->models.begin(), p->models.end(),
                                     [&](const auto& m) { return m.spec.name == q.model; });
      const auto& g = mp.groups.at(d.group);
      if (g.ranks.size() > 1) {
        group_host* h = held->host(group_key(q.model, g));
        // Still forming (or the plan just arrived): stay silent, the client re-publishes.
        if (h == nullptr || h->current() == group_host::state::forming) return;
        if (h->current() == group_host::state::failed) {
          // A group that lost a peer: the leader re-plans once membership notices; until then
          // stay silent (the client re-publishes). So does one that will form again (a peer
          // was late). A group that never formed and never will: an error.
          if (h->was_ready() || h->may_form_later()) return;
          ++rejected;
          send_error(q, error_code::no_capacity,
                     fmt::format("model '{}': its group of {} peers cannot form: {}", q.model,
                                 g.ranks.size(), h->failure()));
          return;
        }
        host = h;
      }
    }
    loaded* lm = held->find(q.model);
    TESSERA_ASSERT(lm != nullptr, "intake accepted model '{}' that is not loaded", q.model);
    auto built = build_session(std::move(q), *lm, opt.max_context);
    if (!built.s) {
      send_error(q, built.code, std::move(built.message));  // q was not moved from
      return;
    }
    auto s = std::move(built.s);
    s->started = clock_type::now();
    s->host = host;
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

  /// Each client's running and waiting streams here.
  client_counts count_clients() const {
    client_counts counts;
    for (const auto& [id, s] : active)
      ++counts[s->client].running;
    for (const auto& s : queued)
      ++counts[s->client].waiting;
    return counts;
  }

  /// Rule 1 of fair_share.hpp: at the bound, the newest waiting stream of the client holding the
  /// most (two more than the newcomer's) ends `overloaded`, and the newcomer takes its place.
  /// Only a stream that sent no token yet: one that was running and went back to the queue (rule
  /// 3) keeps its place.
  bool make_way_for(const session& newcomer) {
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

  /// Allocates the KV cache when a session gets a slot (queued sessions hold none).
  result<void> activate(session& s) {
    const std::int64_t cap =
        std::min<std::int64_t>(s.model->hp.n_ctx_train, opt.max_context);
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
    auto ctx = mdl::context::create(*s.model->m, {n_ctx, opt.prefill_chunk, pool.get(), {}});
    if (!ctx) return ctx.error();
    s.ctx = std::move(*ctx);
    s.n_ctx = n_ctx;
    return ok();
  }

  void finish(session& s, std::string_view stop) {
    auto r = base(s.req, "done");
    r.tokens = s.next_index;
    r.prompt_tokens = static_cast<std::uint32_t>(s.prompt.size());
    r.stop = std::string(stop);
    ++completed;
    stats.finished(s.req.model,
                   std::chrono::duration<double>(clock_type::now() - s.started).count());
    remember(s.req.id, s.req.attempt, r);
    send(r);
  }

  /// Frees what a session holds on its group (the runner's sequence slot).
  void release(session& s) {
    if (s.host == nullptr || s.n_ctx == 0) return;
    if (auto* ru = s.host->runner()) (void)ru->close(s.seq);
    used_seqs[s.host->key()].erase(s.seq);
    s.n_ctx = 0;
  }

  void fail_stream(session& s, const error& e) {
    send_error(s.req, s.host != nullptr ? error_code::unavailable : error_code::internal,
               e.message);
  }

  /// Prefix sharing (n > 1 choices, one system prompt): another local stream of the model that
  /// read the same first tokens lends its KV cache for them, so that they are evaluated once. Its
  /// evaluated positions are copied; while one that took its slot earlier is still reading the
  /// shared tokens, `s` waits for it (true: no unit this round) instead of computing them twice —
  /// it cannot wait forever: the earliest of them never waits, and every active stream advances
  /// each round (a preempted one leaves `active`). The last prompt token is always evaluated
  /// here, for the logits.
  bool share_prefix(session& s, std::size_t feed_size) {
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

  /// One unit of work for `s`: a prefill chunk or one generated token. False when it ended. A
  /// local stream's evaluation joins `round` (the caller runs it); its state advances as if done.
  bool step(session& s) {
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
    stats.token(
        s.req.model, !s.sent_any,
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

  /// A queued local stream whose model will not be ready here (its load failed, or the plan moved
  /// it elsewhere) ends now with the reason; the others wait.
  void drop_unservable() {
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
                   fmt::format("the plan no longer serves model '{}' on peer {}; resume",
                               w.req.model, opt.node_hex));
      q = queued.erase(q);
    }
  }

  /// The queued streams as fair_share's rule 2 sees them: whether each may start now, given the
  /// free slots (a resumed one may also take the headroom beyond max_active; `ignore_slots`: as
  /// if a slot were free).
  std::vector<waiting_stream> waiting_view(bool ignore_slots) const {
    std::vector<waiting_stream> w;
    w.reserve(queued.size());
    for (const auto& q : queued) {
      const bool slot =
          ignore_slots || active.size() < opt.max_active ||
          (q->req.attempt > 0 && active.size() < opt.max_active + opt.resume_headroom);
      w.push_back({q->client, slot && !waits_for_weights(*q)});
    }
    return w;
  }

  /// Rule 2 of fair_share.hpp: free slots go to the waiting streams of the clients running the
  /// fewest (queue order among equals: resumed streams first); a local stream whose model is
  /// still loading waits, with keepalives, and lets the others go first.
  void start_waiting() {
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
        const bool group_down =
            s->host != nullptr && s->host->current() == group_host::state::failed;
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

  /// Rule 3 of fair_share.hpp: every slot taken, and the stream that would start next belongs to
  /// a client running at least two fewer than another: that other client's stream that has run
  /// longest (at least kPreemptQuantum) goes back to the head of the queue. Its tokens so far stay
  /// in its history, which it re-reads when it runs again (as a resumed stream does), and its
  /// client gets keepalives meanwhile: a pause, nothing lost. One per round.
  void preempt_for_fairness() {
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

  void keepalive(session& s) {
    const auto now = clock_type::now();
    if (now - s.last_sent <= std::chrono::milliseconds(opt.keepalive_ms)) return;
    send(accepted_of(s));
    s.last_sent = now;
  }

  void publish_active_view() {
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

  void engine_loop() {
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
            return stopping.load() || !inbox.empty() || !link_inbox.empty() ||
                   held->needs_tending();
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

  /// The streams on a group that holdings drops end with `unavailable`, and their clients
  /// resume them on the group that replaces it.
  void on_host_dropped(group_host& h, std::string_view why) {
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

  /// Whether a local stream still uses `lm`'s whole weights (they stay loaded until none does).
  bool uses_weights(const loaded& lm) const {
    const auto uses = [&](const session& s) { return s.model == &lm && s.host == nullptr; };
    return std::any_of(active.begin(), active.end(),
                       [&](const auto& a) { return uses(*a.second); }) ||
           std::any_of(queued.begin(), queued.end(), [&](const auto& q) { return uses(*q); });
  }
};

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
    impl_->held->registry().abort_unplanned(planned, fmt::format("{}.{}", plan->epoch.term,
                                                         plan->epoch.version));
  }
  {
    impl_->port->set_peer_list(
        std::move(client_endpoints),
        peer_list_nodes(plan != nullptr, impl_->opt.self, impl_->opt.node_hex, live,
                        [&](member_id id) {
                          auto it = peers.find(id);
                          return it != peers.end() ? it->second.hex : std::string();
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
