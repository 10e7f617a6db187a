// The C++ client of the pub-sub protocol (docs/PROTOCOL.md): publishes a request to every peer it
// knows (the peers it was given and those their peer lists name), follows the token stream, and
// resumes the stream on another peer when it goes silent or skips an index — so the caller sees
// every index exactly once, in order, or one explicit error. The rules themselves are the pure
// stream_follower (follower.hpp), which the simulator runs too; this is its ZeroMQ driver.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"
#include "mesh/serving/follower.hpp"
#include "mesh/serving/protocol.hpp"
#include "transport/control/cluster_key.hpp"

namespace tessera::mesh::serving {

/// A peer's client endpoints.
struct peer_endpoint {
  std::string host;
  std::uint16_t request_port = 7402;
  std::uint16_t response_port = 7403;
};

/// Parses "host:request_port" (the response port is the next one, as in the defaults) or
/// "host:request_port:response_port". The error names the text.
[[nodiscard]] result<peer_endpoint> parse_peer(std::string_view text);

struct client_options {
  std::vector<peer_endpoint> peers;
  std::uint32_t republish_ms = 500;     ///< re-publish while no peer has accepted
  std::uint32_t stall_ms = 3000;        ///< silence after "accepted" this long: resume elsewhere
  std::uint32_t deadline_ms = 120'000;  ///< the whole request, whatever happens
  std::uint32_t max_attempts = 32;      ///< resumptions before giving up (explicit error)
  /// Give up (errc::timeout, naming the peers) when no peer completed a connection and none
  /// answered within this long: nothing is listening there. 0: wait out the deadline.
  std::uint32_t unreachable_ms = 0;
  /// The cluster's client access key, for peers started with --client-auth (CURVE on both
  /// client sockets). Empty: plain connections, as open peers expect.
  std::optional<transport::control::client_access> access;
};

/// One token as the caller receives it.
struct token_event {
  std::uint32_t index = 0;
  std::int32_t token = -1;
  std::string_view text;  ///< the token's bytes (may split a UTF-8 sequence)
  std::string_view node;  ///< the peer that generated it
  /// Its log-probabilities when the request asked for them (top_logprobs >= 0), else null.
  const token_logprob* logprob = nullptr;
};

class client {
 public:
  /// Connects to every peer (ZeroMQ connects lazily: no peer needs to be up yet).
  [[nodiscard]] static result<std::unique_ptr<client>> connect(client_options options);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  /// Runs `r` (its id must be unique to this client's requests; attempt and resume are managed
  /// here) to its outcome. `on_token` sees each index once, in order. Errors: the peer's error
  /// (errc::not_found for unknown_model, no_capacity, invalid_argument for invalid_request,
  /// overloaded) with its message; errc::unauthorized at once when every peer this client
  /// reached refused its handshake (a missing, wrong or unneeded client key; the message names
  /// the peer and the fix); errc::timeout when no peer accepted or the stream stalled past
  /// the deadline or the attempts; errc::cancelled soon (within 50 ms) after `*cancel` turns true
  /// (the caller lost interest: an HTTP client hung up). The serving peer is told (a cancel
  /// message) and stops generating. Once `*stop` turns true (set by `on_token` when the text
  /// holds a stop sequence, or by another thread) the stream ends the same way but successfully:
  /// the outcome so far, stop "stop_sequence".
  [[nodiscard]] result<outcome> ask(request r,
                                    const std::function<void(const token_event&)>& on_token = {},
                                    const std::atomic<bool>* cancel = nullptr,
                                    const std::atomic<bool>* stop = nullptr);

  struct impl;

 private:
  explicit client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tessera::mesh::serving
