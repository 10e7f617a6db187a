// The client protocol (pub-sub): what clients publish and what peers stream back. Wire format and
// rules for client authors: docs/PROTOCOL.md. Pure codec and validation: no sockets, no threads.
//
//   client PUB ──["req"][request]──► every peer's SUB   (every peer sees every request)
//   client SUB ◄──["<id>:"][response]── the peers' XPUB  (the client subscribes to its ids)
//
// Messages are msgpack maps with string keys, so any msgpack library can speak them; unknown keys
// are ignored and missing keys take their defaults (forward compatibility).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/result.hpp"

namespace tessera::mesh::serving {

/// Protocol version carried in every message as "v". A peer refuses a request of another version
/// with an error naming both.
inline constexpr std::uint32_t protocol_version = 1;

/// Topic frame of every request.
inline constexpr std::string_view request_topic = "req";
/// Topic frame of the peer list a peer publishes (kind "peers"): when a client subscribes to it,
/// and every 2 s. A client that knows one peer learns every peer's client endpoints from it. It
/// starts with ':', which no id contains, so it never prefixes a response topic.
inline constexpr std::string_view peers_topic = ":peers";

// Bounds: a request beyond them is refused with invalid_request naming the field.
inline constexpr std::size_t max_id_bytes = 64;  ///< ids: [A-Za-z0-9_.-], 1..64 bytes
inline constexpr std::size_t max_model_bytes = 256;
inline constexpr std::size_t max_prompt_bytes = 64 * 1024;
inline constexpr std::size_t max_messages = 64;  ///< chat messages
inline constexpr std::uint32_t max_tokens_limit = 4096;
inline constexpr std::int32_t max_top_logprobs = 20;        ///< alternatives per token, as OpenAI
inline constexpr std::size_t max_schema_bytes = 64 * 1024;  ///< request::schema (json_schema.hpp)
inline constexpr std::uint32_t max_attempt = 1000;
inline constexpr std::size_t max_message_bytes = 256 * 1024;  ///< a whole encoded message
inline constexpr std::size_t max_peers = 256;                 ///< endpoints in a peers message

struct chat_message {
  std::string role;  ///< system, user, assistant or tool
  std::string content;
  /// An assistant's tool calls as the client sent them (OpenAI's JSON array), "" when none.
  std::string tool_calls;
  /// A tool message: the call it answers, and the tool's name (may be empty).
  std::string tool_call_id;
  std::string name;
  MSGPACK_DEFINE_MAP(role, content, tool_calls, tool_call_id, name);
};

/// A generation request. `attempt` and `resume` make failover a client decision: a client that
/// saw tokens [0, k) and then silence (or a gap) publishes the same id with attempt + 1 and
/// resume = those k token ids; the peer that takes it re-prefills prompt + resume and continues
/// at index k. Sampling is reseeded per token index, so a resumed stream is the stream the lost
/// peer would have produced.
struct request {
  std::uint32_t v = protocol_version;
  std::string id;
  std::string model;
  std::string prompt;                  ///< plain completion (or use messages)
  std::vector<chat_message> messages;  ///< chat: rendered with the model's template
  /// Chat: the tools the model may call (OpenAI's JSON array), "" when none; rendered by the
  /// model's own chat template.
  std::string tools;
  /// "json_object": the answer is one JSON object (constrained decoding: every token that cannot
  /// continue one is masked, and the stream ends, stop "end_of_generation", when it is complete).
  /// "json_schema": the answer is one JSON value that satisfies `schema` (the subset of JSON
  /// Schema that inference/tokenizer/json_schema.hpp takes; others are refused naming the
  /// keyword). "": free text.
  std::string format;
  std::string schema;  ///< with format json_schema: the schema, as JSON text (at most 64 KiB)
  /// Chat with tools: "" the model decides whether to call one; "required": the answer is a call
  /// to one of `tools`; "function": a call to the tool named `tool_name`. A forced call is
  /// written as the model's template writes calls, constrained like a json_schema answer
  /// (inference/tokenizer/forced_call.hpp); `format` stays "".
  std::string tool_choice;
  std::string tool_name;
  /// Requests with the same affinity key (an id's alphabet) are routed to the same group, as if
  /// they had that id: the choices of one request with n > 1 meet on one peer, which reads their
  /// shared prompt once. "": the request's own id.
  std::string affinity;
  std::uint32_t max_tokens = 128;
  float temperature = 0.8f;  ///< <= 0: greedy
  std::int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  std::uint64_t seed = 0;
  float frequency_penalty = 0.0f;  ///< [-2, 2]; over the sampler's window (model/sampler.hpp)
  float presence_penalty = 0.0f;   ///< [-2, 2]
  /// -1: no log-probabilities; 0..max_top_logprobs: every token carries its log-probability and
  /// that many most probable alternatives with theirs.
  std::int32_t top_logprobs = -1;
  std::uint32_t attempt = 0;
  std::vector<std::int32_t> resume;  ///< generated token ids the client already holds
  /// The client lost interest: the peer serving `id` ends that stream (attempt <= `attempt`)
  /// without another message and remembers it as finished. Only `v`, `id` and `attempt` matter.
  bool cancel = false;
  /// With `cancel`: only the peer of this node id stops (a client cutting short a duplicate
  /// acceptance of its attempt keeps the first peer's stream). Empty: whichever peer serves it.
  std::string node;
  /// Not on the wire: set by the receiving peer to the client connection the request came on
  /// (its ZAP user id), the identity its fair share is counted by (fair_share.hpp). A client
  /// cannot claim another's.
  std::string client;
  MSGPACK_DEFINE_MAP(v, id, model, prompt, messages, max_tokens, temperature, top_k, top_p, min_p,
                     repeat_penalty, seed, attempt, resume, cancel, node, frequency_penalty,
                     presence_penalty, top_logprobs, tools, format, schema, affinity, tool_choice,
                     tool_name);
};

enum class response_kind : std::uint8_t { accepted, token, done, error };
[[nodiscard]] std::string_view to_string(response_kind k) noexcept;

/// Error codes (the "code" field of an error).
namespace error_code {
inline constexpr std::string_view invalid_request = "invalid_request";
inline constexpr std::string_view unknown_model = "unknown_model";
inline constexpr std::string_view no_capacity = "no_capacity";
/// The prompt (with the tokens being resumed) does not fit the model's context on the peer.
inline constexpr std::string_view context_length_exceeded = "context_length_exceeded";
inline constexpr std::string_view overloaded = "overloaded";
inline constexpr std::string_view internal = "internal";
/// The peer stopped serving the stream (it is leaving): the client resumes it elsewhere.
inline constexpr std::string_view unavailable = "unavailable";
/// The client cancelled the request (sent only as the remembered answer to a late re-publication).
inline constexpr std::string_view cancelled = "cancelled";
}  // namespace error_code

/// One message of a stream. Which fields mean something depends on `kind` (docs/PROTOCOL.md).
struct response {
  std::uint32_t v = protocol_version;
  std::string kind;  ///< "accepted" | "token" | "done" | "error" | "peers"
  std::string id;
  std::uint32_t attempt = 0;
  std::string node;                 ///< the peer that sent it (hex node id)
  std::uint32_t index = 0;          ///< token: 0-based index among generated tokens
  std::int32_t token = -1;          ///< token: its id
  std::vector<char> text;           ///< token: its bytes (may be part of a UTF-8 sequence: bin)
  std::uint32_t tokens = 0;         ///< done: how many tokens the stream holds in all
  std::uint32_t prompt_tokens = 0;  ///< done
  std::string stop;                 ///< done: end_of_generation | max_tokens | context_full
  std::string code;                 ///< error: one of error_code
  std::string message;              ///< error: what was wrong, naming it
  std::vector<std::string> peers;   ///< peers: "host:request_port:response_port" of live members
  /// peers: the node ids of the live members of the sender's view (itself first; empty before it
  /// has a plan). A client whose stream's serving peer is not among them resumes at once.
  std::vector<std::string> nodes;
  /// token, when the request asked for log-probabilities: the token's, and its alternatives'
  /// (ids, bytes and log-probabilities, most probable first).
  float logprob = 0.0f;
  std::vector<std::int32_t> alt_tokens;
  std::vector<std::vector<char>> alt_text;
  std::vector<float> alt_logprobs;
  MSGPACK_DEFINE_MAP(v, kind, id, attempt, node, index, token, text, tokens, prompt_tokens, stop,
                     code, message, peers, nodes, logprob, alt_tokens, alt_text, alt_logprobs);
};

/// Topic frame of `id`'s responses: the id and a ':' (not allowed in ids, so a subscription to
/// "a:" never matches "ab:").
[[nodiscard]] std::string response_topic(std::string_view id);

/// Checks an id: 1..max_id_bytes of [A-Za-z0-9_.-].
[[nodiscard]] bool valid_id(std::string_view id) noexcept;

/// A fresh request id: `prefix` and 128 bits from the kernel's CSPRNG in hex. The id is the
/// request's capability (whoever knows it can read, cancel and resume the stream), so it must
/// be unguessable: never from a seeded PRNG whose outputs a client sees in its own ids.
[[nodiscard]] result<std::string> random_request_id(std::string_view prefix);

/// Encodes to msgpack bytes.
[[nodiscard]] std::string encode(const request& r);
[[nodiscard]] std::string encode(const response& r);

/// Decodes a request body. invalid_argument naming the problem for a malformed or oversized body.
/// The result is not validated yet: see validate().
[[nodiscard]] result<request> decode_request(std::string_view bytes);
[[nodiscard]] result<response> decode_response(std::string_view bytes);

/// Checks versions, ids, bounds and sampling ranges. The error names the field.
[[nodiscard]] result<void> validate(const request& r);

}  // namespace tessera::mesh::serving
