// The HTTP gateway every peer runs (docs/HTTP.md): the OpenAI-compatible API, /metrics, the
// status document and the live dashboard.
//
// An API request becomes a pub-sub request through serving::client, connected to this peer's own
// client endpoint (it learns the others from the peer list). So it takes exactly the path a
// `tessera ask` takes — intake by the group the plan picks, tokens straight from the serving peer,
// resumption on another peer when that one dies — and the gateway adds no second serving path.
//
// Threads: cpp-httplib's pool (bounded, below) runs the handlers; a streaming request also runs
// its serving client on a thread of its own, so the handler can answer an error before any byte
// of the stream is sent (a stream that fails before its first token gets a proper HTTP status).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/base/result.hpp"
#include "mesh/serving/client.hpp"

namespace tessera::mesh::http {

struct gateway_options {
  std::string bind_address = "127.0.0.1";  ///< loopback unless configured otherwise
  std::uint16_t port = 7480;               ///< 0: any free port
  /// Bearer token every route but /health and the dashboard page requires; empty: no auth.
  std::string api_key;
  /// Where API requests go: this peer's own client endpoint (the others are learnt from it).
  std::vector<serving::peer_endpoint> peers;
  /// The node's latest status document (any thread; must not block for long).
  std::function<nlohmann::json()> status;
  /// Every live member's status document, keyed by node id, for the dashboard (any thread; may
  /// take up to a second: the gateway caches it for `cluster_cache_ms`). Empty: only this node.
  std::function<nlohmann::json()> cluster_status;
  std::uint32_t cluster_cache_ms = 1000;
  std::uint32_t max_in_flight = 32;       ///< API requests at once; beyond: 429 overloaded
  /// Handler threads at most (one per open connection; 1 when idle). cpp-httplib gives each
  /// connection a thread for as long as it stays open, so this is how many idle, slow or
  /// half-open connections a stranger must hold before an honest request waits in the queue:
  /// each holds its thread for the keep-alive timeout (5 s) when it sends nothing, or one read
  /// timeout per read when it drips. Threads are made only while connections are open.
  std::uint32_t threads = 1024;
  std::uint32_t request_timeout_s = 300;  ///< one API request, start to end
  std::size_t max_body_bytes = 1 << 20;
  std::uint32_t stall_ms = 3000;  ///< serving client: resume elsewhere after this much silence
  /// Browser origins allowed to call the API (CORS: their preflights are answered and every
  /// answer to them names them); "*" allows any. Empty: no CORS headers, browsers on other
  /// origins are refused by the browser itself.
  std::vector<std::string> cors_origins;
  /// The cluster's client access key, when the peers require client authentication.
  std::optional<transport::control::client_access> client_access;
};

class gateway {
 public:
  /// Binds (the error names the address and port) and starts serving.
  [[nodiscard]] static result<std::unique_ptr<gateway>> start(gateway_options options);
  ~gateway();
  gateway(const gateway&) = delete;
  gateway& operator=(const gateway&) = delete;

  /// Refuses new API requests (503, "unavailable"), waits up to `drain_ms` for the running ones
  /// to end, then closes every connection (a stream still running sees its connection close).
  /// Idempotent.
  void stop(std::uint32_t drain_ms = 0);
  [[nodiscard]] std::uint16_t port() const;

  struct impl;

 private:
  explicit gateway(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// The dashboard page (self-contained HTML + JS; it polls /status and /cluster).
[[nodiscard]] std::string_view dashboard_html() noexcept;
/// The chat page (GET /chat): a model, a conversation streamed from this peer's API, stop, and the
/// peers that served each answer.
[[nodiscard]] std::string_view chat_html() noexcept;

}  // namespace tessera::mesh::http
