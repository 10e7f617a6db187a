#include "mesh/http/gateway.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <sodium.h>
#include <spdlog/spdlog.h>

#include "actors/base/thread.hpp"
#include "mesh/http/elastic_pool.hpp"
#include "mesh/http/metrics.hpp"
#include "mesh/http/ollama.hpp"
#include "mesh/http/openai.hpp"
#include "mesh/http/tools.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::http {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Equal-time comparison: how long a wrong token takes to refuse says nothing about the right one.
bool same_secret(std::string_view a, std::string_view b) {
  // libsodium's constant-time comparison (the compiler cannot turn it into an early exit); the
  // length is not secret.
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

/// The routes counted by name; anything else is "other" (a scanner must not grow the label set).
std::string route_of(const std::string& path) {
  for (const char* r : {"/", "/chat", "/health", "/status", "/cluster", "/metrics", "/v1/models",
                        "/v1/completions", "/v1/chat/completions", "/api/generate", "/api/chat",
                        "/api/tags", "/api/show", "/api/version"})
    if (path == r) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

/// The methods a known path takes (for 405 and its Allow header); empty for an unknown path.
std::string methods_of(const std::string& path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/api/generate" ||
      path == "/api/chat" || path == "/api/show")
    return "POST";
  if (route_of(path) != "other") return "GET";
  return "";
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const api_error& e) {
  send_json(res, e.status, e.to_json());
}

/// An error in the shape of the API the request came in by: OpenAI's object, or Ollama's
/// {"error": "..."}.
void send_error(httplib::Response& res, const api_error& e, api_dialect d) {
  if (d == api_dialect::openai) return send_error(res, e);
  send_json(res, e.status, ollama_error(e));
}

/// One line of an NDJSON stream (Ollama's).
std::string ndjson(const json& j) {
  return dump(j) + "\n";
}

/// The stream of one API request, between the thread that runs its serving client and the HTTP
/// thread that writes it out. Token bytes are appended as they come; the writer takes what is
/// complete UTF-8.
struct relay {
  std::mutex mu;
  std::condition_variable cv;
  /// One token not written yet: its bytes, and its log-probabilities when the request asked.
  struct piece {
    std::string text;
    std::optional<serving::token_logprob> logprob;
    std::string node;  // the peer that generated it
  };
  std::deque<piece> pieces;
  std::uint32_t tokens = 0;
  std::optional<result<serving::outcome>> end;  // set once: the outcome or the error
  std::atomic<bool> cancel{false};
  std::atomic<bool> stop{false};  // a stop sequence was written up to: end the stream (success)
  std::thread worker;
  bool joined = false;

  void join() {
    cancel = true;
    if (!joined && worker.joinable()) worker.join();
    joined = true;
  }
};

/// Connections the kernel completes and holds for the accept loop (capped by net.core.somaxconn).
constexpr int kListenBacklog = 1024;

/// cpp-httplib's task queue on the elastic pool: one idle handler thread, up to `threads` while
/// connections are open, and as many accepted connections waiting for one; beyond that the accept
/// loop waits and connections stay in the kernel's backlog (elastic_pool.hpp says why).
/// `release`: the gateway is stopping (waits end).
class pool_queue final : public httplib::TaskQueue {
 public:
  pool_queue(std::size_t threads, const std::atomic<bool>* release)
      : pool_(elastic_pool_options{
            .min_threads = 1, .max_threads = threads, .max_queued = threads, .release = release}) {}
  void enqueue(std::function<void()> fn) override { pool_.enqueue(std::move(fn)); }
  void shutdown() override { pool_.shutdown(); }

 private:
  elastic_pool pool_;
};

}  // namespace

struct gateway::impl {
  gateway_options opt;
  httplib::Server svr;
  std::thread listener;
  std::uint16_t port = 0;
  int listen_fd = -1;  // cpp-httplib's listening socket, seen through its socket-options hook
  std::atomic<bool> closing{false};   // no new API requests
  std::atomic<bool> stopping{false};  // running streams end now
  std::atomic<std::uint32_t> in_flight{0};

  std::mutex mu;  // counters, rng
  gateway_counters counters;
  std::mt19937_64 rng{std::random_device{}() ^ (std::uint64_t{std::random_device{}()} << 32)};

  std::mutex cache_mu;  // cluster status cache (one refresh at a time)
  json cluster_cache;
  std::optional<clock_type::time_point> cluster_at;

