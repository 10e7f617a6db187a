// stream_follower: the client rules of docs/PROTOCOL.md for one request, as a pure state machine —
// time and responses in; requests to publish, tokens to hand on and the outcome out. No sockets,
// no clock (times are microseconds of the caller's monotonic clock): the C++ client drives it with ZeroMQ and the steady clock, the simulator with its
// simulated network and virtual time, so both run the very same failover logic.
//
//   stream_follower f(req, opts, now);        // publish f.first_publication() to every peer
//   auto s = f.on_response(m, now);           // s.token: m is the next token, hand it on
//   auto s = f.on_tick(now);                  // call by f.wake_at_us() at the latest
//   if (s.publish) ...; if (s.done) ...       // re-publication / resumption; the outcome
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::serving {

struct follower_options {
  std::uint32_t republish_ms = 500;     ///< re-publish while no peer has accepted (starts at 25)
  std::uint32_t stall_ms = 3000;        ///< silence after "accepted" this long: resume elsewhere
  std::uint32_t deadline_ms = 120'000;  ///< the whole request, whatever happens
  std::uint32_t max_attempts = 32;      ///< resumptions before giving up (explicit error)
  /// Silence after a peer list omitted the serving peer: resume. Above the peers' keepalive
  /// interval (500 ms), so a peer that is alive, only queued, keeps its stream.
  std::uint32_t gone_stall_ms = 700;
};

/// How a request ended well.
/// One token's log-probability and its most probable alternatives' (requests with
/// top_logprobs >= 0).
struct token_logprob {
  std::string text;  ///< the token's bytes
  float logprob = 0.0f;
  struct alternative {
    std::int32_t token = -1;
    std::string text;
    float logprob = 0.0f;
  };
  std::vector<alternative> top;
};

struct outcome {
  std::string stop;  ///< done: why the stream ended
  std::uint32_t prompt_tokens = 0;
  std::vector<std::int32_t> tokens;  ///< every token id, index order
  std::string text;                  ///< their bytes concatenated
  std::vector<std::string> nodes;    ///< the peers that served the stream, in order
  std::uint32_t attempts = 1;        ///< 1 + resumptions
  double first_token_s = 0;          ///< publish to the first token
  double total_s = 0;
  double longest_gap_s = 0;  ///< the longest wait between two tokens (a failover's cost)
  std::vector<token_logprob> logprobs;  ///< one per token when asked for (top_logprobs >= 0)
};

/// What one input made the follower do.
struct follower_step {
  std::optional<request> publish;       ///< publish this to every peer (at most one per step)
  bool token = false;                   ///< on_response: the response is the next token
  std::optional<result<outcome>> done;  ///< the request ended (the follower is finished)
};

class stream_follower {
 public:
  /// `r` must be valid (serving::validate); attempt and resume are managed here.
  stream_follower(request r, follower_options options, std::uint64_t now_us);

  /// The first publication (attempt 0), to send at construction time.
  [[nodiscard]] const request& first_publication() const { return req_; }
  follower_step on_response(const response& m, std::uint64_t now_us);
  /// A peer list (kind "peers"): when it names the live members (`nodes` not empty) and the peer
  /// serving the current attempt is not among them, that peer was declared dead or left — or is
  /// only cut off from the list's sender (a partition the client is not part of). So the stall
  /// bound drops to gone_stall_ms: a dead peer, silent since it died, is left at once; a peer that
  /// still streams to us keeps the stream (resuming it would start the same attempt on the other
  /// side of the partition, whose lists then omit the new peer: a ping-pong).
  follower_step on_peers(const response& m, std::uint64_t now_us);
  follower_step on_tick(std::uint64_t now_us);
  /// The caller lost interest: the step publishes the cancel message and ends with
  /// errc::cancelled.
  follower_step cancel(std::uint64_t now_us);
  /// The caller has what it wanted (a stop sequence appeared in the text): the step publishes the
  /// cancel message, as cancel(), and ends with the outcome so far, stop "stop_sequence".
  follower_step stop_early(std::uint64_t now_us);

  /// When on_tick must run next at the latest (re-publication, stall, deadline).
  [[nodiscard]] std::uint64_t wake_at_us() const;
  [[nodiscard]] bool finished() const { return finished_; }
  [[nodiscard]] bool accepted() const { return accepted_; }
  /// The last token's log-probabilities (requests with top_logprobs >= 0), else null.
  [[nodiscard]] const token_logprob* last_logprob() const {
    return out_.logprobs.empty() ? nullptr : &out_.logprobs.back();
  }

 private:
  follower_step resume(std::string_view why, std::uint64_t now_us);
  follower_step cut_duplicate(const std::string& node);
  // Silence after which the current attempt is resumed: stall_ms, or gone_stall_ms once a peer
  // list omitted the serving peer.
  [[nodiscard]] std::uint64_t stall_bound_us() const;
  follower_step finish(result<outcome> r);

  request req_;
  follower_options opt_;
  outcome out_;
  // Times in microseconds of the caller's monotonic clock.
  std::uint64_t t0_us_ = 0, deadline_us_ = 0, last_publish_us_ = 0, last_heard_us_ = 0;
  std::uint64_t last_token_us_ = 0;
  std::string serving_node_;  // the peer that accepted the current attempt ("" before)
  bool serving_gone_ = false;     // a peer list omitted it: the shorter stall bound applies
  std::vector<std::string> cut_;  // peers told to drop their duplicate of the current attempt
  std::uint32_t republish_ms_ = 25;
  bool accepted_ = false;
  bool finished_ = false;
};

/// The errc a client reports for a peer's error code.
[[nodiscard]] errc errc_of(std::string_view code) noexcept;

/// A peer's error as the client reports it: "<message> (<code>, from peer <node>)" (the peer's id
/// helps an operator; an HTTP client gets the code and the message without it).
struct peer_error {
  std::string message, code, node;
};
[[nodiscard]] std::string format_peer_error(std::string_view message, std::string_view code,
                                            std::string_view node);
/// The parts of a format_peer_error() text; nullopt for any other error text.
[[nodiscard]] std::optional<peer_error> parse_peer_error(std::string_view text);

}  // namespace tessera::mesh::serving
