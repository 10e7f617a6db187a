// engine's insides (private to mesh/serving): what the engine holds and its steps. engine.cpp
// runs sessions (the engine loop, forward passes, tokens out) and has the public API;
// engine_intake.cpp decides which requests become sessions and when they run (duplicates and the
// ledger, admission, the bounds, fair shares).
#pragma once

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
      shared_prefix_tokens{0};      // prompt positions taken from another stream's KV cache
  std::vector<json> active_view;    // for status (under mu)
  stream_stats stats;               // per model: time to first token, between tokens, duration
  std::vector<json> groups_view;    // for status (under mu)
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
  void to_inbox(request&& r);

  // ------------------------------------------------------------------ engine thread
  void send(const response& r);

  response base(const request& q, std::string_view kind) const;

  /// "accepted" for a session: with its prompt's token count, so that a client that ends the
  /// stream early (a stop sequence) can still report usage.
  response accepted_of(const session& s) const;

  void send_error(const request& q, std::string_view code, std::string message);

  void remember(const std::string& id, std::uint32_t attempt, const response& final_msg) {
    finished.remember(id, attempt, final_msg);
  }

  session* find_session(const std::string& id);

  /// Streams whose topic has had no subscriber here for kUnreadStreamCut end with `unavailable`
  /// (remembered, so the client, if it comes back, resumes with a new attempt): nobody reads
  /// them, and their slots belong to clients who do.
  void cut_unread_streams(clock_type::time_point now);

  /// A cancel: the peer serving the id (any attempt up to the cancelled one) drops the stream and
  /// remembers it as finished, so a re-publication still in flight does not start it again. Every
  /// other peer has no session and does nothing.
  void on_cancel(const request& q);

  void drop_session(const std::string& id);

  void on_request(request q);

  /// The split group that serves `q` (the plan's group `group` of its model): nullptr for a
  /// replica of one rank; nullopt when `q` waits in silence (the group is forming, or failed and
  /// will be re-planned) or was refused here (a group that will never form).
  std::optional<group_host*> group_for(const request& q, const placement::plan& p,
                                       std::size_t group);

  /// Each client's running and waiting streams here.
  client_counts count_clients() const;

  /// Rule 1 of fair_share.hpp: at the bound, the newest waiting stream of the client holding the
  /// most (two more than the newcomer's) ends `overloaded`, and the newcomer takes its place.
  /// Only a stream that sent no token yet: one that was running and went back to the queue (rule
  /// 3) keeps its place.
  bool make_way_for(const session& newcomer);

  /// Allocates the KV cache when a session gets a slot (queued sessions hold none).
  result<void> activate(session& s);

  void finish(session& s, std::string_view stop);

  /// Frees what a session holds on its group (the runner's sequence slot).
  void release(session& s);

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
  bool share_prefix(session& s, std::size_t feed_size);

  /// One unit of work for `s`: a prefill chunk or one generated token. False when it ended. A
  /// local stream's evaluation joins `round` (the caller runs it); its state advances as if done.
  bool step(session& s);

  /// A queued local stream whose model will not be ready here (its load failed, or the plan moved
  /// it elsewhere) ends now with the reason; the others wait.
  void drop_unservable();

  /// The queued streams as fair_share's rule 2 sees them: whether each may start now, given the
  /// free slots (a resumed one may also take the headroom beyond max_active; `ignore_slots`: as
  /// if a slot were free).
  std::vector<waiting_stream> waiting_view(bool ignore_slots) const;

  /// Rule 2 of fair_share.hpp: free slots go to the waiting streams of the clients running the
  /// fewest (queue order among equals: resumed streams first); a local stream whose model is
  /// still loading waits, with keepalives, and lets the others go first.
  void start_waiting();

  /// Rule 3 of fair_share.hpp: every slot taken, and the stream that would start next belongs to
  /// a client running at least two fewer than another: that other client's stream that has run
  /// longest (at least kPreemptQuantum) goes back to the head of the queue. Its tokens so far stay
  /// in its history, which it re-reads when it runs again (as a resumed stream does), and its
  /// client gets keepalives meanwhile: a pause, nothing lost. One per round.
  void preempt_for_fairness();

  void keepalive(session& s);

  void publish_active_view();

  void engine_loop();

  /// The streams on a group that holdings drops end with `unavailable`, and their clients
  /// resume them on the group that replaces it.
  void on_host_dropped(group_host& h, std::string_view why);

  /// Whether a local stream still uses `lm`'s whole weights (they stay loaded until none does).
  bool uses_weights(const loaded& lm) const;
};

}  // namespace tessera::mesh::serving
