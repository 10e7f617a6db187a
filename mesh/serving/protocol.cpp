#include "mesh/serving/protocol.hpp"

#include <cmath>
#include <cstdint>
#include <span>

#include <fmt/format.h>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/random.hpp"

namespace tessera::mesh::serving {

std::string_view to_string(response_kind k) noexcept {
  switch (k) {
    case response_kind::accepted:
      return "accepted";
    case response_kind::token:
      return "token";
    case response_kind::done:
      return "done";
    case response_kind::error:
      return "error";
  }
  return "?";
}

std::string response_topic(std::string_view id) {
  std::string t(id);
  t.push_back(':');
  return t;
}

result<std::string> random_request_id(std::string_view prefix) {
  std::uint64_t words[2] = {0, 0};
  TESSERA_TRY(fill_random(std::as_writable_bytes(std::span(words))));
  return fmt::format("{}{:016x}{:016x}", prefix, words[0], words[1]);
}

bool valid_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > max_id_bytes) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

namespace {

template <class T>
std::string encode_any(const T& v) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, v);
  return std::string(buf.data(), buf.size());
}

template <class T>
result<T> decode_any(std::string_view bytes, std::string_view what) {
  if (bytes.size() > max_message_bytes)
    return make_error(errc::invalid_argument, "{} of {} bytes exceeds the bound of {} bytes", what,
                      bytes.size(), max_message_bytes);
  try {
    auto oh = tessera::bounded_unpack(bytes.data(), bytes.size());
    if (oh.get().type != msgpack::type::MAP)
      return make_error(errc::invalid_argument, "{} is not a msgpack map", what);
    T v;
    oh.get().convert(v);
    return v;
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, "{} does not decode: {}", what, e.what());
  }
}

}  // namespace

std::string encode(const request& r) {
  return encode_any(r);
}
std::string encode(const response& r) {
  return encode_any(r);
}

result<request> decode_request(std::string_view bytes) {
  return decode_any<request>(bytes, "request");
}
result<response> decode_response(std::string_view bytes) {
  return decode_any<response>(bytes, "response");
}

