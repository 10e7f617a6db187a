#include "mesh/http/tools.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "inference/tokenizer/forced_call.hpp"

namespace tessera::mesh::http {

namespace {

using json = nlohmann::json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistral = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// One call from {"name": ..., "arguments"|"parameters": {...}}; nullopt when it is not one.
std::optional<tool_call> call_of(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (name.empty()) return std::nullopt;
  json args = json::object();
  if (j.contains("arguments")) args = j["arguments"];
  else if (j.contains("parameters")) args = j["parameters"];
  // Some models write the arguments as a JSON string already.
  std::string text = args.is_string() ? args.get<std::string>() : args.dump();
  return tool_call{name, std::move(text)};
}

std::optional<json> parse_json(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

}  // namespace

std::optional<api_error> parse_tools(const json& body, const nlohmann::ordered_json& ordered_body,
                                     api_request& out) {
  auto choice = body.find("tool_choice");
  bool none = false;
  std::string forced, forced_name;  // the protocol's tool_choice and tool_name
  if (choice != body.end() && !choice->is_null()) {
    if (choice->is_object()) {
      const auto f = choice->find("function");
      if (choice->value("type", "") != "function" || f == choice->end() || !f->is_object() ||
          !f->contains("name") || !(*f)["name"].is_string() ||
          (*f)["name"].get<std::string>().empty())
        return field_error("tool_choice",
                           fmt::format("'tool_choice' is {}; name a function as {{\"type\": "
                                       "\"function\", \"function\": {{\"name\": ...}}}}",
                                       shown_json(*choice)));
      forced = "function";
      forced_name = (*f)["name"].get<std::string>();
    } else if (!choice->is_string()) {
      return field_error("tool_choice",
                         fmt::format("'tool_choice' is {}; use \"auto\", \"none\", "
                                     "\"required\" or a function",
                                     shown_json(*choice)));
    } else {
      const std::string c = choice->get<std::string>();
      if (c != "auto" && c != "none" && c != "required")
        return field_error("tool_choice",
                           fmt::format("'tool_choice' is {}; use \"auto\", \"none\", "
                                       "\"required\" or a function",
                                       shown_json(*choice)));
      none = c == "none";
      if (c == "required") forced = "required";
    }
  }
  auto tools = body.find("tools");
  if (tools == body.end() || tools->is_null()) {
    if (!forced.empty())
      return field_error("tool_choice", "'tool_choice' asks for a call, and there are no 'tools'");
    return std::nullopt;
  }
  if (!tools->is_array())
    return field_error("tools", "'tools' must be an array of {\"type\": \"function\", ...}");
  if (tools->size() > max_tools)
    return field_error("tools", fmt::format("'tools' holds {} tools, at most {}", tools->size(),
                                            max_tools));
  for (std::size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string where = fmt::format("tools[{}]", i);
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
        !t["function"].is_object())
      return field_error(where, fmt::format("'{}' must be {{\"type\": \"function\", \"function\": "
                                            "{{\"name\", ...}}}}",
                                            where));
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      return field_error(where + ".function.name",
                         fmt::format("'{}.function.name' must be a non-empty string", where));
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      return field_error(where + ".function.parameters",
                         fmt::format("'{}.function.parameters' must be a JSON schema object", where));
  }
  if (!forced_name.empty()) {
    const bool known = std::any_of(tools->begin(), tools->end(), [&](const json& t) {
      return t["function"]["name"].get<std::string>() == forced_name;
    });
    if (!known)
      return field_error("tool_choice", fmt::format("'tool_choice' names function '{}', which "
                                                    "'tools' does not hold",
                                                    forced_name.substr(0, 64)));
  }
  if (!forced.empty() && tools->empty())
    return field_error("tool_choice", "'tool_choice' asks for a call, and 'tools' is empty");
  if (none || tools->empty()) return std::nullopt;
  std::string text = ordered_body.at("tools").dump();
  if (text.size() > max_tools_bytes)
    return field_error("tools", fmt::format("'tools' is {} bytes of JSON, at most {}", text.size(),
                                            max_tools_bytes));
  if (!forced.empty()) {
    // The peer builds the call's grammar from the tool's parameters: one it cannot follow is
    // this request's 400, naming the keyword and where it is (the key name does not matter here).
    if (auto fc = inference::tokenizer::force_tool_call(text, forced_name, {}); !fc)
      return field_error("tools", fc.error().message);
  }
  out.request.tools = std::move(text);
  out.request.tool_choice = std::move(forced);
  out.request.tool_name = std::move(forced_name);
  out.tools = true;
  return std::nullopt;
}

parsed_answer parse_tool_calls(std::string_view answer) {
  parsed_answer out;
  // Hermes / Qwen: <tool_call> blocks; the text outside them is the content.
  if (answer.find(kHermesOpen) != std::string_view::npos) {
    std::string content;
    std::vector<tool_call> calls;
    std::size_t pos = 0;
    bool all = true;
    while (pos < answer.size()) {
      const std::size_t open = answer.find(kHermesOpen, pos);
      if (open == std::string_view::npos) {
        content += answer.substr(pos);
        break;
      }
      content += answer.substr(pos, open - pos);
      const std::size_t body = open + kHermesOpen.size();
      std::size_t close = answer.find(kHermesClose, body);
      const std::size_t end = close == std::string_view::npos ? answer.size() : close;
      auto j = parse_json(trim(answer.substr(body, end - body)));
      auto c = j ? call_of(*j) : std::nullopt;
      if (!c) {
        all = false;
        break;
      }
      calls.push_back(std::move(*c));
      pos = close == std::string_view::npos ? answer.size() : close + kHermesClose.size();
    }
    if (all && !calls.empty()) {
      out.content = std::string(trim(content));
      out.calls = std::move(calls);
      return out;
    }
  }
  // Mistral: [TOOL_CALLS] then an array of calls (or one).
  if (const auto at = answer.find(kMistral); at != std::string_view::npos) {
    if (auto j = parse_json(trim(answer.substr(at + kMistral.size())))) {
      std::vector<tool_call> calls;
      bool all = true;
      for (const auto& e : j->is_array() ? *j : json::array({*j})) {
        auto c = call_of(e);
        if (!c) {
          all = false;
          break;
        }
        calls.push_back(std::move(*c));
      }
      if (all && !calls.empty()) {
        out.content = std::string(trim(answer.substr(0, at)));
        out.calls = std::move(calls);
        return out;
      }
    }
  }
  // Llama 3.x: the whole answer is one call (after <|python_tag|> or not).
  std::string_view whole = trim(answer);
  if (whole.starts_with(kPythonTag)) whole = trim(whole.substr(kPythonTag.size()));
  if (whole.starts_with("{")) {
    if (auto j = parse_json(whole)) {
      if (auto c = call_of(*j)) {
        out.calls.push_back(std::move(*c));
        return out;
      }
    }
  }
  out.content = std::string(answer);
  return out;
}

std::size_t tool_holdback_from(std::string_view answer) {
  // A call at the start (Llama's JSON, Mistral's tag, the python tag): hold from the start as
  // long as the answer so far could still be one.
  const std::string_view head = trim(answer);
  const auto could_begin = [&](std::string_view marker) {
    return head.size() <= marker.size() ? marker.starts_with(head) : head.starts_with(marker);
  };
  if (head.empty() || head.front() == '{' || could_begin(kMistral) || could_begin(kPythonTag) ||
      could_begin(kHermesOpen))
    return 0;
  // Hermes anywhere: from its tag, or from a tail that may be the tag's beginning.
  if (const auto at = answer.find(kHermesOpen); at != std::string_view::npos) return at;
  if (const auto at = answer.find(kMistral); at != std::string_view::npos) return at;
  for (std::size_t k = std::min(answer.size(), kHermesOpen.size() - 1); k > 0; --k) {
    const std::string_view tail = answer.substr(answer.size() - k);
    if (kHermesOpen.starts_with(tail) || kMistral.starts_with(tail)) return answer.size() - k;
  }
  return std::string_view::npos;
}

json tool_calls_json(const std::vector<tool_call>& calls, std::string_view request_id,
                     bool with_index) {
  json out = json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    json c{{"id", fmt::format("call-{}-{}", request_id, i)},
           {"type", "function"},
           {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace tessera::mesh::http
