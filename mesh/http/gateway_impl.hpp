// The HTTP gateway's insides (private to mesh/http; the API is gateway.hpp): what a running
// gateway holds, the helpers its parts share, and the relay between a serving client's thread and
// the HTTP thread that writes its stream. Four files define them, one concern each: gateway.cpp
// starts and stops the gateway (binding, cpp-httplib's settings, the handler pool),
// gateway_routes.cpp is what each route answers (pages, documents, models, authorization, CORS,
// httplib's own errors), gateway_api.cpp runs an API request (intake, bounds, non-streamed
// answers), gateway_stream.cpp streams one (relays, SSE and NDJSON events, n > 1 interleaved).
#pragma once

#include "mesh/http/gateway.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "mesh/http/metrics.hpp"
#include "mesh/http/ollama.hpp"
#include "mesh/http/openai.hpp"
#include "mesh/serving/client.hpp"

namespace tessera::mesh::http {

namespace gateway_detail {

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

inline void send_error(httplib::Response& res, const api_error& e) {
  send_json(res, e.status, e.to_json());
}

/// An error in the shape of the API the request came in by: OpenAI's object, or Ollama's
/// {"error": "..."}.
inline void send_error(httplib::Response& res, const api_error& e, api_dialect d) {
  if (d == api_dialect::openai) return send_error(res, e);
  send_json(res, e.status, ollama_error(e));
}

/// One line of an NDJSON stream (Ollama's).
inline std::string ndjson(const nlohmann::json& j) {
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

}  // namespace gateway_detail

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
  nlohmann::json cluster_cache;
  std::optional<std::chrono::steady_clock::time_point> cluster_at;

  // ------------------------------------------------------------------ plumbing
  std::string allowed_origin(const httplib::Request& req) const;  // gateway_routes.cpp
  bool authorized(const httplib::Request& req, httplib::Response& res);
  result<std::string> new_id(api_kind kind, std::uint64_t* seed);  // gateway_api.cpp
  nlohmann::json status_doc() const;                               // gateway_routes.cpp
  nlohmann::json cluster_doc();
  serving::client_options client_options() const;  // gateway_api.cpp

  // ------------------------------------------------------------------ routes (gateway_routes.cpp)
  void models(httplib::Response& res);
  void model(const std::string& id, httplib::Response& res);
  void show(httplib::Response& res, const httplib::ContentReader& reader);
  nlohmann::json model_list();
  std::optional<std::string> read_body(const httplib::ContentReader& reader,
                                       httplib::Response& res);
  void routes();
  void page_routes();
  void api_routes();
  void pre_routing();
  void error_handlers();

  // ------------------------------------------------------------------ API (gateway_api.cpp)
  void api(api_kind kind, httplib::Response& res, const httplib::ContentReader& reader,
           api_dialect dialect = api_dialect::openai);
  void complete(const api_request& r, httplib::Response& res);
  void complete_choices(const api_request& r, httplib::Response& res);
  result<serving::outcome> run_choice(const api_request& r);

  // ------------------------------------------------------------------ streams (gateway_stream.cpp)
  std::shared_ptr<gateway_detail::relay> start_relay(std::shared_ptr<const api_request> r);
  std::optional<api_error> error_before_first_token(gateway_detail::relay& rl, api_kind kind);
  void stream(const std::shared_ptr<api_request>& r, httplib::Response& res);
  bool write_stream(gateway_detail::relay& rl, const api_request& r, httplib::DataSink& sink);
  void stream_choices(const std::shared_ptr<api_request>& r, httplib::Response& res);
  bool write_choices(std::vector<std::shared_ptr<gateway_detail::relay>>& relays,
                     const std::vector<api_request>& choices, httplib::DataSink& sink);
};

}  // namespace tessera::mesh::http