result<void> validate(const request& r) {
  if (r.v != protocol_version)
    return make_error(errc::unsupported, "request protocol version {} (this peer speaks {})", r.v,
                      protocol_version);
  if (!valid_id(r.id))
    return make_error(errc::invalid_argument, "field 'id': must be 1..{} bytes of [A-Za-z0-9_.-]",
                      max_id_bytes);
  if (!r.affinity.empty() && !valid_id(r.affinity))
    return make_error(errc::invalid_argument,
                      "field 'affinity': must be empty or 1..{} bytes of [A-Za-z0-9_.-]",
                      max_id_bytes);
  if (r.model.empty() || r.model.size() > max_model_bytes)
    return make_error(errc::invalid_argument, "field 'model': must be 1..{} bytes",
                      max_model_bytes);
  if (r.prompt.empty() == r.messages.empty())
    return make_error(errc::invalid_argument,
                      "give exactly one of 'prompt' (completion) and 'messages' (chat)");
  std::size_t text = r.prompt.size();
  if (r.messages.size() > max_messages)
    return make_error(errc::invalid_argument, "field 'messages': {} messages, at most {}",
                      r.messages.size(), max_messages);
  for (const auto& m : r.messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      return make_error(errc::invalid_argument,
                        "field 'messages': role '{}' (expected system, user, assistant or tool)",
                        m.role.substr(0, 32));
    text += m.content.size() + m.tool_calls.size();
  }
  if (text > max_prompt_bytes)
    return make_error(errc::invalid_argument, "the prompt has {} bytes, at most {}", text,
                      max_prompt_bytes);
  if (r.max_tokens == 0 || r.max_tokens > max_tokens_limit)
    return make_error(errc::invalid_argument, "field 'max_tokens': {} (expected 1..{})",
                      r.max_tokens, max_tokens_limit);
  if (r.resume.size() > r.max_tokens)
    return make_error(errc::invalid_argument,
                      "field 'resume': {} tokens, more than max_tokens ({})", r.resume.size(),
                      r.max_tokens);
  if (r.top_k < 0)
    return make_error(errc::invalid_argument, "field 'top_k': {} (expected >= 0; 0 = off)",
                      r.top_k);
  if (r.attempt > max_attempt)
    return make_error(errc::invalid_argument, "field 'attempt': {} (at most {})", r.attempt,
                      max_attempt);
  for (auto t : r.resume)
    if (t < 0) return make_error(errc::invalid_argument, "field 'resume': negative token id {}", t);
  if (!std::isfinite(r.temperature) || r.temperature > 100.0f)
    return make_error(errc::invalid_argument, "field 'temperature': {} (expected <= 100)",
                      r.temperature);
  if (!(r.top_p >= 0.0f && r.top_p <= 1.0f))
    return make_error(errc::invalid_argument, "field 'top_p': {} (expected 0..1)", r.top_p);
  if (!(r.min_p >= 0.0f && r.min_p <= 1.0f))
    return make_error(errc::invalid_argument, "field 'min_p': {} (expected 0..1)", r.min_p);
  if (r.top_logprobs < -1 || r.top_logprobs > max_top_logprobs)
    return make_error(errc::invalid_argument, "field 'top_logprobs': {} (expected -1 to {})",
                      r.top_logprobs, max_top_logprobs);
  for (auto [name, v] : {std::pair{"frequency_penalty", r.frequency_penalty},
                         std::pair{"presence_penalty", r.presence_penalty}})
    if (!(v >= -2.0f && v <= 2.0f))
      return make_error(errc::invalid_argument, "field '{}': {} (expected -2 to 2)", name, v);
  if (!r.format.empty() && r.format != "json_object" && r.format != "json_schema")
    return make_error(errc::invalid_argument,
                      "field 'format': '{}' (expected json_object, json_schema or none)",
                      r.format.substr(0, 32));
  if ((r.format == "json_schema") != !r.schema.empty())
    return make_error(errc::invalid_argument,
                      "field 'schema': given {}, format '{}' (a schema goes with json_schema only)",
                      r.schema.empty() ? "none" : "one", r.format.substr(0, 32));
  if (r.schema.size() > max_schema_bytes)
    return make_error(errc::invalid_argument, "field 'schema': {} bytes, at most {}",
                      r.schema.size(), max_schema_bytes);
  if (!r.tool_choice.empty() && r.tool_choice != "required" && r.tool_choice != "function")
    return make_error(errc::invalid_argument,
                      "field 'tool_choice': '{}' (expected required, function or none)",
                      r.tool_choice.substr(0, 32));
  if ((r.tool_choice == "function") != !r.tool_name.empty())
    return make_error(errc::invalid_argument,
                      "field 'tool_name': given {}, tool_choice '{}' (a name goes with function "
                      "only)",
                      r.tool_name.empty() ? "none" : "one", r.tool_choice);
  if (r.tool_name.size() > max_model_bytes)
    return make_error(errc::invalid_argument, "field 'tool_name': {} bytes, at most {}",
                      r.tool_name.size(), max_model_bytes);
  if (!r.tool_choice.empty() && (r.tools.empty() || r.messages.empty()))
    return make_error(errc::invalid_argument,
                      "field 'tool_choice': a forced call needs 'tools' and chat 'messages'");
  if (!r.tool_choice.empty() && !r.format.empty())
    return make_error(errc::invalid_argument,
                      "field 'format': '{}' with a forced tool call (the call is the answer's "
                      "format)",
                      r.format.substr(0, 32));
  if (!(r.repeat_penalty > 0.0f) || !std::isfinite(r.repeat_penalty))
    return make_error(errc::invalid_argument, "field 'repeat_penalty': {} (expected > 0)",
                      r.repeat_penalty);
  return ok();
}

}  // namespace tessera::mesh::serving
