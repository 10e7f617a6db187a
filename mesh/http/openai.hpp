// The OpenAI-compatible API's pure half: JSON bodies in, serving requests out; outcomes in, JSON
// replies and server-sent-event chunks out. No sockets and no threads, so every rule here is unit
// tested; mesh/http/gateway_*.cpp put it on the wire (docs/HTTP.md).
//
//   POST /v1/completions       {"model", "prompt", "max_tokens", "stream", ...}
//   POST /v1/chat/completions  {"model", "messages": [{"role", "content"}], "stream", ...}
//
// Fields OpenAI documents that would change the answer but that Tessera does not do (echo,
// best_of, suffix, logit_bias, n > 1 with tools) are refused with an
// error naming the field, never silently ignored: a client must not believe it got something it
// did not. Fields that do not change the answer (user, metadata, ...) are ignored.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "actors/base/result.hpp"
#include "mesh/serving/client.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::http {

enum class api_kind : std::uint8_t { completion, chat };

/// Default max_tokens when the body names none: OpenAI's 16 for completions; chat has no default
/// there (it runs to the context's end), so Tessera stops at a bound a reader can wait for.
inline constexpr std::uint32_t default_completion_tokens = 16;
inline constexpr std::uint32_t default_chat_tokens = 512;

/// Whose API a request came in: the answers take its shapes (mesh/http/ollama.hpp).
enum class api_dialect : std::uint8_t { openai, ollama_generate, ollama_chat };

/// A parsed API request: the serving request to run and how to answer.
struct api_request {
  api_kind kind = api_kind::completion;
  api_dialect dialect = api_dialect::openai;
  std::string model_as_sent;  ///< the model as the body named it (Ollama: "tiny:latest")
  serving::request request;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage: a last chunk with usage
  /// `stop`: up to max_stop_sequences strings; the text ends before the first of them to appear
  /// (finish_reason "stop") and the serving peer is told to stop generating.
  std::vector<std::string> stop;
  /// Chat with `tools`: the answer is read for tool calls (mesh/http/tools.hpp).
  bool tools = false;
  /// `n`: choices asked for (1..max_choices). The gateway runs each as its own stream
  /// (choice_request), all routed to one peer, which reads their shared prompt once.
  std::uint32_t n = 1;
  /// A choice's stream: its index in `choices`, and the id the reply carries (the API request's;
  /// the stream's own id is request.id). Empty: request.id.
  std::uint32_t index = 0;
  std::string reply_id;
};

inline constexpr std::uint32_t max_choices = 8;  ///< `n`, bounded: each choice is a stream

/// Choice `i` of `r` (n > 1) as a stream of its own: id "<id>.<i>", seed + i (copies with one
/// seed would draw the same text), affinity the request's id (every choice on one peer).
[[nodiscard]] api_request choice_request(const api_request& r, std::uint32_t i);

inline constexpr std::size_t max_stop_sequences = 4;  ///< OpenAI's bound
inline constexpr std::size_t max_stop_sequence_bytes = 256;

/// Where the first of `stops` begins in `text` (std::string_view::npos: none).
[[nodiscard]] std::size_t find_stop(std::string_view text, const std::vector<std::string>& stops);
/// How many bytes at the end of `text` could be the start of one of `stops`: a stream holds them
/// back until the next token says whether a stop sequence follows.
[[nodiscard]] std::size_t stop_holdback(std::string_view text,
                                        const std::vector<std::string>& stops);

/// An error as the API answers it: HTTP status and OpenAI's error object
/// ({"error": {"message", "type", "param", "code"}}).
struct api_error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  ///< the offending field, empty when none
  std::string code;   ///< machine-readable, empty when none

  [[nodiscard]] nlohmann::json to_json() const;
};

/// Parses a body of `kind`. `id` becomes the serving request's id (unique per request; the reply
/// carries it). `seed`: used when the body names none (a resumed stream must draw the same tokens,
/// so a request always travels with a seed). Errors name the field.
[[nodiscard]] std::variant<api_request, api_error> parse_request(api_kind kind,
                                                                 std::string_view body,
                                                                 std::string id,
                                                                 std::uint64_t seed);

