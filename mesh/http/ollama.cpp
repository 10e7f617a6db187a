#include "mesh/http/ollama.hpp"

#include "mesh/http/tools.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>

#include <fmt/format.h>

#include "inference/tokenizer/json_schema.hpp"

namespace tessera::mesh::http {
namespace {

using json = nlohmann::json;

bool present(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return false;
  if ((it->is_string() || it->is_array() || it->is_object()) && it->empty()) return false;
  return !(it->is_boolean() && !it->get<bool>());
}

/// A number option in [lo, hi]; absent or null leaves `out` alone.
std::optional<api_error> real(const json& o, const char* key, double lo, double hi, float& out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || !(it->get<double>() >= lo && it->get<double>() <= hi))
    return field_error(std::string("options.") + key,
                       fmt::format("'options.{}' must be a number from {} to {}, got {}", key, lo,
                                   hi, shown_json(*it)));
  out = static_cast<float>(it->get<double>());
  return std::nullopt;
}

std::optional<api_error> whole(const json& o, const char* key, std::int64_t lo, std::int64_t hi,
                               std::int64_t& out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<std::int64_t>() < lo || it->get<std::int64_t>() > hi)
    return field_error(std::string("options.") + key,
                       fmt::format("'options.{}' must be an integer from {} to {}, got {}", key, lo,
                                   hi, shown_json(*it)));
  out = it->get<std::int64_t>();
  return std::nullopt;
}

std::optional<api_error> parse_options(const json& body, api_request& out) {
  serving::request& r = out.request;
  auto it = body.find("options");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return field_error("options", "'options' must be an object");
  const json& o = *it;
  if (auto e = real(o, "temperature", 0, 2, r.temperature)) return e;
  if (auto e = real(o, "top_p", 0, 1, r.top_p)) return e;
  if (auto e = real(o, "min_p", 0, 1, r.min_p)) return e;
  if (auto e = real(o, "repeat_penalty", 0.01, 10, r.repeat_penalty)) return e;
  if (auto e = real(o, "frequency_penalty", -2, 2, r.frequency_penalty)) return e;
  if (auto e = real(o, "presence_penalty", -2, 2, r.presence_penalty)) return e;
  std::int64_t v = 0;
  if (o.contains("top_k") && !o["top_k"].is_null()) {
    if (auto e = whole(o, "top_k", 0, 1 << 20, v)) return e;
    r.top_k = static_cast<std::int32_t>(v);
  }
  if (o.contains("seed") && !o["seed"].is_null()) {
    if (auto e = whole(o, "seed", std::numeric_limits<std::int64_t>::min(),
                       std::numeric_limits<std::int64_t>::max(), v))
      return e;
    r.seed = static_cast<std::uint64_t>(v);
  }
  if (o.contains("num_predict") && !o["num_predict"].is_null()) {
    if (auto e = whole(o, "num_predict", -2, std::numeric_limits<std::int32_t>::max(), v)) return e;
    if (v == 0)
      return field_error("options.num_predict", "'options.num_predict' is 0: nothing to do");
    // -1 (until the model stops) and -2 (fill the context): as far as a request may go.
    r.max_tokens = v < 0 || v > serving::max_tokens_limit ? serving::max_tokens_limit
                                                          : static_cast<std::uint32_t>(v);
  }
  // The OpenAI parser's rules (a string or up to four), its errors naming options.stop.
  if (auto err = parse_stop(o, out.stop)) {
    err->param = "options.stop";
    err->message = "'options." + err->message.substr(1);
    return err;
  }
  return std::nullopt;
}