  // ------------------------------------------------------------------ plumbing
  /// The Access-Control-Allow-Origin value for `req`: its Origin when allowed ("*" when any is),
  /// else empty.
  std::string allowed_origin(const httplib::Request& req) const {
    if (opt.cors_origins.empty() || !req.has_header("Origin")) return {};
    const std::string origin = req.get_header_value("Origin");
    for (const auto& o : opt.cors_origins) {
      if (o == "*") return "*";
      if (o == origin) return origin;
    }
    return {};
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty()) return true;
    const auto header = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 9110 11.1): "bearer KEY" is as good as "Bearer KEY".
    constexpr std::string_view scheme = "bearer ";
    const bool bearer =
        header.size() > scheme.size() &&
        std::equal(scheme.begin(), scheme.end(), header.begin(), [](char a, char b) {
          return a == static_cast<char>(std::tolower(static_cast<unsigned char>(b)));
        });
    if (!bearer) {
      send_error(res, error_of(error{errc::unauthorized,
                                     "this peer requires an API key: send "
                                     "'Authorization: Bearer <key>'"}));
      return false;
    }
    if (!same_secret(std::string_view(header).substr(scheme.size()), opt.api_key)) {
      send_error(res, error_of(error{errc::unauthorized, "the API key is not this cluster's"}));
      return false;
    }
    return true;
  }

  /// The request's id (its capability: from the kernel's CSPRNG) and the seed it samples with
  /// when the body names none.
  result<std::string> new_id(api_kind kind, std::uint64_t* seed) {
    {
      std::lock_guard lock(mu);
      *seed = rng();
    }
    return serving::random_request_id(kind == api_kind::chat ? "chatcmpl-" : "cmpl-");
  }

  json status_doc() const { return opt.status ? opt.status() : json(nullptr); }

  json cluster_doc() {
    std::lock_guard lock(cache_mu);
    const auto now = clock_type::now();
    if (!cluster_at || now - *cluster_at >= std::chrono::milliseconds(opt.cluster_cache_ms)) {
      cluster_cache = opt.cluster_status ? opt.cluster_status() : json::object();
      cluster_at = clock_type::now();
    }
    return cluster_cache;
  }

  serving::client_options client_options() const {
    serving::client_options co;
    co.peers = opt.peers;
    co.deadline_ms = opt.request_timeout_s * 1000;
    co.stall_ms = opt.stall_ms;
    co.access = opt.client_access;
    return co;
  }

  // ------------------------------------------------------------------ routes
  void models(httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", model_list()}});
  }

  /// GET /v1/models/{id}: the model object, or 404 model_not_found naming what is served.
  void model(const std::string& id, httplib::Response& res) {
    const json list = model_list();
    std::string names;
    for (const auto& m : list) {
      if (m["id"] == id) return send_json(res, 200, m);
      names += (names.empty() ? "" : ", ") + m["id"].get<std::string>();
    }
    send_error(res,
               error_of(make_error(errc::not_found,
                                   "the model '{}' does not exist in this cluster (served: {})", id,
                                   names.empty() ? "none yet" : names)));
  }

  /// POST /api/show (Ollama): what is known of a model, or 404 {"error"} naming those served.
  void show(httplib::Response& res, const httplib::ContentReader& reader) {
    auto body = read_body(reader, res);
    if (!body) return;
    const json b = json::parse(*body, nullptr, false);
    const json name = b.is_object() ? b.value("model", b.value("name", json(nullptr))) : json();
    api_error e;
    if (!name.is_string()) {
      e.message = "'model' must name a model (GET /api/tags lists them)";
      return send_error(res, e, api_dialect::ollama_chat);
    }
    const std::string want = ollama_model_name(name.get<std::string>());
    std::string names;
    for (const auto& m : model_list()) {
      if (m["id"] == want)
        return send_json(res, 200,
                         {{"modelfile", ""},
                          {"parameters", ""},
                          {"template", ""},
                          {"details",
                           {{"format", "gguf"},
                            {"family", ""},
                            {"parameter_size", ""},
                            {"quantization_level", ""}}},
                          {"model_info",
                           {{"tessera.groups", m.value("groups", 0)},
                            {"tessera.bytes", m.value("bytes", std::uint64_t{0})},
                            {"tessera.content", m.value("content", "")}}},
                          {"capabilities", {"completion"}}});
      names += (names.empty() ? "" : ", ") + m["id"].get<std::string>();
    }
    e.status = 404;
    e.message = fmt::format("model '{}' not found (served: {})", name.get<std::string>(),
                            names.empty() ? "none yet" : names);
    send_error(res, e, api_dialect::ollama_chat);
  }

  /// The models the cluster serves (the plan's) and those loaded here; a model that the plan
  /// cannot place still shows, with its reason, so "why is my model missing" has an answer.
  json model_list() {
    const json s = status_doc();
    json data = json::array();
    std::set<std::string> seen;
    const auto add = [&](const std::string& name, const json& extra) {
      if (!seen.insert(name).second) return;
      json m{{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "tessera"}};
      m.update(extra);
      data.push_back(m);
    };
    if (s.contains("plan") && s["plan"].is_object())
      for (const auto& m : s["plan"]["models"])
        add(m.value("name", ""),
            {{"groups", m["groups"].size()},
             {"no_capacity", m.contains("no_capacity") ? m["no_capacity"] : json(nullptr)}});
    if (s.contains("serving") && s["serving"].is_object())
      for (const auto& m : s["serving"]["models"]) {
        add(m.value("name", ""), {{"groups", 0}, {"no_capacity", "no plan yet"}});
        // What this peer knows of the file (its size and content id), for Ollama's tags.
        for (auto& d : data)
          if (d["id"] == m.value("name", "")) {
            d["bytes"] = m.value("bytes", std::uint64_t{0});
            d["content"] = m.value("content", "");
          }
      }
    return data;
  }

  /// Reads an API request's body through the route's content reader, stopping at max_body_bytes
  /// whatever the framing: cpp-httplib's own limit does not hold for chunked bodies (a 1 GiB
  /// chunked body was read whole), and it refuses form-encoded bodies above 8 KiB — what curl's
  /// `-d` sends without `-H Content-Type` — while the body is JSON whatever the header says.
  /// Nullopt: too large, answered 413 (the connection is closed, the rest never read).
  std::optional<std::string> read_body(const httplib::ContentReader& reader,
                                       httplib::Response& res) {
    std::string body;
    bool too_large = false;
    const bool complete = reader([&](const char* data, std::size_t n) {
      if (body.size() + n > opt.max_body_bytes) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (too_large || !complete) {
      api_error e;
      e.status = too_large ? 413 : 400;
      e.message = too_large ? fmt::format("the request body is above {} bytes", opt.max_body_bytes)
                            : "the request body ended early";
      send_error(res, e);
      res.set_header("Connection", "close");
      return std::nullopt;
    }
    return body;
  }

  void api(api_kind kind, httplib::Response& res, const httplib::ContentReader& reader,
           api_dialect dialect = api_dialect::openai) {
    if (closing) {
      return send_error(
          res, error_of(error{errc::closed, "this peer is leaving the mesh; ask another peer"}),
          dialect);
    }
    // The body first: a client still sending it (a slow drip) holds a handler thread, as it did
    // when cpp-httplib read bodies before the handler, but none of the in-flight API slots.
    auto body = read_body(reader, res);
    if (!body) return;
    if (in_flight.fetch_add(1) >= opt.max_in_flight) {
      in_flight.fetch_sub(1);
      api_error e = error_of(
          error{errc::overloaded, fmt::format("this peer's HTTP gateway is running {} requests "
                                              "(its bound); retry, or ask another peer",
                                              opt.max_in_flight)});
      send_error(res, e, dialect);
      return;
    }
    std::uint64_t seed = 0;
    auto id = new_id(kind, &seed);
    if (!id) {
      in_flight.fetch_sub(1);
      send_error(res, error_of(id.error()), dialect);
      return;
    }
    bool empty_prompt = false;
    auto parsed = dialect == api_dialect::openai
                      ? parse_request(kind, *body, std::move(*id), seed)
                      : parse_ollama(dialect, *body, std::move(*id), seed, &empty_prompt);
    if (auto* e = std::get_if<api_error>(&parsed)) {
      in_flight.fetch_sub(1);
      send_error(res, *e, dialect);
      return;
    }
    auto r = std::make_shared<api_request>(std::move(std::get<api_request>(parsed)));
    if (empty_prompt) {
      // Ollama's "load the model" call: answered at once, nothing generated (404 for a model
      // the cluster does not know, as a real request would get).
      in_flight.fetch_sub(1);
      const json list = model_list();
      if (std::none_of(list.begin(), list.end(),
                       [&](const json& m) { return m["id"] == r->request.model; })) {
        api_error e;
        e.status = 404;
        e.message = fmt::format("model '{}' not found", r->model_as_sent);
        return send_error(res, e, dialect);
      }
      serving::outcome none;
      json j = ollama_final(*r, none, "", "load", rfc3339_now());
      res.status = 200;
      res.set_content(r->stream ? ndjson(j) : dump(j),
                      r->stream ? "application/x-ndjson" : "application/json");
      return;
    }
    if (r->n > 1) {
      if (r->stream) {
        stream_choices(r, res);  // in_flight ends when the streams do
        return;
      }
      complete_choices(*r, res);
      in_flight.fetch_sub(1);
      return;
    }
    if (r->stream) {
      stream(r, res);  // in_flight ends when the stream does
      return;
    }
    complete(*r, res);
    in_flight.fetch_sub(1);
  }

  void complete(const api_request& r, httplib::Response& res) {
    auto out = run_choice(r);
    if (!out) return send_error(res, error_of(out.error(), r.kind), r.dialect);
    if (r.dialect == api_dialect::openai)
      send_json(res, 200, reply(r, *out, unix_now()));
    else
      send_json(res, 200,
                ollama_final(r, *out, out->text, finish_reason(out->stop), rfc3339_now()));
  }

  /// `n` > 1, not streamed: the choices run side by side (each its own stream, all routed to one
  /// peer by their affinity, which reads the shared prompt once), then one reply holds them all.
  void complete_choices(const api_request& r, httplib::Response& res) {
    std::vector<api_request> choices;
    for (std::uint32_t i = 0; i < r.n; ++i)
      choices.push_back(choice_request(r, i));
    std::vector<std::optional<result<serving::outcome>>> outs(r.n);
    std::vector<std::thread> others;
    for (std::uint32_t i = 1; i < r.n; ++i)
      others.emplace_back([&, i] {
        name_this_thread("http-choice");
        outs[i].emplace(run_choice(choices[i]));
      });
    outs[0].emplace(run_choice(choices[0]));
    for (auto& t : others)
      t.join();
    for (auto& o : outs)
      if (!*o) return send_error(res, error_of(o->error(), r.kind), r.dialect);
    const auto created = unix_now();
    json j = reply(choices[0], **outs[0], created);
    json ext = json::array();
    std::uint32_t completion = 0;
    for (std::uint32_t i = 0; i < r.n; ++i) {
      const auto& out = **outs[i];
      if (i > 0) j["choices"].push_back(reply(choices[i], out, created)["choices"][0]);
      completion += static_cast<std::uint32_t>(out.tokens.size());
      ext.push_back(tessera_extension(out));
    }
    // The prompt was read once for all of them.
    const std::uint32_t prompt = (**outs[0]).prompt_tokens;
    j["usage"] = {{"prompt_tokens", prompt},
                  {"completion_tokens", completion},
                  {"total_tokens", prompt + completion}};
    j["tessera"]["choices"] = ext;
    send_json(res, 200, j);
  }

  /// One stream to its outcome, the text cut at the first stop sequence.
  result<serving::outcome> run_choice(const api_request& r) {
    auto c = serving::client::connect(client_options());
    if (!c) return c.error();
    // Cancelled when the gateway stops: its thread pool joins this thread. With stop sequences
    // the text is watched as it comes, and the stream ends at the first one.
    std::atomic<bool> stop{false};
    std::string text;
    const auto watch = [&](const serving::token_event& t) {
      text += t.text;
      // Only the tail can hold a sequence that was not there before this token.
      const std::size_t from = text.size() > t.text.size() + max_stop_sequence_bytes
                                   ? text.size() - t.text.size() - max_stop_sequence_bytes
                                   : 0;
      if (find_stop(std::string_view(text).substr(from), r.stop) != std::string_view::npos)
        stop = true;
    };
    auto out = r.stop.empty() ? (*c)->ask(r.request, {}, &stopping)
                              : (*c)->ask(r.request, watch, &stopping, &stop);
    if (!out) return out;
    if (const auto at = find_stop(out->text, r.stop); at != std::string_view::npos) {
      out->text.resize(at);
      out->stop = "stop_sequence";
    }
    {
      std::lock_guard lock(mu);
      counters.streamed_tokens += out->tokens.size();
    }
    return out;
  }

  /// Starts the thread that runs `r`'s stream into a relay.
  std::shared_ptr<relay> start_relay(std::shared_ptr<const api_request> r) {
    auto rl = std::make_shared<relay>();
    auto co = client_options();
    rl->worker = std::thread([rl, r, co] {
      name_this_thread("http-relay");
      auto c = serving::client::connect(co);
      result<serving::outcome> out =
          c ? (*c)->ask(
                  r->request,
                  [&](const serving::token_event& t) {
                    std::lock_guard lock(rl->mu);
                    rl->pieces.push_back(
                        {std::string(t.text),
                         t.logprob != nullptr ? std::optional(*t.logprob) : std::nullopt,
                         std::string(t.node)});
                    ++rl->tokens;
                    rl->cv.notify_all();
                  },
                  &rl->cancel, &rl->stop)
            : result<serving::outcome>(c.error());
      std::lock_guard lock(rl->mu);
      rl->end.emplace(std::move(out));
      rl->cv.notify_all();
    });
    return rl;
  }

  void stream(const std::shared_ptr<api_request>& r, httplib::Response& res) {
    auto rl = start_relay(r);
    // Wait for the first token (or the end) before the status line goes out: a request that fails
    // before streaming anything gets its HTTP status, as the non-streaming API would.
    {
      std::unique_lock lock(rl->mu);
      while (rl->tokens == 0 && !rl->end && !stopping)
        rl->cv.wait_for(lock, std::chrono::milliseconds(100));
      if (rl->end && !*rl->end) {
        const auto e = error_of(rl->end->error(), r->kind);
        lock.unlock();
        rl->join();
        in_flight.fetch_sub(1);
        return send_error(res, e, r->dialect);
      }
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // a proxy in front must not hold the tokens back
    res.set_chunked_content_provider(
        r->dialect == api_dialect::openai ? "text/event-stream" : "application/x-ndjson",
        [this, rl, r](std::size_t, httplib::DataSink& sink) { return write_stream(*rl, *r, sink); },
        [this, rl](bool) {
          rl->join();
          in_flight.fetch_sub(1);
        });
  }

  bool write_stream(relay& rl, const api_request& r, httplib::DataSink& sink) {
    const auto created = unix_now();
    const bool openai = r.dialect == api_dialect::openai;
    // One piece of text as the request's API streams it.
    // Log-probabilities of the tokens whose text has not gone out yet: they go with it.
    std::vector<serving::token_logprob> pending_lp;
    std::size_t text_offset = 0;  // bytes of the answer written so far
    std::string written;          // with tools only: that answer's text (calls are read from it)
    // The peer serving the stream, sent with the first event after it changed (the first token,
    // and a failover's first): `"tessera": {"node": id}` (docs/HTTP.md).
    std::string last_node, pending_node;
    const auto piece_event = [&](std::string_view text) {
      std::string e;
      if (openai) {
        json j = chunk(r, text, false, "", created, pending_lp, text_offset);
        if (!pending_node.empty()) j["tessera"] = {{"node", pending_node}};
        pending_node.clear();
        e = sse(j);
      } else {
        e = ndjson(ollama_chunk(r, text, rfc3339_now()));
      }
      pending_lp.clear();
      text_offset += text.size();
      return e;
    };
    const auto write = [&](const std::string& s) {
      if (sink.write(s.data(), s.size())) return true;
      rl.cancel = true;
      std::lock_guard lock(mu);
      ++counters.disconnects;
      return false;
    };
    if (openai && r.kind == api_kind::chat && !write(sse(chunk(r, "", true, "", created))))
      return false;
    std::uint32_t written_tokens = 0;
    // A token's bytes that end inside a UTF-8 character wait here for the next token's, and so do
    // bytes that may begin a stop sequence (until the text shows whether one follows), and, with
    // tools, everything from where a tool call may begin (mesh/http/tools.hpp).
    std::string carry;
    bool stopped = false;  // a stop sequence appeared: the text ends before it
    const bool tools = r.tools && (openai || r.dialect == api_dialect::ollama_chat);
    for (;;) {
      std::deque<relay::piece> pieces;
      std::optional<result<serving::outcome>> end;
      std::uint32_t tokens = 0;
      {
        std::unique_lock lock(rl.mu);
        rl.cv.wait_for(lock, std::chrono::milliseconds(200),
                       [&] { return !rl.pieces.empty() || rl.end.has_value() || stopping; });
        if (stopping && !rl.end) {
          rl.cancel = true;
          return false;  // closes the connection: the client sees the stream cut
        }
        pieces.swap(rl.pieces);
        tokens = rl.tokens;
        if (rl.end) end = std::move(rl.end);
      }
      // One event per token (docs/HTTP.md), however many arrived since the last round.
      for (auto& piece : pieces) {
        if (stopped) break;  // tokens generated before the peer heard the cancel
        if (piece.logprob) pending_lp.push_back(std::move(*piece.logprob));
        if (piece.node != last_node) last_node = pending_node = piece.node;
        carry += piece.text;
        std::size_t n = utf8_complete_prefix(carry);
        if (!r.stop.empty()) {
          if (const auto at = find_stop(carry, r.stop); at != std::string_view::npos) {
            carry.resize(at);
            stopped = true;
            rl.stop = true;  // the relay's ask ends with the outcome so far; the peer stops
            n = carry.size();
          } else {
            n = std::min(n, carry.size() - stop_holdback(carry, r.stop));
          }
        }
        if (tools) {
          // The answer so far is what went out (text_offset bytes) and the carry.
          const std::size_t from = tool_holdback_from(written + carry);
          if (from != std::string_view::npos)
            n = std::min(n, from > text_offset ? from - text_offset : 0);
        }
        if (n == 0) continue;
        if (tools) written.append(carry, 0, n);
        if (!write(piece_event(std::string_view(carry).substr(0, n)))) return false;
        carry.erase(0, n);
      }
      if (end && tools && (end->has_value() || stopped)) {
        // The held text: tool calls (a chunk of them ends the stream), or content after all.
        auto parsed = parse_tool_calls(written + carry);
        if (!parsed.calls.empty() && !openai && end->has_value()) {
          // Ollama: the last line carries the calls (ollama_final reads them from the answer).
          if (!write(ndjson(ollama_final(r, **end, "", "stop", rfc3339_now())))) return false;
          sink.done();
          return true;
        }
        if (!parsed.calls.empty() && openai) {
          if (!write(sse(tool_calls_chunk(r, parsed.calls, created)))) return false;
          if (end->has_value() && r.include_usage &&
              !write(sse(usage_chunk(r, (**end).prompt_tokens,
                                     static_cast<std::uint32_t>((**end).tokens.size()), created))))
            return false;
          if (!write(std::string(sse_done))) return false;
          sink.done();
          return true;
        }
      }
      if (end && !carry.empty()) {
        if (tools) written += carry;
        if (!write(piece_event(carry))) return false;
        carry.clear();
      }
      {
        std::lock_guard lock(mu);
        counters.streamed_tokens += tokens - written_tokens;
      }
      written_tokens = tokens;
      if (!end) continue;
      if (!openai) {
        // Ollama: the last line carries done, its reason and the counts; an error is a line of
        // its own.
        serving::outcome none;
        const bool ok_end = end->has_value() || stopped;
        const auto& out = end->has_value() ? **end : none;
        const std::string line =
            ok_end ? ndjson(ollama_final(r, out, "", stopped ? "stop" : finish_reason(out.stop),
                                         rfc3339_now()))
                   : ndjson(ollama_error(error_of(end->error(), r.kind)));
        if (!write(line)) return false;
        sink.done();
        return true;
      }
      if (*end) {
        const auto& out = **end;
        json last = chunk(r, "", false, stopped ? "stop" : finish_reason(out.stop), created);
        last["tessera"] = tessera_extension(out);
        if (!write(sse(last))) return false;
        if (r.include_usage &&
            !write(sse(usage_chunk(r, out.prompt_tokens,
                                   static_cast<std::uint32_t>(out.tokens.size()), created))))
          return false;
      } else if (stopped) {
        // The text already ended at its stop sequence; how the stream then closed is moot.
        if (!write(sse(chunk(r, "", false, "stop", created)))) return false;
      } else if (!write(sse(error_of(end->error(), r.kind).to_json()))) {
        return false;
      }
      if (!write(std::string(sse_done))) return false;
      sink.done();
      return true;
    }
  }

  /// `n` > 1, streamed (OpenAI's API): one relay per choice, their chunks interleaved as they
  /// come, each with its choice's index and its own finish; usage (if asked) once all ended.
  void stream_choices(const std::shared_ptr<api_request>& r, httplib::Response& res) {
    auto relays = std::make_shared<std::vector<std::shared_ptr<relay>>>();
    auto choices = std::make_shared<std::vector<api_request>>();
    for (std::uint32_t i = 0; i < r->n; ++i) {
      choices->push_back(choice_request(*r, i));
      relays->push_back(start_relay(std::make_shared<const api_request>(choices->back())));
    }
    const auto join_all = [relays] {
      for (auto& rl : *relays)
        rl->join();
    };
    // As stream(): an error before any token gets its HTTP status.
    for (auto& rl : *relays) {
      std::unique_lock lock(rl->mu);
      while (rl->tokens == 0 && !rl->end && !stopping)
        rl->cv.wait_for(lock, std::chrono::milliseconds(100));
      if (rl->end && !*rl->end) {
        const auto e = error_of(rl->end->error(), r->kind);
        lock.unlock();
        join_all();
        in_flight.fetch_sub(1);
        return send_error(res, e, r->dialect);
      }
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, relays, choices](std::size_t, httplib::DataSink& sink) {
          return write_choices(*relays, *choices, sink);
        },
        [this, join_all](bool) {
          join_all();
          in_flight.fetch_sub(1);
        });
  }

  bool write_choices(std::vector<std::shared_ptr<relay>>& relays,
                     const std::vector<api_request>& choices, httplib::DataSink& sink) {
    const auto created = unix_now();
    const api_request& r0 = choices[0];
    struct state {
      std::string carry;  // bytes held back: an unfinished UTF-8 character, a stop's beginning
      std::vector<serving::token_logprob> pending_lp;
      std::size_t text_offset = 0;
      std::string last_node;
      bool stopped = false;
      bool ended = false;
      std::uint32_t tokens = 0;
      std::uint32_t prompt_tokens = 0;
    };
    std::vector<state> st(choices.size());
    const auto cancel_all = [&] {
      for (auto& rl : relays)
        rl->cancel = true;
    };
    const auto write = [&](const std::string& e) {
      if (sink.write(e.data(), e.size())) return true;
      cancel_all();
      std::lock_guard lock(mu);
      ++counters.disconnects;
      return false;
    };
    const auto piece = [&](std::size_t i, std::string_view text, const std::string& node) {
      json j = chunk(choices[i], text, false, "", created, st[i].pending_lp, st[i].text_offset);
      if (!node.empty()) j["tessera"] = {{"node", node}};
      st[i].pending_lp.clear();
      st[i].text_offset += text.size();
      return write(sse(j));
    };
    if (r0.kind == api_kind::chat)
      for (const auto& c : choices)
        if (!write(sse(chunk(c, "", true, "", created)))) return false;
    for (std::size_t left = choices.size(); left > 0;) {
      bool any = false;
      for (std::size_t i = 0; i < choices.size(); ++i) {
        if (st[i].ended) continue;
        relay& rl = *relays[i];
        std::deque<relay::piece> pieces;
        std::optional<result<serving::outcome>> end;
        {
          std::lock_guard lock(rl.mu);
          pieces.swap(rl.pieces);
          if (rl.end) end = std::move(rl.end);
        }
        any = any || !pieces.empty() || end.has_value();
        const auto& r = choices[i];
        for (auto& p : pieces) {
          if (st[i].stopped) break;
          ++st[i].tokens;
          if (p.logprob) st[i].pending_lp.push_back(std::move(*p.logprob));
          std::string node;
          if (p.node != st[i].last_node) node = st[i].last_node = p.node;
          st[i].carry += p.text;
          std::size_t n = utf8_complete_prefix(st[i].carry);
          if (!r.stop.empty()) {
            if (const auto at = find_stop(st[i].carry, r.stop); at != std::string_view::npos) {
              st[i].carry.resize(at);
              st[i].stopped = true;
              rl.stop = true;
              n = st[i].carry.size();
            } else {
              n = std::min(n, st[i].carry.size() - stop_holdback(st[i].carry, r.stop));
            }
          }
          if (n == 0) continue;
          if (!piece(i, std::string_view(st[i].carry).substr(0, n), node)) return false;
          st[i].carry.erase(0, n);
        }
        if (!end) continue;
        if (!st[i].carry.empty() && !piece(i, st[i].carry, "")) return false;
        st[i].carry.clear();
        st[i].ended = true;
        --left;
        {
          std::lock_guard lock(mu);
          counters.streamed_tokens += st[i].tokens;
        }
        if (*end) {
          const auto& out = **end;
          st[i].prompt_tokens = out.prompt_tokens;
          st[i].tokens = static_cast<std::uint32_t>(out.tokens.size());
          json last =
              chunk(r, "", false, st[i].stopped ? "stop" : finish_reason(out.stop), created);
          last["tessera"] = tessera_extension(out);
          if (!write(sse(last))) return false;
        } else if (st[i].stopped) {
          if (!write(sse(chunk(r, "", false, "stop", created)))) return false;
        } else {
          // One choice failed past every resumption: the whole answer ends with its error.
          cancel_all();
          if (!write(sse(error_of(end->error(), r.kind).to_json()))) return false;
          if (!write(std::string(sse_done))) return false;
          sink.done();
          return true;
        }
      }
      if (left == 0) break;
      if (stopping) {
        cancel_all();
        return false;  // closes the connection: the client sees the stream cut
      }
      if (!any) {
        // Nothing new from any choice: wait on the first that is still running.
        for (std::size_t i = 0; i < choices.size(); ++i) {
          if (st[i].ended) continue;
          std::unique_lock lock(relays[i]->mu);
          relays[i]->cv.wait_for(lock, std::chrono::milliseconds(20), [&] {
            return !relays[i]->pieces.empty() || relays[i]->end.has_value() || stopping;
          });
          break;
        }
      }
    }
    if (r0.include_usage) {
      std::uint32_t completion = 0;
      for (const auto& c : st)
        completion += c.tokens;
      if (!write(sse(usage_chunk(r0, st[0].prompt_tokens, completion, created)))) return false;
    }
    if (!write(std::string(sse_done))) return false;
    sink.done();
    return true;
  }

  void routes() {
    svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(dashboard_html()), "text/html; charset=utf-8");
    });
    svr.Get("/chat", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(chat_html()), "text/html; charset=utf-8");
    });
    // Browsers ask for it with every page: no icon, and no 404 in the logs and counters.
    svr.Get("/favicon.ico",
            [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"ok", true}});
    });
    svr.Get("/status", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res)) send_json(res, 200, status_doc());
    });
    svr.Get("/cluster", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res)) send_json(res, 200, cluster_doc());
    });
    svr.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      gateway_counters c;
      {
        std::lock_guard lock(mu);
        c = counters;
      }
      c.in_flight = in_flight.load();
      res.set_content(render_metrics(status_doc(), c, read_process_facts()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res)) models(res);
    });
    svr.Get(R"(/v1/models/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res)) model(req.matches[1].str(), res);
    });
    // With a content reader: the body is read by read_body(), bounded, whatever its framing.
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& reader) {
      if (authorized(req, res)) api(api_kind::completion, res, reader);
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) {
      if (authorized(req, res)) api(api_kind::chat, res, reader);
    });
    // Ollama's API (mesh/http/ollama.hpp): the same serving path, Ollama's shapes.
    svr.Post("/api/generate", [this](const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
      if (authorized(req, res))
        api(api_kind::completion, res, reader, api_dialect::ollama_generate);
    });
    svr.Post("/api/chat", [this](const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& reader) {
      if (authorized(req, res)) api(api_kind::chat, res, reader, api_dialect::ollama_chat);
    });
    svr.Get("/api/tags", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res)) send_json(res, 200, ollama_tags(model_list()));
    });
    svr.Post("/api/show", [this](const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& reader) {
      if (authorized(req, res)) show(res, reader);
    });
    svr.Get("/api/version", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req, res)) send_json(res, 200, {{"version", "0.1.0"}});
    });
    // Ranges: every answer here is a small document; a Range header with thousands of ranges
    // made an 8 KB request into a 14.7 MB multipart answer (cpp-httplib serves them all). One
    // range is served, more are refused.
    // The refusal has no body: cpp-httplib applies the ranges to whatever body an answer has,
    // this one included (a JSON error would come back 2,700 times).
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // CORS: an allowed origin's preflight is answered here (before authentication: browsers
      // send no credentials with it), and every other answer to it names the origin.
      if (const auto origin = allowed_origin(req); !origin.empty()) {
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
        if (req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method")) {
          res.status = 204;
          res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
          // The headers the browser asks for (bounded: an echo, not a way to grow answers).
          const std::string asked = req.get_header_value("Access-Control-Request-Headers");
          res.set_header("Access-Control-Allow-Headers", !asked.empty() && asked.size() <= 256
                                                             ? asked
                                                             : "Authorization, Content-Type");
          res.set_header("Access-Control-Max-Age", "600");
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (req.ranges.size() <= 1) return httplib::Server::HandlerResponse::Unhandled;
      res.status = 416;
      res.set_header("X-Tessera-Error",
                     fmt::format("{} ranges requested; at most 1 is served", req.ranges.size()));
      return httplib::Server::HandlerResponse::Handled;
    });
    // Errors httplib raises itself (no route, body too large, ...) get the API's error shape.
    svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler wrote its own error
      if (res.status == 416) return;  // many ranges: no body to multiply (pre-routing handler)
      // A known path asked with another method: 405 and what it allows, not "no route".
      if (const auto allow = methods_of(req.path); res.status == 404 && !allow.empty()) {
        res.status = 405;
        res.set_header("Allow", allow);
        api_error e;
        e.status = 405;
        e.code = "method_not_allowed";
        e.message = fmt::format("{} {}: this route takes {}", req.method, req.path, allow);
        res.set_content(dump(e.to_json()), "application/json");
        return;
      }
      api_error e;
      e.status = res.status;
      e.code = res.status == 404 ? "not_found" : "";
      e.message = res.status == 404   ? fmt::format("no route {} {}", req.method, req.path)
                  : res.status == 413 ? "the request body is too large"
                                      : fmt::format("HTTP {}", res.status);
      res.set_content(dump(e.to_json()), "application/json");
    });
    svr.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          api_error e;
          e.status = 500;
          e.type = "server_error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& x) {
            e.message = fmt::format("internal error: {}", x.what());
          } catch (...) {
            e.message = "internal error";
          }
          send_error(res, e);
        });
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      std::lock_guard lock(mu);
      ++counters.requests[{route_of(req.path), res.status}];
    });
  }
};

