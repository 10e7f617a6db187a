// Ollama's API on the HTTP gateway (docs/HTTP.md, "Ollama API"): many editors and chat UIs speak
// only this one. The same serving client runs the request; these pure functions turn Ollama's
// bodies into an api_request and outcomes into Ollama's objects.
//
//   POST /api/generate  {model, prompt, system?, raw?, stream?, options?}  -> "response" pieces
//   POST /api/chat      {model, messages, stream?, options?}               -> "message" pieces
//   GET  /api/tags, POST /api/show, GET /api/version
//
// Streaming is on by default, as in Ollama: one JSON object per line (application/x-ndjson), a
// last one with "done": true, the done_reason and the counts and durations. Errors are
// {"error": "..."} with the HTTP status, or one such line once a stream has begun.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "mesh/http/openai.hpp"
#include "mesh/serving/follower.hpp"

namespace tessera::mesh::http {

/// Ollama's defaults where its request names none (its documented option defaults).
inline constexpr float ollama_default_temperature = 0.8f;
inline constexpr std::int32_t ollama_default_top_k = 40;
inline constexpr float ollama_default_top_p = 0.9f;
inline constexpr float ollama_default_repeat_penalty = 1.1f;

/// Parses an Ollama body. A model named "name:latest" is the model "name". `num_predict` -1 or -2
/// (to the end of the context) and values above the serving limit ask for the limit. Refused, the
/// field named: images, format (structured output), template, context, tools, suffix, a tool role.
/// Options Tessera has no use for (num_ctx, num_thread, mirostat, ...) are ignored, as Ollama
/// ignores what a model does not use. `empty_prompt` is set for /api/generate with an empty
/// prompt: Ollama answers that (a "load the model" call) at once with an empty response.
/// `dialect`: ollama_generate or ollama_chat (it says which of Ollama's shapes the answers take).
[[nodiscard]] std::variant<api_request, api_error> parse_ollama(api_dialect dialect,
                                                                std::string_view body,
                                                                std::string id, std::uint64_t seed,
                                                                bool* empty_prompt = nullptr);

/// RFC 3339 UTC with microseconds ("2026-11-29T17:14:47.123456Z"), as Ollama's created_at.
[[nodiscard]] std::string rfc3339_now();

/// One streamed piece: {"model", "created_at", "response"|"message", "done": false}.
[[nodiscard]] nlohmann::json ollama_chunk(const api_request& r, std::string_view text,
                                          const std::string& created_at);

/// The last object: done true, done_reason ("stop" | "length"), prompt_eval_count, eval_count
/// and the durations (ns); `text` is the whole answer for a non-streaming request, "" after a
/// stream.
[[nodiscard]] nlohmann::json ollama_final(const api_request& r, const serving::outcome& out,
                                          std::string_view text, std::string_view done_reason,
                                          const std::string& created_at);

/// {"error": message}.
[[nodiscard]] nlohmann::json ollama_error(const api_error& e);

/// /api/tags from the gateway's model list (entries with "id", and "bytes" / "content" when this
/// peer knows them).
[[nodiscard]] nlohmann::json ollama_tags(const nlohmann::json& models);

/// The model name Ollama clients send for `name` ("tiny:latest" -> "tiny").
[[nodiscard]] std::string ollama_model_name(std::string_view name);

}  // namespace tessera::mesh::http