std::optional<api_error> parse_chat(const json& body, serving::request& r) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    return field_error("messages",
                       "'messages' must be a non-empty array of {\"role\", \"content\"}");
  if (it->size() > serving::max_messages)
    return field_error("messages", fmt::format("'messages' holds {} messages, at most {}",
                                               it->size(), serving::max_messages));
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return field_error(where, fmt::format("'{}' must be an object", where));
    const auto role = m.value("role", json(nullptr));
    if (!role.is_string() ||
        (role != "system" && role != "user" && role != "assistant" && role != "tool"))
      return field_error(where + ".role",
                         fmt::format("'{}.role' must be system, user, assistant or tool, got {}",
                                     where, shown_json(role)));
    if (present(m, "images"))
      return field_error(where + ".images",
                         fmt::format("'{}.images': Tessera serves text models", where));
    const auto content = m.value("content", json(""));
    if (!content.is_string() && !content.is_null())
      return field_error(where + ".content", fmt::format("'{}.content' must be a string", where));
    serving::chat_message msg;
    msg.role = role.get<std::string>();
    msg.content = content.is_string() ? content.get<std::string>() : std::string();
    // An assistant's earlier calls, in OpenAI's shape for the template (Ollama's arguments are an
    // object already: the template takes it as it is).
    if (present(m, "tool_calls")) {
      const json& tc = m["tool_calls"];
      if (msg.role != "assistant" || !tc.is_array())
        return field_error(
            where + ".tool_calls",
            fmt::format("'{}.tool_calls' must be an array, on an assistant message", where));
      json calls = json::array();
      for (std::size_t k = 0; k < tc.size(); ++k) {
        const json& f = tc[k].value("function", json(nullptr));
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
          return field_error(fmt::format("{}.tool_calls[{}]", where, k),
                             fmt::format("'{}.tool_calls[{}]' must be {{\"function\": "
                                         "{{\"name\", \"arguments\"}}}}",
                                         where, k));
        calls.push_back(
            {{"type", "function"},
             {"function",
              {{"name", f["name"]}, {"arguments", f.value("arguments", json::object())}}}});
      }
      if (!calls.empty()) msg.tool_calls = calls.dump();
    }
    for (const char* key : {"tool_name", "name"})
      if (m.contains(key) && m[key].is_string()) msg.name = m[key].get<std::string>();
    r.messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

}  // namespace

std::string ollama_model_name(std::string_view name) {
  constexpr std::string_view latest = ":latest";
  if (name.size() > latest.size() && name.ends_with(latest)) name.remove_suffix(latest.size());
  return std::string(name);
}

std::variant<api_request, api_error> parse_ollama(api_dialect dialect, std::string_view body_text,
                                                  std::string id, std::uint64_t seed,
                                                  bool* empty_prompt) {
  json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return field_error("", "the request body is not valid JSON");
  if (!body.is_object()) return field_error("", "the request body must be a JSON object");
  api_request out;
  out.dialect = dialect;
  out.stream = true;  // Ollama streams unless told not to
  serving::request& r = out.request;
  r.id = std::move(id);
  r.seed = seed;
  r.temperature = ollama_default_temperature;
  r.top_k = ollama_default_top_k;
  r.top_p = ollama_default_top_p;
  r.min_p = 0.0f;
  r.repeat_penalty = ollama_default_repeat_penalty;
  r.max_tokens = serving::max_tokens_limit;  // num_predict -1: until the model stops
  auto model = body.find("model");
  if (model == body.end() || !model->is_string() || model->get<std::string>().empty())
    return field_error("model", "'model' must name a model (GET /api/tags lists them)");
  out.model_as_sent = model->get<std::string>();
  r.model = ollama_model_name(out.model_as_sent);
  if (r.model.size() > serving::max_model_bytes)
    return field_error("model", fmt::format("'model' is {} bytes, at most {}", r.model.size(),
                                            serving::max_model_bytes));
  for (auto [key, what] : {std::pair{"images", "Tessera serves text models"},
                           {"template", "the model's own chat template is used"},
                           {"context", "pass the conversation in messages (/api/chat) instead"},
                           {"suffix", "insertion is not supported"}})
    if (present(body, key))
      return field_error(key, fmt::format("'{}' is not supported by Tessera ({})", key, what));
  // "format": "json" is a JSON object, a JSON schema (an object) a value that satisfies it, both
  // by constrained decoding; a schema the grammar cannot follow is refused naming the keyword.
  if (present(body, "format")) {
    const auto& f = body["format"];
    if (f.is_string() && f.get<std::string>() == "json") {
      r.format = "json_object";
    } else if (f.is_object()) {
      std::string text = f.dump();
      if (text.size() > serving::max_schema_bytes)
        return field_error("format", fmt::format("'format' is a schema of {} bytes, at most {}",
                                                 text.size(), serving::max_schema_bytes));
      if (auto compiled = inference::tokenizer::json_schema::compile(text); !compiled)
        return field_error("format", fmt::format("'format': {}", compiled.error().message));
      r.format = "json_schema";
      r.schema = std::move(text);
    } else {
      return field_error("format", "'format' must be \"json\" or a JSON schema (an object)");
    }
  }
  if (dialect != api_dialect::ollama_chat && present(body, "tools"))
    return field_error("tools", "'tools' is not supported by /api/generate (use /api/chat)");
  if (dialect == api_dialect::ollama_chat && present(body, "tools")) {
    // The tools go to the model's template in the client's own key order (mesh/http/tools.hpp).
    const auto ordered = nlohmann::ordered_json::parse(body_text, nullptr, false);
    if (auto e = parse_tools(body, ordered, out)) return *e;
  }
  if (dialect == api_dialect::ollama_chat) {
    out.kind = api_kind::chat;
    if (auto e = parse_chat(body, r)) return *e;
  } else {
    auto p = body.find("prompt");
    if (p != body.end() && !p->is_null() && !p->is_string())
      return field_error("prompt", "'prompt' must be a string");
    const std::string prompt = p == body.end() || p->is_null() ? "" : p->get<std::string>();
    if (empty_prompt != nullptr) *empty_prompt = prompt.empty();
    auto sys = body.find("system");
    if (sys != body.end() && !sys->is_null() && !sys->is_string())
      return field_error("system", "'system' must be a string");
    auto raw = body.find("raw");
    if (raw != body.end() && !raw->is_null() && !raw->is_boolean())
      return field_error("raw", "'raw' must be true or false");
    if (raw != body.end() && raw->is_boolean() && raw->get<bool>()) {
      // raw: the prompt as it is, no template.
      out.kind = api_kind::completion;
      r.prompt = prompt.empty() ? " " : prompt;
    } else {
      // As Ollama: the prompt is a user turn in the model's template, after the system text.
      out.kind = api_kind::chat;
      if (sys != body.end() && sys->is_string() && !sys->get<std::string>().empty())
        r.messages.push_back({"system", sys->get<std::string>()});
      r.messages.push_back({"user", prompt});
    }
  }
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return field_error("stream", "'stream' must be true or false");
    out.stream = it->get<bool>();
  }
  if (auto e = parse_options(body, out)) return *e;
  if (auto v = serving::validate(r); !v) return field_error("", v.error().message);
  return out;
}