/// The "stop" field of `body` (absent or null: none; a string or up to max_stop_sequences
/// strings of at most max_stop_sequence_bytes; empty ones stop nothing) appended to `out`.
/// Errors name "stop" (OpenAI's body; Ollama's options object takes the same rules).
[[nodiscard]] std::optional<api_error> parse_stop(const nlohmann::json& body,
                                                  std::vector<std::string>& out);

/// A 400 naming the field `param` (shared by the OpenAI and Ollama parsers).
[[nodiscard]] api_error field_error(std::string param, std::string message);
/// A JSON value as an error message quotes it: at most 40 characters.
[[nodiscard]] std::string shown_json(const nlohmann::json& v);

/// Maps a serving failure (the client's error) to the API's status and error object.
[[nodiscard]] api_error error_of(const error& e);
/// The same for a request of `kind`: a prompt longer than the context names its field (400,
/// code context_length_exceeded, param "messages" or "prompt").
[[nodiscard]] api_error error_of(const error& e, api_kind kind);

/// "stop" for a natural end, "length" when max_tokens or the context ran out.
[[nodiscard]] std::string_view finish_reason(std::string_view stop);  // stop_sequence: "stop"

/// The non-streaming reply.
[[nodiscard]] nlohmann::json reply(const api_request& r, const serving::outcome& out,
                                   std::int64_t created_unix);

/// One streamed chunk. `text` must be complete UTF-8 (see utf8_complete_prefix). A chat stream's
/// first chunk carries the role: pass `first` = true. `finish` non-empty: the final chunk.
/// `logprobs`: the log-probabilities of the tokens whose text the chunk carries (requests that
/// asked for them).
[[nodiscard]] nlohmann::json chunk(const api_request& r, std::string_view text, bool first,
                                   std::string_view finish, std::int64_t created_unix,
                                   std::span<const serving::token_logprob> logprobs = {},
                                   std::size_t text_offset = 0);

/// OpenAI's logprobs object for `lps` (chat: {"content": [{token, logprob, bytes,
/// top_logprobs}]}; completions: {tokens, token_logprobs, top_logprobs, text_offset}); `offset`
/// is the first token's byte offset in the answer (completions).
[[nodiscard]] nlohmann::json logprobs_json(const api_request& r,
                                           std::span<const serving::token_logprob> lps,
                                           std::size_t offset = 0);
struct tool_call;
/// The last chunk of a chat stream whose answer held tool calls: the calls, finish "tool_calls".
[[nodiscard]] nlohmann::json tool_calls_chunk(const api_request& r,
                                              const std::vector<tool_call>& calls,
                                              std::int64_t created_unix);
/// The usage chunk of a stream that asked for it (choices empty).
[[nodiscard]] nlohmann::json usage_chunk(const api_request& r, std::uint32_t prompt_tokens,
                                         std::uint32_t completion_tokens,
                                         std::int64_t created_unix);

/// The `tessera` object of a reply and of a stream's last chunk: the peers that served it, in
/// order (more than one after a failover), and its attempts.
[[nodiscard]] nlohmann::json tessera_extension(const serving::outcome& out);

/// One server-sent event: "data: <json>\n\n". Invalid UTF-8 is replaced, never thrown on.
[[nodiscard]] std::string sse(const nlohmann::json& j);
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

/// The longest prefix of `bytes` that does not end inside a UTF-8 sequence. A token's bytes may
/// hold half a character; the rest comes with the next token, and a JSON string must not be cut
/// there.
[[nodiscard]] std::size_t utf8_complete_prefix(std::string_view bytes) noexcept;

/// JSON dump that replaces invalid UTF-8 instead of throwing.
[[nodiscard]] std::string dump(const nlohmann::json& j);

}  // namespace tessera::mesh::http