gateway::gateway(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

gateway::~gateway() {
  stop();
}

result<std::unique_ptr<gateway>> gateway::start(gateway_options options) {
  if (options.peers.empty())
    return make_error(errc::invalid_argument, "http gateway: no client endpoint to send to");
  auto p = std::make_unique<impl>();
  p->opt = std::move(options);
  const auto threads = p->opt.threads;
  const std::atomic<bool>* release = &p->stopping;
  p->svr.new_task_queue = [threads, release] { return new pool_queue(threads, release); };
  p->svr.set_payload_max_length(p->opt.max_body_bytes);
  // cpp-httplib's default sets SO_REUSEPORT: a second process could then bind the same port and
  // take every other connection (even another cluster's node). SO_REUSEADDR only: a taken port
  // is refused with a clear error.
  impl* raw = p.get();
  p->svr.set_socket_options([raw](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    raw->listen_fd = sock;
  });
  // A client that stops sending (a PUT without its body, a slow drip) holds a handler for at
  // most this long per read.
  p->svr.set_read_timeout(10);
  p->svr.set_write_timeout(30);
  // An open connection that sends no request holds its handler this long.
  p->svr.set_keep_alive_timeout(5);
  p->svr.set_keep_alive_max_count(100);
  p->routes();
  const auto& addr = p->opt.bind_address;
  if (p->opt.port == 0) {
    const int port = p->svr.bind_to_any_port(addr);
    if (port <= 0) return make_error(errc::io, "http gateway: cannot bind {}:<any port>", addr);
    p->port = static_cast<std::uint16_t>(port);
  } else {
    if (!p->svr.bind_to_port(addr, p->opt.port))
      return make_error(errc::io,
                        "http gateway: cannot bind {}:{} (in use, or not an address of "
                        "this machine); set listen.http_port",
                        addr, p->opt.port);
    p->port = p->opt.port;
  }
  // cpp-httplib listens with a backlog of 5: a burst of connections (a stranger's, or many
  // clients at once) overflowed it and every later connect, an honest one too, waited for SYN
  // retries (1 s, 3 s, 7 s, ...). listen() again on the bound socket only raises the backlog.
  if (p->listen_fd >= 0) (void)::listen(p->listen_fd, kListenBacklog);
  p->listener = std::thread([raw] {
    name_this_thread("http-accept");
    raw->svr.listen_after_bind();
  });
  // cpp-httplib's stop() does nothing until the listener thread has marked the server running:
  // a gateway stopped right after it started would leave that thread in accept() for good (and
  // stop() joining it). Wait for it (bounded; it takes microseconds).
  for (int i = 0; i < 5000 && !p->svr.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  spdlog::info("http gateway: http://{}:{}/ ({})", addr, p->port,
               p->opt.api_key.empty() ? "no API key" : "API key required");
  return std::unique_ptr<gateway>(new gateway(std::move(p)));
}

void gateway::stop(std::uint32_t drain_ms) {
  if (!impl_ || impl_->closing.exchange(true)) return;
  const auto end = clock_type::now() + std::chrono::milliseconds(drain_ms);
  while (impl_->in_flight.load() > 0 && clock_type::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  impl_->stopping = true;
  impl_->svr.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

std::uint16_t gateway::port() const {
  return impl_->port;
}

}  // namespace tessera::mesh::http