std::string rfc3339_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1'000'000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, us);
}

json ollama_chunk(const api_request& r, std::string_view text, const std::string& created_at) {
  json j{{"model", r.model_as_sent}, {"created_at", created_at}};
  if (r.dialect == api_dialect::ollama_chat)
    j["message"] = {{"role", "assistant"}, {"content", std::string(text)}};
  else
    j["response"] = std::string(text);
  j["done"] = false;
  return j;
}

json ollama_tool_calls(const std::vector<tool_call>& calls) {
  json out = json::array();
  for (const auto& c : calls) {
    json args = json::parse(c.arguments, nullptr, false);
    out.push_back(
        {{"function",
          {{"name", c.name}, {"arguments", args.is_discarded() ? json::object() : args}}}});
  }
  return out;
}

json ollama_final(const api_request& r, const serving::outcome& out, std::string_view text,
                  std::string_view done_reason, const std::string& created_at) {
  json j = ollama_chunk(r, text, created_at);
  if (r.tools && r.dialect == api_dialect::ollama_chat && !out.text.empty()) {
    // The answer's calls; the text outside them is the content when this line carries the whole
    // answer (not streamed; a stream sent that text before).
    auto parsed = parse_tool_calls(out.text);
    if (!parsed.calls.empty()) {
      if (text == out.text) j["message"]["content"] = parsed.content;
      j["message"]["tool_calls"] = ollama_tool_calls(parsed.calls);
    }
  }
  const auto ns = [](double s) { return static_cast<std::int64_t>(std::llround(s * 1e9)); };
  j["done"] = true;
  j["done_reason"] = std::string(done_reason);
  j["total_duration"] = ns(out.total_s);
  j["load_duration"] = 0;  // the weights are loaded when the plan places the model
  j["prompt_eval_count"] = out.prompt_tokens;
  j["prompt_eval_duration"] = ns(out.first_token_s);
  j["eval_count"] = out.tokens.size();
  j["eval_duration"] = ns(std::max(0.0, out.total_s - out.first_token_s));
  return j;
}

json ollama_error(const api_error& e) {
  return {{"error", e.message}};
}

json ollama_tags(const json& models) {
  json list = json::array();
  const std::string now = rfc3339_now();
  for (const auto& m : models) {
    const std::string name = m.value("id", "") + ":latest";
    list.push_back({{"name", name},
                    {"model", name},
                    {"modified_at", now},
                    {"size", m.value("bytes", std::uint64_t{0})},
                    {"digest", m.value("content", "")},
                    {"details",
                     {{"format", "gguf"},
                      {"family", m.value("architecture", "")},
                      {"families", json(nullptr)},
                      {"parameter_size", ""},
                      {"quantization_level", ""}}}});
  }
  return {{"models", list}};
}

}  // namespace tessera::mesh::http
