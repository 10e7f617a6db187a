#include "inference/tokenizer/forced_call.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace tessera::inference::tokenizer {

namespace {

using call_json = nlohmann::ordered_json;

// The parameters schema moves under #/properties/<key> of the call's schema: its own pointers
// ("#", "#/$defs/x") are rewritten to keep pointing where they did.
void rebase_refs(call_json& j, const std::string& base) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "$ref" && it->is_string()) {
        const auto ref = it->get<std::string>();
        if (ref.starts_with("#")) *it = "#" + base + ref.substr(1);
      } else {
        rebase_refs(*it, base);
      }
    }
  } else if (j.is_array()) {
    for (auto& e : j)
      rebase_refs(e, base);
  }
}

// The schema of one call of `f`: {"name": its name, <arguments key>: its parameters}, placed at
// JSON pointer `at` of the whole call schema. A tool without parameters takes none (OpenAI:
// "omitting parameters defines a function with an empty parameter list").
result<call_json> call_schema(const call_json& f, const tool_call_syntax& syntax,
                              const std::string& at) {
  call_json arguments = call_json{
      {"type", "object"}, {"properties", call_json::object()}, {"additionalProperties", false}};
  const auto name = f["name"].get<std::string>();
  if (f.contains("parameters") && f["parameters"].is_object()) {
    arguments = f["parameters"];
    // Checked on its own first, so that the error points into the client's own schema.
    if (auto c = json_schema::compile(arguments.dump()); !c)
      return make_error(errc::invalid_argument, "field 'tools': the parameters of tool '{}': {}",
                        name, c.error().message);
    rebase_refs(arguments, at + "/properties/" + syntax.arguments_key);
  }
  return call_json{
      {"type", "object"},
      {"properties", {{"name", call_json{{"const", name}}}, {syntax.arguments_key, arguments}}},
      {"required", call_json::array({"name", syntax.arguments_key})},
      {"additionalProperties", false}};
}

}  // namespace

tool_call_syntax tool_call_syntax_of(std::string_view src) {
  tool_call_syntax s;
  if (src.find("<tool_call>") != std::string_view::npos) {
    s.opening = "<tool_call>\n";
  } else if (src.find("[TOOL_CALLS]") != std::string_view::npos) {
    s.opening = "[TOOL_CALLS] [";
  } else if (src.find("\"parameters\": ") != std::string_view::npos ||
             src.find("<|python_tag|>") != std::string_view::npos) {
    s.arguments_key = "parameters";  // Llama 3.x prints {"name": ..., "parameters": ...}
  }
  return s;
}

result<forced_call> force_tool_call(std::string_view tools_json, std::string_view name,
                                    const tool_call_syntax& syntax) {
  const call_json tools = call_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  if (tools.is_discarded() || !tools.is_array() || tools.empty())
    return make_error(errc::invalid_argument,
                      "field 'tools': a forced call needs a non-empty array of tools");
  call_json names = call_json::array();
  const call_json* chosen = nullptr;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const call_json& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string())
      return make_error(errc::invalid_argument, "field 'tools': tools[{}] names no function", i);
    const call_json& f = t["function"];
    const auto n = f["name"].get<std::string>();
    // A call names its tool: two of one name could not be told apart.
    for (std::size_t j = 0; j < names.size(); ++j)
      if (names[j] == n)
        return make_error(errc::invalid_argument,
                          "field 'tools': tools[{}] and tools[{}] are both named '{}'", j, i,
                          n.substr(0, 64));
    names.push_back(n);
    if (name.empty() || n != name) continue;
    chosen = &f;
  }
  if (!name.empty() && chosen == nullptr)
    return make_error(errc::invalid_argument,
                      "field 'tool_name': no tool named '{}' in 'tools' ({})",
                      std::string(name.substr(0, 64)), names.dump());
  // With one tool, "required" is that tool by name.
  if (chosen == nullptr && tools.size() == 1) chosen = &tools[0]["function"];
  call_json schema;
  if (chosen != nullptr) {
    auto one = call_schema(*chosen, syntax, "");
    if (!one) return one.error();
    schema = std::move(*one);
  } else {
    // "required" with several tools: a tagged union of the calls, the name first, so that once
    // the model has written a name its arguments follow that tool's parameters.
    schema = call_json{{"oneOf", call_json::array()}};
    for (std::size_t i = 0; i < tools.size(); ++i) {
      auto one = call_schema(tools[i]["function"], syntax, fmt::format("/oneOf/{}", i));
      if (!one) return one.error();
      schema["oneOf"].push_back(std::move(*one));
    }
  }
  auto c = json_schema::compile(schema.dump());
  if (!c)
    return make_error(errc::invalid_argument, "field 'tools': the forced call's schema: {}",
                      c.error().message);
  return forced_call{syntax.opening, std::move(*c)};
}

}  // namespace tessera::inference::tokenizer
