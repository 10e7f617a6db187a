// Tool calls (OpenAI's `tools`): what a request may carry, and the calls a model writes in its
// answer. Pure: JSON in, JSON and parsed calls out (mesh/http/gateway_stream.cpp streams them).
//
// The tools and the conversation's earlier calls and results reach the model through its own
// chat template (inference/tokenizer/jinja.hpp): the template says how that model was trained to
// see them. The model's answer is read back in the formats the published templates ask for:
//   Hermes / Qwen 2.5 / Qwen 3   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any
//                                number, after some text or none;
//   Mistral                      [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...];
//   Llama 3.x                    the whole answer one {"name": ..., "parameters": {...}} object
//                                (after <|python_tag|> or not).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mesh/http/openai.hpp"

namespace tessera::mesh::http {

inline constexpr std::size_t max_tools = 64;
inline constexpr std::size_t max_tools_bytes = 64 * 1024;  ///< the tools array as JSON text

/// `tools` and `tool_choice` of a chat body: checked, and the tools (in the client's key order,
/// from `ordered_body`) put into the serving request; `out.tools` says whether the answer is to
/// be read for calls. `tool_choice` "none" sends no tools; "required" and a named function force
/// a call (the request's tool_choice / tool_name: the peer constrains the answer to one call,
/// inference/tokenizer/forced_call.hpp).
[[nodiscard]] std::optional<api_error> parse_tools(const nlohmann::json& body,
                                                   const nlohmann::ordered_json& ordered_body,
                                                   api_request& out);

struct tool_call {
  std::string name;
  std::string arguments;  ///< JSON text, as OpenAI's API carries it
};

/// What an answer holds: the text outside the calls, and the calls (none: an ordinary answer).
struct parsed_answer {
  std::string content;
  std::vector<tool_call> calls;
};
[[nodiscard]] parsed_answer parse_tool_calls(std::string_view answer);

/// Where a streamed answer must start holding its text back because a tool call may begin there
/// (std::string_view::npos: nowhere yet). The held text goes out as content if the answer turns
/// out to hold no call.
[[nodiscard]] std::size_t tool_holdback_from(std::string_view answer);

/// OpenAI's tool_calls array for `calls`; ids are `<request id>-<index>`.
[[nodiscard]] nlohmann::json tool_calls_json(const std::vector<tool_call>& calls,
                                             std::string_view request_id, bool with_index);

}  // namespace tessera::mesh::http
