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
#include "mesh/serving/connection_guard.hpp"
#include "mesh/serving/fair_share.hpp"
#include "mesh/serving/group_host.hpp"
#include "mesh/serving/intake.hpp"
#include "mesh/serving/ledger.hpp"
#include "mesh/serving/model_share.hpp"
#include "mesh/serving/protocol.hpp"
#include "mesh/serving/stream_stats.hpp"
#include "transport/faults/faulty_link.hpp"

namespace tessera::mesh::serving {

/// Largest message a client may send to the response port (XPUB): a subscription is 1 + topic
/// bytes, the longest topic `<id>:` is max_id_bytes + 1. The bound also applies to the CURVE
/// handshake under --client-auth (INITIATE with its vouch and metadata is ~300 bytes; 256 refused
/// every keyed client) and to each encrypted frame's overhead: 1 KiB covers both.
inline constexpr std::size_t kMaxSubscriptionBytes = 1024;
static_assert(kMaxSubscriptionBytes >= 2 + max_id_bytes && 128 >= 2 + max_id_bytes);
/// Response topics a peer honours subscriptions to at once (`:peers` aside): the in-flight
/// requests of every client connected to it (a peer runs 8 streams and queues 64; clients
/// subscribe on every peer), while a flood of distinct topics is refused (counted).
inline constexpr std::size_t kMaxSubscribedTopics = 512;
/// Subscription bytes (topics + 1) libzmq may hold for the response port's connections. libzmq
/// keeps every subscription a connection sends, honoured or refused, in a trie of one node per
/// byte (~100-200x the topic bytes, measured: 10 MB of topics once cost the peer 860 MB, and a
/// budget of 64 KiB bounded a flood to +6-8 MB of peak RSS). Honest clients hold `:peers` and
/// their requests' topics (<= 66 bytes each): kMaxSubscribedTopics of them are 34 KB.
inline constexpr std::size_t kMaxSubscriptionTrieBytes = 64 * 1024;
/// A request read before its topic's subscription waits this long for it (the two travel on
/// different connections), at most this many at once (the oldest make way: a flood of requests
/// nobody subscribes to only ever costs this much).
inline constexpr auto kAwaitSubscriber = std::chrono::milliseconds(250);
inline constexpr std::size_t kMaxAwaitingSubscriber = 256;
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

// group_link messages waiting for the engine thread, and per group not formed here yet.
constexpr std::size_t kMaxLinkMessages = 256;
// A group that failed (to form, a peer being late; or later, a rank lost) is formed again after
// this long, if the plan still names it.
constexpr auto kReformAfter = std::chrono::seconds(5);

result<placement::model_spec> spec_of_gguf(const std::string& path, const std::string& name) {
  auto f = inf::gguf::file::open(path, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  auto hp = mdl::read_hparams(*f);
  if (!hp) return hp.error();
  placement::model_spec s;
  s.name = name;
  s.n_layers = static_cast<std::uint32_t>(hp->n_layer);
  s.n_heads = static_cast<std::uint32_t>(hp->n_head);
  s.n_kv_heads = static_cast<std::uint32_t>(hp->n_head_kv);
  s.dim = static_cast<std::uint32_t>(hp->dim);
  s.ffn_size = static_cast<std::uint32_t>(hp->ffn);
  // Of a mixture of experts the FFN axis is the experts' hidden units side by side, and a rank's
  // range must hold whole experts: splitting it is expert parallelism.
  // (A multiple of the column block too, as every FFN split: lcm, for widths no real model has.)
  if (hp->is_moe()) {
    s.ffn_block =
        static_cast<std::uint32_t>(std::lcm<std::int64_t>(hp->expert_ffn, s.column_block));
    s.n_experts = static_cast<std::uint32_t>(hp->n_expert);
    s.n_experts_used = static_cast<std::uint32_t>(hp->n_expert_used);
  }
  s.n_vocab = static_cast<std::uint32_t>(hp->n_vocab);
  std::uint64_t blocks = 0;
  for (const auto& t : f->tensors()) {
    if (t.name.starts_with("blk."))
      blocks += t.size;
    else if (t.name == "token_embd.weight")
      s.bytes_embeddings = t.size;
    else if (t.name == "output.weight")
      s.bytes_output = t.size;
  }
  s.bytes_per_layer = s.n_layers ? blocks / s.n_layers : 0;
  s.tied_embeddings = hp->tied_output;
  // The KV cache is F16: K and V, every layer, every KV head.
  s.kv_bytes_per_token = 2ULL * 2ULL * static_cast<std::uint64_t>(hp->n_layer) *
                         static_cast<std::uint64_t>(hp->kv_dim());
  s.context_tokens = static_cast<std::uint32_t>(std::min<std::int64_t>(hp->n_ctx_train, 4096));
  if (auto v = placement::validate_model_spec(s); !v) return v.error();
  return s;
}

namespace {

/// A model this peer has the file of. Its tokenizer and hyper-parameters are read at start (and its
/// tensors checked); its weights are loaded only while the plan gives this peer a group of its own
/// for it (a replica), on a loader thread, and dropped when the plan moves it elsewhere: a peer that
/// serves a slice of the model holds only the slice (in its group_host).
struct loaded {
  enum class weights : std::uint8_t { none, loading, ready, failed };

  local_model info;
  std::unique_ptr<inf::gguf::file> file;  // headers only: the loader reads the tensors' ranges
  std::unique_ptr<inf::tokenizer::tokenizer> tok;
  mdl::hparams hp;
  inf::tokenizer::chat_template chat;  // the file's Jinja template, else a built-in family
  // The vocabulary as JSON-constrained sampling sees it: made by the engine thread at the first
  // request that asks for a JSON answer.
  std::unique_ptr<inf::tokenizer::json_vocab> json_vocab;
  // A model fetched from peers (its file holds only the parts fetched): every use of a part waits
  // until fetch->ready_for() it. Null for a file of our own.
  model_fetch* fetch = nullptr;
  // Written by the engine thread only; atomic so that status() may read it from another thread.
  std::atomic<weights> state{weights::none};
  // --- engine thread ---
  bool wanted = false;                 // the plan gives this peer a replica of it
  std::unique_ptr<mdl::model> m;       // state == ready
  std::unique_ptr<mdl::workspace> ws;  // scratch of the batched passes over local streams
  std::string failure;                 // state == failed: why
  std::thread loader;
  // --- written by the loader thread, read by the engine thread and status() ---
  std::atomic<bool> load_finished{false};
  std::unique_ptr<mdl::model> loaded_model;  // valid once load_finished
  std::string load_error;                    // valid once load_finished
  std::atomic<std::uint64_t> loaded_bytes{0}, total_bytes{0};

  loaded() = default;
  loaded(const loaded&) = delete;
  loaded& operator=(const loaded&) = delete;
  ~loaded() {
    if (loader.joinable()) loader.join();
  }
};

const char* weights_name(loaded::weights w) {
  switch (w) {
    case loaded::weights::none: return "none";
    case loaded::weights::loading: return "loading";
    case loaded::weights::ready: return "ready";
    case loaded::weights::failed: return "failed";
  }
  return "?";
}

/// Reads a model's header, tokenizer and hyper-parameters and checks its tensors (no weights).
result<std::unique_ptr<loaded>> open_model(const std::string& path, const std::string& name) {
  auto l = std::make_unique<loaded>();
  l->info.path = path;
  l->info.name = name;
  auto spec = spec_of_gguf(path, name);
  if (!spec) return spec.error();
  l->info.spec = *spec;
  auto f = inf::gguf::file::open(path, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  std::error_code ec;
  l->info.file_bytes = fs::file_size(path, ec);
  auto tok = inf::tokenizer::tokenizer::from_gguf(*f);
  if (!tok) return tok.error();
  l->tok = std::make_unique<inf::tokenizer::tokenizer>(std::move(*tok));
  l->chat = inf::tokenizer::chat_template_for(*f, *l->tok);
  auto hp = mdl::read_hparams(*f);
  if (!hp) return hp.error();
  l->hp = *hp;
  // Every tensor present with its shape and type: a broken file stops the node now, naming the
  // tensor, rather than when a plan first asks this peer for a replica.
  auto bytes = mdl::model::check(*f);
  if (!bytes) return bytes.error();
  l->total_bytes = *bytes;
  l->file = std::make_unique<inf::gguf::file>(std::move(*f));
  return l;
}

struct session {
  request req;
  loaded* model = nullptr;
  std::vector<mdl::token_id> prompt;   // what the model reads before generating
  std::vector<mdl::token_id> history;  // prompt + generated (the repetition penalty's window)
  std::size_t fed = 0;                 // prompt tokens evaluated so far
  std::uint32_t next_index = 0;        // index of the next generated token
  std::unique_ptr<mdl::context> ctx;   // a local model, or:
  group_host* host = nullptr;          // a group split over peers (this peer is rank 0)
  std::uint32_t seq = 0;               // the host runner's sequence slot
  std::int64_t n_ctx = 0;
  std::unique_ptr<mdl::sampler> sampler;
  std::vector<float> logits, work;
  bool have_logits = false;
  clock_type::time_point last_sent{};
  clock_type::time_point started{};  // accepted here (the stream statistics' zero)
  bool sent_any = false;             // a token of this attempt went out
  std::string client;                // the identity its fair share counts by (request::client)
  // format json_object / json_schema: the answer so far, as the beginning of a valid one (its
  // tokens are masked to keep it so, and the stream ends once it is complete). The compiled
  // schema lives here, beside the state that points at it.
  std::unique_ptr<const inf::tokenizer::json_schema> schema;
  std::optional<inf::tokenizer::json_prefix> json;
  clock_type::time_point ran_since{};  // took its slot (rule 3's quantum counts from here)
  std::uint64_t took_slot = 0;         // the order streams took their slots (prefix sharing)
};

/// A local stream whose model's weights are on their way (loading, or about to): it waits queued.
bool waits_for_weights(const session& s) {
  if (s.host != nullptr) return false;
  const auto w = s.model->state.load();
  return w == loaded::weights::loading || (w == loaded::weights::none && s.model->wanted);
}

}  // namespace

struct engine::impl {
  engine_options opt;
  [[nodiscard]] const std::string& client_address() const {
    return opt.client_bind_address.empty() ? opt.bind_address : opt.client_bind_address;
  }
  std::vector<std::unique_ptr<loaded>> models;
  std::vector<local_model> infos;
  std::vector<std::string> model_names;
  std::unique_ptr<inf::thread_pool> pool;
  /// The node's compute budget, shared by this pool and every split group's (issue 31: compute
  /// threads never exceed --threads, split groups included).
  std::shared_ptr<inf::compute_gate> gate = std::make_shared<inf::compute_gate>();

  zmq::context_t zctx{1};
  zmq::socket_t sub{zctx, zmq::socket_type::sub};
  zmq::socket_t xpub{zctx, zmq::socket_type::xpub};
  zmq::socket_t pull{zctx, zmq::socket_type::pull};
  zmq::socket_t push{zctx, zmq::socket_type::push};
  // The ZAP handler of this context (client authentication only; bound before the endpoints).
  std::optional<zmq::socket_t> zap;
  // Bounds the client endpoints' connections (slot 0: the request port, 1: the response port);
  // read by the io thread, made before the endpoints bind.
  std::unique_ptr<connection_guard> guard;
  std::atomic<std::uint64_t> connections_refused{0}, connections_open{0};
  std::uint16_t req_port = 0, resp_port = 0;
  std::atomic<std::uint64_t> auth_allowed{0}, auth_denied{0};

  std::atomic<bool> stopping{false};     // engine thread: stop
  std::atomic<bool> io_stopping{false};  // io thread: stop (after the engine's last messages)
  std::thread io_thread, engine_thread;

  // --- shared between the io / loop threads and the engine thread (under mu) ---
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<request> inbox;
  std::shared_ptr<const placement::plan> plan;
  std::vector<member_id> live;
  std::vector<std::string> client_endpoints;
  // The live members' node ids (ours first) for peer lists; empty until a plan arrives, so that a
  // peer without a view never tells clients that their serving peer is gone.
  std::vector<std::string> live_nodes;
  std::map<member_id, peer_facts> peers;
  // Set when the live members changed: the io thread publishes the peer list at once, so clients
  // whose serving peer was declared dead resume now rather than after 3 s of silence.
  std::atomic<bool> peers_changed{false};
  std::deque<group_link_message> link_inbox;  // bounded by kMaxLinkMessages
  std::uint64_t dropped_inbox = 0;
  // Request ids whose response topic lost its last subscriber here, and since when (the io
  // thread adds and removes them; the engine cuts their streams after kUnreadStreamCut). At
  // most kMaxSubscribedTopics entries: only a topic that was subscribed can lose its subscriber.
  std::unordered_map<std::string, clock_type::time_point> unsubscribed_since;
  // counters, written by the engine / io threads
  std::atomic<std::uint64_t> malformed{0}, accepted{0}, completed{0}, rejected{0}, superseded{0},
      tokens_out{0}, duplicates{0}, cancelled{0},
      resumed_first{0},  // resumed streams queued ahead of new ones
      made_way{0},       // waiting streams refused for a newcomer of a client with fewer
      preempted{0},      // running streams sent back to the queue for a client with fewer
      subscriptions_refused{0}, unread_requests{0}, unread_streams_cut{0},
      shared_prefix_tokens{0};  // prompt positions taken from another stream's KV cache
  // --- io thread only: subscribers per response topic (request id) on the XPUB, and the bytes
  // of every subscription libzmq holds for its connections (kMaxSubscriptionTrieBytes) ---
  std::unordered_map<std::string, std::uint32_t> topic_subscribers;
  std::size_t subscription_bytes = 0;
  // Requests read before their topic's subscription, oldest first (kMaxAwaitingSubscriber).
  struct awaiting {
    clock_type::time_point until;
    request req;
  };
  std::deque<awaiting> awaiting_subscriber;
  std::atomic<std::uint64_t> response_port_resets{0};
  // Forward passes over local streams, and the stream-units they carried (their ratio is the mean
  // batch); written by the engine thread.
  std::atomic<std::uint64_t> passes{0}, pass_streams{0};
  std::vector<json> active_view;  // for status (under mu)
  stream_stats stats;             // per model: time to first token, between tokens, duration
  std::vector<json> groups_view;  // for status (under mu)
  std::vector<json> replicas_view;  // for status (under mu): MoE replicas' expert load

  // --- model distribution (model_share.hpp) ---
  // Guards `models` growing (the engine thread adopts a fetched model) and `fetches` against
  // status() and on_share() on other threads; the engine thread reads both without it.
  mutable std::mutex models_mu;
  std::unique_ptr<share_server> server;                         // our files, to fetchers
  std::map<std::string, std::unique_ptr<model_fetch>> fetches;  // by model name
  std::uint64_t next_fetch_id = 1;
  std::atomic<bool> fetch_changed{false};  // a fetch finished or failed: reconcile again
  std::set<std::string> served_on;         // fetched models the share server serves on
  std::map<std::string, clock_type::time_point> unformed_since;  // failed hosts: since when

  // The hosts below, for set_plan() on the node's thread: it aborts the groups of a member the
  // view dropped, which the engine thread cannot do while it waits inside one of them.
  group_registry registry;

  // --- engine thread only ---
  std::map<std::string, std::unique_ptr<group_host>> hosts;  // groups split over peers, by key
  std::map<std::string, std::deque<group_link_message>> early_links;  // for hosts not made yet
  std::map<std::string, std::set<std::uint32_t>> used_seqs;           // by host key
  std::map<std::string, clock_type::time_point> last_ping;
  const placement::plan* reconciled = nullptr;
  std::shared_ptr<const placement::plan> current_plan;
  std::map<std::string, std::unique_ptr<session>> active;  // by request id
  std::uint64_t slots_taken = 0;  // engine thread: numbers session::took_slot
  std::deque<std::unique_ptr<session>> queued;
  // Requests remembered after their stream ended, so that a duplicate of a finished attempt
  // gets its final message again instead of a second generation.
  finished_ledger finished;

  // ------------------------------------------------------------------ io thread
  void io_loop() {
    name_this_thread("serve-io");
    zmq::pollitem_t items[] = {{sub.handle(), 0, ZMQ_POLLIN, 0},
                               {pull.handle(), 0, ZMQ_POLLIN, 0},
                               {xpub.handle(), 0, ZMQ_POLLIN, 0},
                               {zap->handle(), 0, ZMQ_POLLIN, 0},
                               {guard->monitor_handle(0), 0, ZMQ_POLLIN, 0},
                               {guard->monitor_handle(1), 0, ZMQ_POLLIN, 0}};
    auto next_peers = clock_type::now();
    while (!io_stopping.load()) {
      try {
        items[2].socket = xpub.handle();  // a reset replaces the socket and its monitor
        items[5].socket = guard->monitor_handle(1);
        zmq::poll(items, 6, std::chrono::milliseconds(100));
        // Connections first: one past a bound is shut down before it is read from.
        for (int slot = 0; slot < 2; ++slot)
          if (items[4 + slot].revents & ZMQ_POLLIN) guard->drain(slot);
        connections_open = guard->ledger().open();
        connections_refused = guard->refused();
        if (items[3].revents & ZMQ_POLLIN) answer_zap();
        // Subscriptions first: a client subscribes to a request's topic before it publishes the
        // request, and the request must find that subscription here.
        if (items[2].revents & ZMQ_POLLIN && drain_subscriptions()) next_peers = clock_type::now();
        if (items[0].revents & ZMQ_POLLIN) on_request_frames();
        expire_awaiting();
        if (items[1].revents & ZMQ_POLLIN) forward_responses();
        if (peers_changed.exchange(false) || clock_type::now() >= next_peers) {
          publish_peers();
          next_peers = clock_type::now() + std::chrono::seconds(2);
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        spdlog::warn("serving {}: client endpoint: {}", opt.node_hex, e.what());
      }
    }
    // Last messages (the shutdown errors) go out before the sockets close.
    try {
      forward_responses();
    } catch (const zmq::error_t&) {
    }
  }

  /// ZAP (RFC 27) for the client endpoints: admits a CURVE client presenting the cluster's client
  /// access key, refuses everything else (counted; logged at most once a second).
  void answer_zap() {
    for (int n = 0; n < 64; ++n) {
      std::vector<zmq::message_t> parts;
      zmq::message_t m;
      if (!zap->recv(m, zmq::recv_flags::dontwait)) return;
      parts.push_back(std::move(m));
      while (parts.back().more() && parts.size() < 16) {
        zmq::message_t next;
        (void)zap->recv(next, zmq::recv_flags::none);
        parts.push_back(std::move(next));
      }
      // version, request id, domain, address, identity, mechanism[, credentials (the key)].
      // Open endpoints ask only for the user id (the NULL mechanism); keyed ones for CURVE with
      // the cluster's client key.
      const bool allow =
          parts.size() >= 6 && parts[0].to_string_view() == "1.0" &&
          (opt.client_auth
               ? parts.size() == 7 && parts[5].to_string_view() == "CURVE" &&
                     parts[6].size() == 32 &&
                     std::memcmp(parts[6].data(), opt.client_auth->allowed_client.data(), 32) == 0
               : parts[5].to_string_view() == "NULL");
      if (allow) {
        if (opt.client_auth) auth_allowed.fetch_add(1);
      } else {
        auth_denied.fetch_add(1);
        const auto now = clock_type::now();
        if (now - last_auth_log >= std::chrono::seconds(1)) {
          last_auth_log = now;
          spdlog::warn(
              "serving {}: refused a client from {}: not the cluster's client access key "
              "({} refused so far)",
              opt.node_hex, parts.size() > 3 ? parts[3].to_string() : "?", auth_denied.load());
        }
      }
      const std::string request_id = parts.size() > 1 ? parts[1].to_string() : std::string();
      zap->send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
      zap->send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      zap->send(allow ? zmq::str_buffer("200") : zmq::str_buffer("400"), zmq::send_flags::sndmore);
      zap->send(allow ? zmq::str_buffer("OK") : zmq::str_buffer("not this cluster's client key"),
                zmq::send_flags::sndmore);
      // The user id names the connection: every message it carries has it as "User-Id", the
      // identity fair_share counts by. Clients share one access key, so the key cannot tell
      // them apart; a connection can (and connections per address are bounded).
      const std::string user =
          fmt::format("{}#{}", parts.size() > 3 ? parts[3].to_string() : "?", ++connections_seen);
      zap->send(zmq::buffer(user), zmq::send_flags::sndmore);
      zap->send(zmq::str_buffer(""), zmq::send_flags::none);  // metadata
    }
  }
  // Numbers the request connections' user ids (written by the io thread; status reads it).
  std::atomic<std::uint64_t> connections_seen{0};
  clock_type::time_point last_auth_log{};

  void on_request_frames() {
    for (int n = 0; n < 256; ++n) {  // bounded batch: the forward path is served in between
      std::vector<zmq::message_t> parts;
      zmq::message_t m;
      if (!sub.recv(m, zmq::recv_flags::dontwait)) return;
      parts.push_back(std::move(m));
      while (parts.back().more() && parts.size() < 4) {
        zmq::message_t more;
        (void)sub.recv(more, zmq::recv_flags::none);
        parts.push_back(std::move(more));
      }
      // Discard the rest of an over-long message.
      while (parts.back().more()) {
        zmq::message_t rest;
        (void)sub.recv(rest, zmq::recv_flags::none);
        if (!rest.more()) break;
      }
      if (parts.size() != 2 || parts[0].to_string_view() != request_topic) {
        note_malformed("expected 2 frames [\"req\"][msgpack request]");
        continue;
      }
      auto r = decode_request(parts[1].to_string_view());
      if (!r) {
        note_malformed(r.error().message);
        continue;
      }
      // Set by ZAP for the connection (see answer_zap): the client's identity, not its word.
      const char* user = zmq_msg_gets(parts[1].handle(), "User-Id");
      r->client = user != nullptr ? user : "";
      // Only a request whose answer someone subscribed to reaches the engine: serving one nobody
      // reads would only hold a slot (a flood of them starved every client who reads). Its
      // subscription may still be on its way (a client subscribes, then publishes, over two
      // connections): held here briefly rather than dropped to wait for a re-publication.
      if (!r->cancel && !topic_subscribers.contains(r->id)) {
        if (awaiting_subscriber.size() >= kMaxAwaitingSubscriber) {
          awaiting_subscriber.pop_front();
          ++unread_requests;
        }
        awaiting_subscriber.push_back({clock_type::now() + kAwaitSubscriber, std::move(*r)});
        continue;
      }
      {
        std::lock_guard lock(mu);
        to_inbox_locked(std::move(*r));
      }
      cv.notify_all();
    }
  }

  /// Queues a request for the engine thread (under mu), or drops and counts it at the bound: the
  /// client re-publishes, so this is a loss, never a wrong answer.
  void to_inbox_locked(request&& r) {
    if (inbox.size() >= opt.max_inbox) {
      ++dropped_inbox;
      return;
    }
    inbox.push_back(std::move(r));
  }

  /// Requests whose subscription did not come within kAwaitSubscriber: nobody reads them.
  void expire_awaiting() {
    const auto now = clock_type::now();
    while (!awaiting_subscriber.empty() && awaiting_subscriber.front().until <= now) {
      awaiting_subscriber.pop_front();
      ++unread_requests;
    }
  }

  void note_malformed(const std::string& why) {
    const auto n = ++malformed;
    // Logged for the first few and then every 1000th: a flood must not flood the log too.
    if (n <= 10 || n % 1000 == 0)
      spdlog::warn("serving {}: malformed client message #{} dropped: {}", opt.node_hex, n, why);
  }

  void forward_responses() {
    for (int n = 0; n < 1024; ++n) {
      zmq::message_t topic, body;
      if (!pull.recv(topic, zmq::recv_flags::dontwait)) return;
      (void)pull.recv(body, zmq::recv_flags::none);
      (void)xpub.send(topic, zmq::send_flags::sndmore);
      (void)xpub.send(body, zmq::send_flags::none);
    }
  }

  /// The response port's options (at start, and when it is reset).
  void configure_response_port() {
    if (opt.client_auth) {
      xpub.set(zmq::sockopt::curve_server, 1);
      xpub.set(zmq::sockopt::curve_secretkey,
               transport::control::z85_key(opt.client_auth->client_endpoint.secret_key));
      xpub.set(zmq::sockopt::zap_domain, "tessera-clients");
    }
    xpub.set(zmq::sockopt::linger, 200);
    xpub.set(zmq::sockopt::sndhwm, 100000);
    // libzmq moves subscriptions from a connection into its trie as we read the socket; a small
    // inbound bound makes it take them a batch at a time, so the budget check below sees them
    // before libzmq holds much more than the budget.
    xpub.set(zmq::sockopt::rcvhwm, 256);
    // Every subscription reaches us (not only a topic's first): each new client asking for the
    // peer list gets it at once.
    xpub.set(zmq::sockopt::xpub_verbose, 1);
    // Manual: we decide which subscriptions take effect (drain_subscriptions()).
    xpub.set(zmq::sockopt::xpub_manual, 1);
    // What a client sends to the response port is subscriptions: one byte and a topic of at most
    // max_id_bytes + 1. Anything longer closes the connection before it is buffered (without the
    // bound one frame of N bytes cost the peer ~2N of memory, before any authentication).
    // Without CURVE nothing longer than a subscription needs to pass (the NULL handshake's
    // READY is ~40 bytes): 128 keeps a refused topic's cost to the trie small as well.
    xpub.set(zmq::sockopt::maxmsgsize,
             static_cast<std::int64_t>(opt.client_auth ? kMaxSubscriptionBytes : 128));
  }

  /// The subscriptions libzmq holds exceeded their budget: close the response port and bind it
  /// again, which drops every connection and with it every subscription libzmq kept (refused
  /// ones too: there is no way to drop one connection's). Clients reconnect by themselves and
  /// send their subscriptions again (ZeroMQ does both); a stream's tokens published meanwhile
  /// are a gap its client resumes over. The flooder's subscriptions come back only to be
  /// dropped again: the peer's memory stays bounded.
  void reset_response_port() {
    ++response_port_resets;
    spdlog::warn(
        "serving {}: the response port held {} bytes of subscriptions (budget {}): reset, every "
        "client reconnects (reset #{})",
        opt.node_hex, subscription_bytes, kMaxSubscriptionTrieBytes, response_port_resets.load());
    const auto now = clock_type::now();
    {
      std::lock_guard lock(mu);
      for (const auto& [id, n] : topic_subscribers)
        unsubscribed_since.try_emplace(id, now);
    }
    topic_subscribers.clear();
    subscription_bytes = 0;
    guard->forget(1);
    xpub.close();
    xpub = zmq::socket_t(zctx, zmq::socket_type::xpub);
    configure_response_port();
    guard->watch(1, xpub);
    // The old listener closes asynchronously (libzmq's reaper): the port frees within moments.
    const std::string ep = fmt::format("tcp://{}:{}", client_address(), resp_port);
    for (int tries = 0;; ++tries) {
      try {
        xpub.bind(ep);
        break;
      } catch (const zmq::error_t& e) {
        if (e.num() != EADDRINUSE || tries >= 250) {
          spdlog::error("serving {}: cannot bind the response port {} again: {}", opt.node_hex, ep,
                        e.what());
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    ::malloc_trim(0);  // give the dropped tries' pages back
  }

  /// Reads the subscription messages; true when someone subscribed to the peer list (it gets
  /// the list at once instead of within 2 s).
  ///
  /// The XPUB is in manual mode: a subscription reaches clients only when we honour it here,
  /// right after reading it (libzmq applies it to the connection it came from). We honour the
  /// peer list and exact response topics `<id>:` only, so nobody can subscribe to a prefix (""
  /// would be every stream on the port) and read other clients' request ids and tokens: a
  /// request's id is the capability to read, cancel and resume it (docs/PROTOCOL.md).
  bool drain_subscriptions() {
    bool wants_peers = false;
    for (int n = 0; n < 1024; ++n) {
      zmq::message_t m;
      if (!xpub.recv(m, zmq::recv_flags::dontwait)) break;
      const auto v = m.to_string_view();
      if (v.empty() || (v[0] != '\x00' && v[0] != '\x01')) continue;
      const bool subscribe = v[0] == '\x01';
      const auto topic = v.substr(1);
      // What libzmq keeps of it: every subscription, honoured or not, until an unsubscription
      // or the connection's end (which sends us one per topic).
      if (subscribe)
        subscription_bytes += topic.size() + 1;
      else
        subscription_bytes -= std::min(subscription_bytes, topic.size() + 1);
      if (topic == peers_topic) {
        if (subscribe)
          xpub.set(zmq::sockopt::subscribe, topic);
        else
          xpub.set(zmq::sockopt::unsubscribe, topic);
        wants_peers = wants_peers || subscribe;
        continue;
      }
      const bool response_topic =
          topic.size() >= 2 && topic.back() == ':' && valid_id(topic.substr(0, topic.size() - 1));
      const std::string id(response_topic ? topic.substr(0, topic.size() - 1) : "");
      if (subscribe) {
        if (!response_topic ||
            (topic_subscribers.size() >= kMaxSubscribedTopics && !topic_subscribers.contains(id))) {
          ++subscriptions_refused;
          continue;
        }
        xpub.set(zmq::sockopt::subscribe, topic);
        if (topic_subscribers[id]++ == 0) {
          std::lock_guard lock(mu);
          unsubscribed_since.erase(id);
          // Requests that arrived before their subscription go ahead now.
          for (auto it = awaiting_subscriber.begin(); it != awaiting_subscriber.end();) {
            if (it->req.id != id) {
              ++it;
              continue;
            }
            to_inbox_locked(std::move(it->req));
            it = awaiting_subscriber.erase(it);
            cv.notify_all();
          }
        }
        continue;
      }
      // An unsubscription: the client's own, or libzmq's for each topic of a connection that
      // closed (then no connection is current and the call below changes nothing).
      auto it = response_topic ? topic_subscribers.find(id) : topic_subscribers.end();
      if (it == topic_subscribers.end()) continue;  // one we refused
      xpub.set(zmq::sockopt::unsubscribe, topic);
      if (--it->second == 0) {
        topic_subscribers.erase(it);
        std::lock_guard lock(mu);
        unsubscribed_since[id] = clock_type::now();
      }
    }
    if (subscription_bytes > kMaxSubscriptionTrieBytes) reset_response_port();
    return wants_peers;
  }

  void publish_peers() {
    response r;
    r.kind = "peers";
    r.node = opt.node_hex;
    {
      std::lock_guard lock(mu);
      r.peers = client_endpoints;
      r.nodes = live_nodes;
    }
    if (r.nodes.size() > max_peers) r.nodes.resize(max_peers);
    if (r.peers.size() > max_peers) r.peers.resize(max_peers);
    const std::string body = encode(r);
    (void)xpub.send(zmq::buffer(peers_topic), zmq::send_flags::sndmore);
    (void)xpub.send(zmq::buffer(body), zmq::send_flags::none);
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
    std::vector<std::string> cut;
    {
      std::lock_guard lock(mu);
      for (auto it = unsubscribed_since.begin(); it != unsubscribed_since.end();) {
        if (now - it->second < kUnreadStreamCut) {
          ++it;
          continue;
        }
        if (find_session(it->first) != nullptr) cut.push_back(it->first);
        it = unsubscribed_since.erase(it);
      }
    }
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
    std::vector<std::string> fetching;
    for (const auto& [name, f] : fetches)
      if (std::find(model_names.begin(), model_names.end(), name) == model_names.end())
        fetching.push_back(name);
    auto d = decide(q, p.get(), members, opt.self, model_names, fetching);
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
        auto it = hosts.find(group_key(q.model, g));
        // Still forming (or the plan just arrived): stay silent, the client re-publishes.
        if (it == hosts.end() || it->second->current() == group_host::state::forming) return;
        if (it->second->current() == group_host::state::failed) {
          // A group that lost a peer: the leader re-plans once membership notices; until then
          // stay silent (the client re-publishes). So does one that will form again (a peer
          // was late). A group that never formed and never will: an error.
          if (it->second->was_ready() || it->second->may_form_later()) return;
          ++rejected;
          send_error(q, error_code::no_capacity,
                     fmt::format("model '{}': its group of {} peers cannot form: {}", q.model,
                                 g.ranks.size(), it->second->failure()));
          return;
        }
        host = it->second.get();
      }
    }
    auto s = make_session(std::move(q));
    if (!s) return;  // answered with an error
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

  std::unique_ptr<session> make_session(request q) {
    loaded* lm = nullptr;
    for (auto& m : models)
      if (m->info.name == q.model) lm = m.get();
    TESSERA_ASSERT(lm != nullptr, "intake accepted model '{}' that is not loaded", q.model);
    auto s = std::make_unique<session>();
    s->model = lm;
    const auto& tok = *lm->tok;
    if (!q.messages.empty()) {
      std::vector<inf::tokenizer::chat_message> msgs;
      for (const auto& m : q.messages)
        msgs.push_back({m.role, m.content, m.tool_calls, m.tool_call_id, m.name});
      auto p = inf::tokenizer::apply_chat_template(lm->chat, msgs, true, q.tools);
      if (!p) {
        send_error(q, error_code::invalid_request, p.error().message);
        return nullptr;
      }
      if (!q.tool_choice.empty()) {
        // The call's opening marker ends the prompt; the answer is the call's JSON.
        auto call = inf::tokenizer::force_tool_call(q.tools, q.tool_name, lm->chat.calls);
        if (!call) {
          send_error(q, error_code::invalid_request, call.error().message);
          return nullptr;
        }
        p->text += call->opening;
        s->schema = std::make_unique<const inf::tokenizer::json_schema>(std::move(call->schema));
        s->json.emplace(*s->schema);
      }
      s->prompt = tok.encode(p->text, {p->add_bos, true});
    } else {
      s->prompt = tok.encode(q.prompt, {true, false});
    }
    const auto n_vocab = static_cast<std::int32_t>(lm->hp.n_vocab);
    for (auto t : q.resume)
      if (t >= n_vocab) {
        send_error(q, error_code::invalid_request,
                   fmt::format("field 'resume': token id {} is outside model '{}' (vocabulary {})",
                               t, q.model, n_vocab));
        return nullptr;
      }
    const std::int64_t cap = std::min<std::int64_t>(lm->hp.n_ctx_train, opt.max_context);
    if (static_cast<std::int64_t>(s->prompt.size() + q.resume.size()) >= cap) {
      send_error(q, error_code::context_length_exceeded,
                 fmt::format("the prompt has {} tokens (+{} resumed); model '{}' holds {} here",
                             s->prompt.size(), q.resume.size(), q.model, cap));
      return nullptr;
    }
    if (q.format == "json_object") {
      s->json.emplace();
    } else if (q.format == "json_schema") {
      auto compiled = inf::tokenizer::json_schema::compile(q.schema);
      if (!compiled) {
        send_error(q, error_code::invalid_request,
                   fmt::format("field 'schema': {}", compiled.error().message));
        return nullptr;
      }
      s->schema = std::make_unique<const inf::tokenizer::json_schema>(std::move(*compiled));
      s->json.emplace(*s->schema);
    }
    if (s->json)
      for (auto t : q.resume)
        if (!s->json->feed(tok.token_bytes(t))) {
          send_error(q, error_code::invalid_request,
                     fmt::format("field 'resume': the tokens are not the beginning of a valid "
                                 "answer (format {})",
                                 q.format.empty() ? "of a forced tool call" : q.format));
          return nullptr;
        }
    s->history = s->prompt;
    s->history.insert(s->history.end(), q.resume.begin(), q.resume.end());
    s->next_index = static_cast<std::uint32_t>(q.resume.size());
    mdl::sampler_options so;
    so.temperature = q.temperature;
    so.top_k = q.top_k;
    so.top_p = q.top_p;
    so.min_p = q.min_p;
    so.repeat_penalty = q.repeat_penalty;
    so.frequency_penalty = q.frequency_penalty;
    so.presence_penalty = q.presence_penalty;
    so.seed = q.seed;
    if (auto v = mdl::validate(so); !v) {
      send_error(q, error_code::invalid_request, v.error().message);
      return nullptr;
    }
    s->sampler = std::make_unique<mdl::sampler>(so);
    s->req = std::move(q);
    s->req.resume.clear();  // kept in history; the request copy need not hold it twice
    return s;
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

  /// A stream's unit of this round, evaluated in one pass with the others of its model (local
  /// streams) or of its split group.
  struct unit {
    session* s;
    std::span<const mdl::token_id> tokens;  // into s->history: unchanged until the pass ran
    bool logits;
  };

  /// Evaluates tokens for `s` on its local context or its group; the logits of the last one when
  /// asked. The tokens join `round` (evaluated by run_round) when it is given. A group
  /// that fails is marked failed and the stream ends "unavailable" (the client resumes it
  /// elsewhere once the plan moves on).
  result<void> eval(session& s, std::span<const mdl::token_id> tokens, bool want_logits,
                    std::vector<unit>* round) {
    if (s.host == nullptr) {
      if (round != nullptr && opt.max_batch_streams > 1) {
        round->push_back({&s, tokens, want_logits});
        return ok();
      }
      ++passes;
      ++pass_streams;
      return s.ctx->eval(tokens, want_logits ? mdl::logits_mode::last : mdl::logits_mode::none,
                         s.logits);
    }
    auto* ru = s.host->runner();
    if (ru == nullptr) return make_error(errc::closed, "its group failed: {}", s.host->failure());
    if (round != nullptr && opt.max_batch_streams > 1 &&
        tokens.size() <= inference::sharded::max_chunk) {
      round->push_back({&s, tokens, want_logits});
      return ok();
    }
    ++passes;
    ++pass_streams;
    auto r = ru->eval(s.seq, tokens, want_logits ? std::span<float>(s.logits) : std::span<float>{});
    if (!r) s.host->fail(r.error().describe());
    return r;
  }

  /// Evaluates the round's units: per model (local streams) or per split group (its streams), in
  /// passes of at most max_batch_streams streams and what one pass holds (a local workspace's
  /// tokens; a group command's max_chunk). A local pass that fails is retried stream by stream so
  /// that only the stream at fault ends; a group's failure fails the group and its streams (they
  /// resume elsewhere). Returns the sessions that failed (their streams got their error).
  std::vector<session*> run_round(std::vector<unit>& round) {
    std::vector<session*> failed;
    std::stable_sort(round.begin(), round.end(), [](const unit& a, const unit& b) {
      return std::pair(a.s->host, a.s->model) < std::pair(b.s->host, b.s->model);
    });
    std::vector<session*> who;
    std::vector<std::span<const mdl::token_id>> toks;
    std::vector<bool> wants;
    auto flush = [&](session& first) {
      if (who.empty()) return;
      ++passes;
      pass_streams += who.size();
      if (first.host != nullptr) {
        std::vector<inference::sharded::batch_request> reqs;
        for (std::size_t i = 0; i < who.size(); ++i)
          reqs.push_back({who[i]->seq, toks[i],
                          wants[i] ? std::span<float>(who[i]->logits) : std::span<float>{}});
        auto* ru = first.host->runner();
        auto r = ru != nullptr ? ru->eval_batch(reqs)
                               : result<void>(make_error(errc::closed, "its group failed: {}",
                                                         first.host->failure()));
        if (!r) {
          if (ru != nullptr) first.host->fail(r.error().describe());
          for (session* s : who) {
            fail_stream(*s, r.error());
            failed.push_back(s);
          }
        }
      } else {
        std::vector<mdl::batch_item> items;
        for (std::size_t i = 0; i < who.size(); ++i)
          items.push_back({who[i]->ctx.get(), toks[i],
                           wants[i] ? std::span<float>(who[i]->logits) : std::span<float>{}});
        auto r = mdl::context::eval_batch(items, *first.model->ws, pool.get());
        if (!r) {
          spdlog::warn("serving: a batched pass of model '{}' failed ({}); its {} streams run alone",
                       first.model->info.name, r.error().message, items.size());
          for (std::size_t i = 0; i < items.size(); ++i) {
            auto e = who[i]->ctx->eval(items[i].tokens,
                                       items[i].logits.empty() ? mdl::logits_mode::none
                                                               : mdl::logits_mode::last,
                                       who[i]->logits);
            if (!e) {
              fail_stream(*who[i], e.error());
              failed.push_back(who[i]);
            }
          }
        }
      }
      who.clear();
      toks.clear();
      wants.clear();
    };
    std::int64_t tokens = 0;
    for (std::size_t i = 0; i < round.size(); ++i) {
      unit& u = round[i];
      const auto n = static_cast<std::int64_t>(u.tokens.size());
      const std::int64_t room = u.s->host != nullptr
                                    ? std::int64_t{inference::sharded::max_chunk}
                                    : u.s->model->ws->max_tokens();
      if (!who.empty() && (who.size() >= opt.max_batch_streams || tokens + n > room)) {
        flush(*who.front());
        tokens = 0;
      }
      who.push_back(u.s);
      toks.push_back(u.tokens);
      wants.push_back(u.logits);
      tokens += n;
      const bool last_of_key = i + 1 == round.size() || round[i + 1].s->host != u.s->host ||
                               round[i + 1].s->model != u.s->model;
      if (last_of_key) {
        flush(*who.front());
        tokens = 0;
      }
    }
    round.clear();
    return failed;
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
  bool step(session& s, std::vector<unit>& round) {
    // The prompt plus the tokens the client already has (a resumed stream re-prefills them).
    const std::size_t feed_size = s.history.size();
    if (s.fed < feed_size && s.ctx && share_prefix(s, feed_size)) return true;  // waits a round
    if (s.fed < feed_size) {
      const std::size_t n = std::min<std::size_t>(opt.prefill_chunk, feed_size - s.fed);
      const bool last = s.fed + n == feed_size;
      auto r = eval(s, std::span(s.history).subspan(s.fed, n), last, &round);
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
    if (auto e = eval(s, std::span(s.history).last(1), true, &round); !e) {
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
    for (const auto& [key, h] : hosts) {
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
    std::vector<json> replicas;
    {
      std::lock_guard models_lock(models_mu);  // the list; each one's weights are this thread's
      for (const auto& l : models)
        if (l->m && l->m->params().is_moe())
          replicas.push_back({{"model", l->info.name},
                              {"experts", {{"first", 0}, {"load", l->m->expert_load()}}}});
    }
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
    std::vector<unit> round;
    while (true) {
      std::deque<request> batch;
      {
        std::unique_lock lock(mu);
        // Idle: no stream runs, and the queued ones (if any) wait for weights being loaded.
        if (active.empty() && std::all_of(queued.begin(), queued.end(),
                                          [](const auto& q) { return waits_for_weights(*q); }))
          cv.wait_for(lock, std::chrono::milliseconds(200), [&] {
            return stopping.load() || !inbox.empty() || !link_inbox.empty() || fetch_changed.load() ||
                   std::any_of(models.begin(), models.end(), [](const auto& m) {
                     return m->state == loaded::weights::loading && m->load_finished.load();
                   });
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
        const bool again = fetch_changed.exchange(false) | drop_unformed();
        if (p.get() != reconciled || again) {
          reconcile(p.get());
          reconciled = p.get();
          current_plan = p;  // keeps `reconciled` alive
        }
      }
      route_links();
      ping_groups();
      for (auto& q : batch)
        on_request(std::move(q));
      tend_weights();
      drop_unservable();
      preempt_for_fairness();
      start_waiting();
      // One round: every active session advances by one unit. A session quiet for keepalive_ms
      // says it is alive first, so a slow round never looks like a dead peer to its client. The
      // local streams' units then run together, a forward pass per model (continuous batching):
      // a long prompt's prefill chunk and the other streams' next tokens share one pass.
      for (auto it = active.begin(); it != active.end();) {
        keepalive(*it->second);
        if (!step(*it->second, round)) {
          release(*it->second);
          it = active.erase(it);
        } else {
          ++it;
        }
      }
      for (session* s : run_round(round)) {
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
    hosts.clear();  // rank 0 hosts tell their followers; links close
    for (auto& lm : models)
      if (lm->loader.joinable()) lm->loader.join();  // a load in progress finishes first
  }

  // ------------------------------------------------------------------ groups over several peers
  /// Makes a host for every group of the plan that splits a model this peer holds over several
  /// peers including this one, and drops the hosts the plan no longer has (their streams end
  /// "unavailable" and resume elsewhere).
  void reconcile(const placement::plan* p) {
    fetch_missing(p);
    // Replicas: the models the plan gives this peer a group of its own for get their weights.
    for (auto& lm : models) {
      lm->wanted = false;
      if (p != nullptr)
        for (const auto& mp : p->models)
          if (mp.spec.name == lm->info.name)
            for (const auto& g : mp.groups)
              if (g.ranks.size() == 1 && g.ranks[0].node == opt.self) lm->wanted = true;
      // A fetched model loads once all its bytes are here (reconcile runs again when they are).
      if (lm->wanted && lm->state == loaded::weights::none &&
          (lm->fetch == nullptr || lm->fetch->ready_for(mdl::shard_spec::full())))
        start_load(*lm);
    }
    std::map<member_id, peer_facts> facts;
    {
      std::lock_guard lock(mu);
      facts = peers;
    }
    std::set<std::string> wanted;
    if (p != nullptr)
      for (const auto& mp : p->models) {
        const auto local = std::find_if(models.begin(), models.end(), [&](const auto& m) {
          return m->info.name == mp.spec.name;
        });
        if (local == models.end()) continue;
        for (const auto& g : mp.groups) {
          if (g.ranks.size() < 2) continue;
          std::uint32_t me = 0;
          while (me < g.ranks.size() && g.ranks[me].node != opt.self)
            ++me;
          if (me == g.ranks.size()) continue;
          const auto key = group_key(mp.spec.name, g);
          wanted.insert(key);
          if (hosts.contains(key)) continue;
          if ((*local)->fetch != nullptr) {  // its slice's bytes first
            auto shard = shard_of(g, me);
            if (!shard || !(*local)->fetch->ready_for(*shard)) continue;
          }
          std::map<member_id, transport::bulk::local_capabilities> caps;
          std::map<member_id, std::string> hex;
          for (const auto& [id, f] : facts) {
            caps[id] = f.bulk_caps;
            hex[id] = f.hex;
          }
          auto send = opt.send_group_link;
          group_host::sender sender = [send, hex](member_id to, const group_link_message& m) {
            auto it = hex.find(to);
            if (!send || it == hex.end()) return;
            msgpack::sbuffer buf;
            msgpack::pack(buf, m);
            send(it->second, std::string(buf.data(), buf.size()));
          };
          spdlog::info("serving {}: forming group {} as rank {} of {}", opt.node_hex, key, me,
                       g.ranks.size());
          group_host::link_wrapper wrap;
          if (opt.faults) {
            wrap = [faults = opt.faults, self = opt.node_hex, hex](
                       std::unique_ptr<transport::bulk::link> l,
                       member_id peer) -> std::unique_ptr<transport::bulk::link> {
              auto it = hex.find(peer);
              if (it == hex.end()) return l;
              // A cut tensor link loses writes (vanish), as a cable would: the collectives'
              // timeout fails the group and the plan moves on.
              return std::make_unique<transport::faults::faulty_link>(std::move(l), faults, self,
                                                                      it->second);
            };
          }
          unformed_since.erase(key);
          auto h = std::make_unique<group_host>(
              key, (*local)->info.path, g, me, opt.link_addresses(), std::move(caps), opt.bulk_caps,
              std::move(sender), opt.threads, std::move(wrap), &registry, opt.compute_nice, gate);
          if (auto e = early_links.find(key); e != early_links.end()) {
            for (const auto& m : e->second)
              h->on_link_message(m);
            early_links.erase(e);
          }
          hosts[key] = std::move(h);
        }
      }
    for (auto it = hosts.begin(); it != hosts.end();) {
      if (wanted.contains(it->first)) {
        ++it;
        continue;
      }
      it = erase_host(it, "the plan dropped its group");
    }
  }

  /// Drops a group's host; its streams (running or queued) end with `unavailable`, and their
  /// clients resume them on the group that replaces it.
  std::map<std::string, std::unique_ptr<group_host>>::iterator erase_host(
      std::map<std::string, std::unique_ptr<group_host>>::iterator it, std::string_view why) {
    for (auto a = active.begin(); a != active.end();) {
      if (a->second->host == it->second.get()) {
        release(*a->second);
        send_error(a->second->req, error_code::unavailable,
                   fmt::format("model '{}': {}; resume", a->second->req.model, why));
        a = active.erase(a);
      } else {
        ++a;
      }
    }
    std::erase_if(queued, [&](const auto& q) {
      if (q->host != it->second.get()) return false;
      send_error(q->req, error_code::unavailable, fmt::format("{}; resume", why));
      return true;
    });
    used_seqs.erase(it->first);
    last_ping.erase(it->first);
    return hosts.erase(it);
  }

  // ------------------------------------------------------------------ models fetched from peers
  /// For every model the plan gives this peer a part of and that it has no file of (fetch_models):
  /// asks the model's fetch for those parts, from the live holders of the plan's content, and
  /// adopts the model (header, tokenizer) once they are here. Reconcile runs again whenever a
  /// fetch finishes or fails (fetch_changed).
  void fetch_missing(const placement::plan* p) {
    if (p == nullptr || !opt.fetch_models) return;
    std::map<member_id, peer_facts> facts;
    {
      std::lock_guard lock(mu);
      facts = peers;
    }
    for (const auto& mp : p->models) {
      const std::string& name = mp.spec.name;
      const auto local = std::find_if(models.begin(), models.end(),
                                      [&](const auto& m) { return m->info.name == name; });
      if (local != models.end() && (*local)->fetch == nullptr) continue;  // a file of our own
      if (mp.spec.content.empty()) continue;
      std::vector<mdl::shard_spec> shards;
      for (const auto& g : mp.groups)
        for (std::uint32_t r = 0; r < g.ranks.size(); ++r)
          if (g.ranks[r].node == opt.self)
            if (auto s = shard_of(g, r)) shards.push_back(*s);
      if (shards.empty()) continue;  // bytes fetched before stay on disk
      auto it = fetches.find(name);
      if (it != fetches.end() && it->second->root() != mp.spec.content) {
        if (local != models.end()) {
          spdlog::warn("serving {}: the plan names other content for model '{}' than the one "
                       "fetched here; restart this peer to fetch it",
                       opt.node_hex, name);
          continue;
        }
        std::lock_guard lock(models_mu);
        fetches.erase(it);
        it = fetches.end();
      }
      if (it == fetches.end()) {
        model_fetch::options o;
        o.model = name;
        o.root = mp.spec.content;
        o.dir = opt.fetch_dir;
        o.addresses = opt.link_addresses();
        o.send = [send = opt.send_share](const std::string& to, const share_setup& m) {
          if (!send) return;
          msgpack::sbuffer buf;
          msgpack::pack(buf, m);
          send(to, std::string(buf.data(), buf.size()));
        };
        o.fetch_id = next_fetch_id++;
        o.on_change = [this] {
          fetch_changed = true;
          cv.notify_all();
        };
        o.on_progress = [this, name](std::uint64_t done, std::uint64_t total) {
          if (opt.on_fetch_progress) opt.on_fetch_progress(name, done, total);
        };
        spdlog::info("serving {}: model '{}' (content {}) is not here: fetching its parts",
                     opt.node_hex, name, mp.spec.content.substr(0, 16));
        std::lock_guard lock(models_mu);
        it = fetches.emplace(name, std::make_unique<model_fetch>(std::move(o))).first;
      }
      model_fetch* f = it->second.get();
      std::vector<share_source> sources;
      const std::string held = name + "@" + mp.spec.content;
      for (const auto& [id, pf] : facts)
        if (std::find(pf.holds.begin(), pf.holds.end(), held) != pf.holds.end())
          sources.push_back({pf.hex, transport::bulk::choose_backend(opt.bulk_caps, pf.bulk_caps)});
      // The fastest kind of link first (rdma, shm, tcp); member order among equals.
      std::stable_sort(sources.begin(), sources.end(), [](const auto& a, const auto& b) {
        return static_cast<int>(a.backend) > static_cast<int>(b.backend);
      });
      f->want(std::move(sources), shards);
      if (auto t = f->complete_table(); t && !served_on.contains(name)) {
        server->add(name, f->path(), std::move(*t));  // every byte here: serve it on
        served_on.insert(name);
      }
      if (local != models.end()) continue;
      if (!std::all_of(shards.begin(), shards.end(), [&](const auto& s) { return f->ready_for(s); }))
        continue;
      auto opened = open_model(f->path(), name);
      if (!opened) {
        spdlog::error("serving {}: model '{}' fetched but does not open: {}", opt.node_hex, name,
                      opened.error().describe());
        continue;
      }
      auto l = std::move(*opened);
      l->info.spec = mp.spec;  // the content it was verified against
      l->fetch = f;
      spdlog::info("serving {}: model '{}' fetched ({} of {} here)", opt.node_hex, name,
                   inf::gguf::human_bytes(f->snapshot().bytes_total),
                   inf::gguf::human_bytes(l->info.file_bytes));
      model_names.push_back(name);
      std::lock_guard lock(models_mu);
      models.push_back(std::move(l));
    }
  }

  /// Drops, after kReformAfter, the hosts of groups that failed to form because a peer was late
  /// (may_form_later) and of groups that failed after they formed (a rank died or a link broke),
  /// so that reconcile forms them again if the plan still names them. The latter matters when
  /// the plan that replaces the failure names the same group (the same members, the same split):
  /// after two of three peers restarted, the survivor's election plan gave the group the key of
  /// the one that failed, and a survivor that kept its failed host never joined it (issue 33,
  /// chaos --moe --hosts kill-two: every request timed out). True if it dropped one.
  bool drop_unformed() {
    const auto now = clock_type::now();
    bool dropped = false;
    for (auto it = hosts.begin(); it != hosts.end();) {
      const bool lost =
          it->second->current() == group_host::state::failed && it->second->was_ready();
      if (!lost && !it->second->may_form_later()) {
        ++it;
        continue;
      }
      auto [since, fresh] = unformed_since.emplace(it->first, now);
      if (now - since->second < kReformAfter) {
        ++it;
        continue;
      }
      spdlog::info("serving {}: forming group {} again{}", opt.node_hex, it->first,
                   lost ? " (it failed after it formed)" : "");
      unformed_since.erase(since);
      it = erase_host(it, "its group failed");
      dropped = true;
    }
    std::erase_if(unformed_since, [&](const auto& u) { return !hosts.contains(u.first); });
    return dropped;
  }

  // ------------------------------------------------------------------ whole-model weights
  void start_load(loaded& lm) {
    lm.state = loaded::weights::loading;
    lm.loaded_bytes = 0;
    lm.load_finished = false;
    spdlog::info("serving {}: loading model '{}' ({} MiB of weights) for a replica here",
                 opt.node_hex, lm.info.name, lm.total_bytes.load() >> 20);
    lm.loader = std::thread([this, &lm] {
      name_this_thread("model-load");
      set_this_thread_nice(opt.compute_nice);
      mdl::load_options lo;
      lo.on_progress = [this, &lm](std::uint64_t done, std::uint64_t total) {
        lm.loaded_bytes = done;
        lm.total_bytes = total;
        if (opt.on_load_progress) opt.on_load_progress(lm.info.name, done, total);
      };
      auto m = mdl::model::load(*lm.file, lo);
      if (m) {
        lm.loaded_model = std::move(*m);
      } else {
        lm.load_error = m.error().describe();
      }
      {
        std::lock_guard lock(mu);  // the engine thread checks load_finished under mu
        lm.load_finished = true;
      }
      cv.notify_all();
    });
  }

  /// Takes finished loads in, and drops the weights of models the plan no longer gives this peer
  /// a replica of once no stream uses them.
  void tend_weights() {
    for (auto& lm : models) {
      if (lm->state == loaded::weights::loading && lm->load_finished) {
        lm->loader.join();
        if (lm->loaded_model) {
          // A pass holds one stream's prefill chunk and the others' next tokens (more prefill
          // chunks in one round take more passes: prefill is bound by compute, not by streaming
          // the weights).
          auto ws = mdl::workspace::create(
              *lm->loaded_model,
              std::min<std::int64_t>(4096, std::int64_t{opt.prefill_chunk} + opt.max_batch_streams),
              std::min<std::int64_t>(lm->hp.n_ctx_train, opt.max_context), pool->size());
          if (ws) {
            lm->m = std::move(lm->loaded_model);
            lm->ws = std::move(*ws);
            lm->state = loaded::weights::ready;
            spdlog::info("serving {}: model '{}' loaded", opt.node_hex, lm->info.name);
          } else {
            lm->loaded_model.reset();
            lm->load_error = ws.error().describe();
          }
        }
        if (lm->state != loaded::weights::ready) {
          lm->failure = lm->load_error;
          lm->state = loaded::weights::failed;
          spdlog::error("serving {}: model '{}' did not load: {}", opt.node_hex, lm->info.name,
                        lm->failure);
        }
      }
      if (lm->state == loaded::weights::ready && !lm->wanted) {
        const auto uses = [&](const session& s) { return s.model == lm.get() && s.host == nullptr; };
        bool used = std::any_of(active.begin(), active.end(),
                                [&](const auto& a) { return uses(*a.second); }) ||
                    std::any_of(queued.begin(), queued.end(), [&](const auto& q) { return uses(*q); });
        if (!used) {
          lm->ws.reset();
          lm->m.reset();
          lm->state = loaded::weights::none;
          spdlog::info("serving {}: model '{}' unloaded (the plan serves it elsewhere)",
                       opt.node_hex, lm->info.name);
        }
      }
    }
  }

  void route_links() {
    std::deque<group_link_message> batch;
    {
      std::lock_guard lock(mu);
      batch.swap(link_inbox);
    }
    for (auto& m : batch) {
      if (auto it = hosts.find(m.key); it != hosts.end()) {
        it->second->on_link_message(m);
        continue;
      }
      auto& q = early_links[m.key];
      if (early_links.size() > 16 || q.size() >= 64) continue;  // bounded; the sender re-sends
      q.push_back(std::move(m));
    }
  }

  /// Rank 0 of an idle group tells its followers it is alive (they bound their waits).
  void ping_groups() {
    const auto now = clock_type::now();
    for (auto& [key, h] : hosts) {
      auto* ru = h->runner();
      if (ru == nullptr) continue;
      auto& last = last_ping[key];
      if (now - last < std::chrono::seconds(1)) continue;
      last = now;
      if (auto r = ru->ping(); !r) h->fail(r.error().describe());
    }
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
  auto pool =
      inf::thread_pool::create(static_cast<int>(std::max(1u, p->opt.threads)),
                               {.pin = false, .nice = p->opt.compute_nice, .gate = p->gate});
  if (!pool) return pool.error();
  p->pool = std::move(*pool);
  auto send_share = p->opt.send_share;
  p->server = std::make_unique<share_server>(
      p->opt.link_addresses(), [send_share](const std::string& to, const share_setup& m) {
        if (!send_share) return;
        msgpack::sbuffer buf;
        msgpack::pack(buf, m);
        send_share(to, std::string(buf.data(), buf.size()));
      });
  for (const auto& path : p->opt.model_paths) {
    const std::string name = fs::path(path).stem().string();
    for (const auto& other : p->models)
      if (other->info.name == name)
        return make_error(errc::invalid_argument, "two models are named '{}' ({} and {})", name,
                          other->info.path, path);
    auto opened = open_model(path, name);
    if (!opened) return opened.error();
    auto l = std::move(*opened);
    // The content id: peers plan together over equal bytes only, and fetchers verify by it.
    const auto t0 = clock_type::now();
    auto table = hash_model_file(path);
    if (!table) return table.error();
    l->info.spec.content = content_root(*table);
    p->server->add(name, path, std::move(*table));
    spdlog::info(
        "serving: model '{}' from {} ({} layers, {} MiB, content {}, hashed in {} ms; weights "
        "loaded when planned here)",
        name, path, l->info.spec.n_layers, l->info.file_bytes >> 20,
        l->info.spec.content.substr(0, 16),
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count());
    p->infos.push_back(l->info);
    p->model_names.push_back(l->info.name);
    p->models.push_back(std::move(l));
  }
  try {
    auto bind = [&](zmq::socket_t& s, std::uint16_t port) -> std::uint16_t {
      s.set(zmq::sockopt::linger, 200);
      s.bind(
          fmt::format("tcp://{}:{}", p->client_address(), port == 0 ? "*" : std::to_string(port)));
      const std::string ep = s.get(zmq::sockopt::last_endpoint);
      return static_cast<std::uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
    };
    // The ZAP handler must be bound before the endpoints accept their first connection. It
    // names each request connection (the identity of fair shares) and, under --client-auth,
    // admits only the cluster's client key.
    p->zap.emplace(p->zctx, zmq::socket_type::rep);
    p->zap->set(zmq::sockopt::linger, 0);
    p->zap->bind("inproc://zeromq.zap.01");
    p->guard = std::make_unique<connection_guard>(
        p->zctx,
        connection_limits{p->opt.client_connections_per_address, p->opt.client_connections_total},
        p->opt.node_hex);
    p->guard->watch(0, p->sub);
    p->sub.set(zmq::sockopt::zap_domain, "tessera-clients");
    if (p->opt.client_auth) {
      const std::string secret =
          transport::control::z85_key(p->opt.client_auth->client_endpoint.secret_key);
      p->sub.set(zmq::sockopt::curve_server, 1);
      p->sub.set(zmq::sockopt::curve_secretkey, secret);
    }
    p->sub.set(zmq::sockopt::rcvhwm, 10000);
    p->sub.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_message_bytes + 1024));
    p->sub.set(zmq::sockopt::subscribe, request_topic);
    p->req_port = bind(p->sub, p->opt.request_port);
    p->configure_response_port();
    p->guard->watch(1, p->xpub);
    p->resp_port = bind(p->xpub, p->opt.response_port);
    const std::string inproc = fmt::format("inproc://serving-{}", static_cast<void*>(p.get()));
    p->pull.bind(inproc);
    p->push.set(zmq::sockopt::sndhwm, 100000);
    p->push.connect(inproc);
  } catch (const zmq::error_t& e) {
    return make_error(errc::io,
                      "serving: cannot bind the client endpoints on {} (ports {}, {}): {}",
                      p->client_address(), p->opt.request_port, p->opt.response_port, e.what());
  }
  auto* raw = p.get();
  p->io_thread = std::thread([raw] { raw->io_loop(); });
  p->engine_thread = std::thread([raw] { raw->engine_loop(); });
  return std::unique_ptr<engine>(new engine(std::move(p)));
}

void engine::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  impl_->cv.notify_all();
  if (impl_->engine_thread.joinable()) impl_->engine_thread.join();
  // Fetchers see their links go down; fetches in progress stop (their bytes stay on disk).
  impl_->server->stop();
  {
    std::lock_guard lock(impl_->models_mu);
    for (auto& [name, f] : impl_->fetches)
      f->stop();
  }
  // Only now the io thread stops: its last pass forwards what the engine queued last (the
  // shutdown errors), which it could miss if it stopped together with the engine.
  impl_->io_stopping = true;
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
  impl_->sub.close();
  impl_->xpub.close();
  impl_->pull.close();
  impl_->push.close();
  if (impl_->zap) impl_->zap->close();
  impl_->guard.reset();  // its monitor sockets, before the context ends
}

const std::vector<local_model>& engine::models() const {
  return impl_->infos;
}
std::vector<placement::model_spec> engine::held_specs() const {
  std::vector<placement::model_spec> out;
  std::lock_guard lock(impl_->models_mu);
  for (const auto& l : impl_->models)
    if (l->fetch == nullptr || l->fetch->complete()) out.push_back(l->info.spec);
  return out;
}

std::uint16_t engine::request_port() const {
  return impl_->req_port;
}
std::uint16_t engine::response_port() const {
  return impl_->resp_port;
}

void engine::set_plan(std::shared_ptr<const placement::plan> plan, std::vector<member_id> live,
                      std::vector<std::string> client_endpoints,
                      std::map<member_id, peer_facts> peers) {
  // First, and on this thread: a rank waiting on a member that left, or in a group the plan
  // dropped, waits no longer (the engine thread may be that rank, inside a forward pass).
  impl_->registry.abort_without(live);
  if (plan != nullptr) {
    std::set<std::string> planned;
    for (const auto& mp : plan->models)
      for (const auto& g : mp.groups)
        if (g.ranks.size() > 1) planned.insert(group_key(mp.spec.name, g));
    impl_->registry.abort_unplanned(planned, fmt::format("{}.{}", plan->epoch.term,
                                                         plan->epoch.version));
  }
  {
    std::lock_guard lock(impl_->mu);
    std::vector<std::string> nodes = peer_list_nodes(
        plan != nullptr, impl_->opt.self, impl_->opt.node_hex, live, [&](member_id id) {
          auto it = peers.find(id);
          return it != peers.end() ? it->second.hex : std::string();
        });
    if (nodes != impl_->live_nodes) {
      impl_->live_nodes = std::move(nodes);
      impl_->peers_changed = true;
    }
    impl_->plan = std::move(plan);
    impl_->live = std::move(live);
    impl_->client_endpoints = std::move(client_endpoints);
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
  if (m->kind == share_setup::offer) {
    impl_->server->on_offer(from_hex, *m);
    return;
  }
  std::lock_guard lock(impl_->models_mu);
  for (const auto& [name, f] : impl_->fetches)
    if (f->fetch_id() == m->fetch_id) f->on_answer(from_hex, *m);
}

json engine::status() const {
  json j;
  json ms = json::array();
  json fs_ = json::array();
  {
    std::lock_guard lock(impl_->models_mu);
    for (const auto& l : impl_->models) {
      const auto& m = l->info;
      ms.push_back({{"name", m.name},
                    {"path", m.path},
                    {"bytes", m.file_bytes},
                    {"layers", m.spec.n_layers},
                    {"heads", m.spec.n_heads},
                    {"content", m.spec.content},
                    {"fetched", l->fetch != nullptr},
                    {"weights", weights_name(l->state.load())},
                    {"weights_loaded_bytes", l->loaded_bytes.load()},
                    {"weights_bytes", l->total_bytes.load()}});
    }
    for (const auto& [name, f] : impl_->fetches) {
      const auto s = f->snapshot();
      fs_.push_back({{"model", name},
                     {"state", to_string(s.st)},
                     {"from", s.from},
                     {"bytes_done", s.bytes_done},
                     {"bytes_total", s.bytes_total},
                     {"fetched_bytes", s.fetched_bytes},
                     {"seconds", s.seconds},
                     {"error", s.error}});
    }
  }
  j["models"] = ms;
  j["fetches"] = fs_;
  {
    const auto c = impl_->server->counters();
    j["share"] = {{"sessions", c.sessions},
                  {"running", c.running},
                  {"refused", c.refused},
                  {"chunks", c.chunks},
                  {"bytes", c.bytes}};
  }
  j["request_port"] = impl_->req_port;
  j["response_port"] = impl_->resp_port;
  j["client_auth"] = {{"required", impl_->opt.client_auth.has_value()},
                      {"admitted", impl_->auth_allowed.load()},
                      {"refused", impl_->auth_denied.load()}};
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
  j["malformed"] = impl_->malformed.load();
  j["unread"] = {{"subscriptions_refused", impl_->subscriptions_refused.load()},
                 {"response_port_resets", impl_->response_port_resets.load()},
                 {"requests_ignored", impl_->unread_requests.load()},
                 {"streams_cut", impl_->unread_streams_cut.load()}};
  // fair_share.hpp: clients are request connections (numbered as they connect).
  j["connections"] = {{"open", impl_->connections_open.load()},
                      {"refused", impl_->connections_refused.load()},
                      {"per_address_bound", impl_->opt.client_connections_per_address},
                      {"bound", impl_->opt.client_connections_total}};
  j["fair_share"] = {{"connections", impl_->connections_seen.load()},
                     {"made_way", impl_->made_way.load()},
                     {"preempted", impl_->preempted.load()}};
  j["shared_prefix_tokens"] = impl_->shared_prefix_tokens.load();
  j["passes"] = impl_->passes.load();
  j["pass_streams"] = impl_->pass_streams.load();
  j["stream_stats"] = impl_->stats.to_json();
  return j;
}

}  // namespace tessera::mesh::serving
