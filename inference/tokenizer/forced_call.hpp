// A tool call the client requires (OpenAI's `tool_choice: "required"` or a named function): the
// answer is constrained to be one call, written the way the model's chat template writes calls.
//
// The call's opening marker (Hermes' `<tool_call>\n`, Mistral's `[TOOL_CALLS] [`; none for
// Llama 3's bare object) is read as the end of the prompt, so the model continues inside the call
// it was trained to write; its answer is then the call's JSON object, {"name": ..., "arguments":
// {...}} ("parameters" for Llama 3, as its template prints calls), constrained by a JSON Schema
// compiled as any response_format schema is (json_schema.hpp): the name is one of the tools', and
// the arguments are the named tool's parameters schema. With "required" and several tools the
// schema is a tagged union of their calls (json_schema.hpp): the name comes first, and the
// arguments then follow that tool's parameters. A tool without parameters takes none ({}).
#pragma once

#include <string>
#include <string_view>

#include "actors/base/result.hpp"
#include "inference/tokenizer/json_schema.hpp"

namespace tessera::inference::tokenizer {

/// How a chat template writes a call (sniffed from the template's text).
struct tool_call_syntax {
  std::string opening;                      ///< the marker before the call's JSON ("" none)
  std::string arguments_key = "arguments";  ///< the key of the call's arguments
};

/// The syntax of a template's calls: Hermes/Qwen (`<tool_call>`), Mistral (`[TOOL_CALLS]`),
/// Llama 3 ("parameters", no marker), else a bare {"name", "arguments"} object.
[[nodiscard]] tool_call_syntax tool_call_syntax_of(std::string_view jinja_source);

struct forced_call {
  std::string opening;  ///< appended to the rendered prompt
  json_schema schema;   ///< what the answer is constrained to
};

/// The forced call for `tools_json` (OpenAI's tools array), calling `name` ("" any of them).
/// Errors name the request field: 'tool_name' for a tool the array does not hold, 'tools' for a
/// tool whose parameters the grammar cannot follow (the keyword and where it is).
[[nodiscard]] result<forced_call> force_tool_call(std::string_view tools_json,
                                                  std::string_view name,
                                                  const tool_call_syntax& syntax);

}  // namespace tessera::inference::tokenizer
