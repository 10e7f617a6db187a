#include "mesh/http/openai.hpp"

#include "mesh/http/tools.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "inference/tokenizer/json_schema.hpp"
#include "mesh/serving/follower.hpp"

namespace tessera::mesh::http {

api_error field_error(std::string param, std::string message) {
  api_error e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

std::string shown_json(const nlohmann::json& v) {
  std::string s = dump(v);
  if (s.size() > 40) s = s.substr(0, 40) + "...";
  return s;
}

namespace {

using json = nlohmann::json;

api_error bad(std::string param, std::string message) {
  return field_error(std::move(param), std::move(message));
}

std::string shown(const json& v) {
  return shown_json(v);
}

/// A number field in [lo, hi]; absent or null leaves `out` alone.
std::optional<api_error> number(const json& body, const char* key, double lo, double hi,
                                float& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || !(it->get<double>() >= lo && it->get<double>() <= hi))
    return bad(key,
               fmt::format("'{}' must be a number from {} to {}, got {}", key, lo, hi, shown(*it)));
  out = static_cast<float>(it->get<double>());
  return std::nullopt;
}

/// An integer field in [lo, hi]; absent or null leaves `out` alone.
template <typename Int>
std::optional<api_error> integer(const json& body, const char* key, std::int64_t lo,
                                 std::int64_t hi, Int& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<std::int64_t>() < lo || it->get<std::int64_t>() > hi)
    return bad(
        key, fmt::format("'{}' must be an integer from {} to {}, got {}", key, lo, hi, shown(*it)));
  out = static_cast<Int>(it->get<std::int64_t>());
  return std::nullopt;
}

/// A field Tessera does not implement: accepted only when it asks for the default behaviour.
std::optional<api_error> only_default(const json& body, const char* key, const char* what) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  const json& v = *it;
  const bool is_default = (v.is_boolean() && !v.get<bool>()) ||
                          (v.is_number() && v.get<double>() == 0) ||
                          (v.is_string() && v.get<std::string>().empty()) ||
                          ((v.is_array() || v.is_object()) && v.empty());
  if (is_default) return std::nullopt;
  return bad(key,
             fmt::format("'{}' is not supported by Tessera ({}); got {}", key, what, shown(v)));
}

std::optional<api_error> parse_messages(const json& body, serving::request& r) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    return bad("messages", "'messages' must be a non-empty array of {\"role\", \"content\"}");
  if (it->size() > serving::max_messages)
    return bad("messages", fmt::format("'messages' holds {} messages, at most {}", it->size(),
                                       serving::max_messages));
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return bad(where, fmt::format("'{}' must be an object", where));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return bad(where + ".role", fmt::format("'{}.role' must be a string", where));
    std::string role_text = role->get<std::string>();
    if (role_text == "developer") role_text = "system";  // OpenAI's newer name for system
    if (role_text != "system" && role_text != "user" && role_text != "assistant" &&
        role_text != "tool")
      return bad(where + ".role", fmt::format("'{}.role' is '{}'; Tessera takes system, user, "
                                              "assistant, tool (or developer)",
                                              where, role_text.substr(0, 32)));
    serving::chat_message msg;
    // An assistant's earlier tool calls, and a tool's answer to one: the model's own chat
    // template renders them (mesh/http/tools.hpp).
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (role_text != "assistant" || !tc->is_array())
        return bad(where + ".tool_calls",
                   fmt::format("'{}.tool_calls' must be an array, on an assistant message", where));
      for (std::size_t k = 0; k < tc->size(); ++k) {
        const json& call = (*tc)[k];
        const std::string cw = fmt::format("{}.tool_calls[{}]", where, k);
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string())
          return bad(cw, fmt::format("'{}' must be {{\"id\", \"type\": \"function\", "
                                     "\"function\": {{\"name\", \"arguments\"}}}}",
                                     cw));
      }
      if (!tc->empty()) msg.tool_calls = tc->dump();
    }
    if (role_text == "tool") {
      if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
        if (!id->is_string())
          return bad(where + ".tool_call_id",
                     fmt::format("'{}.tool_call_id' must be a string", where));
        msg.tool_call_id = id->get<std::string>();
      }
    }
    if (auto nm = m.find("name"); nm != m.end() && nm->is_string())
      msg.name = nm->get<std::string>();
    std::string content;
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) {
      // An assistant message may have no content (OpenAI allows it with tool calls).
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (std::size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pw = fmt::format("{}.content[{}]", where, k);
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return bad(pw, fmt::format("'{}' must be {{\"type\": \"text\", \"text\": ...}} (only "
                                     "text parts are supported)",
                                     pw));
        content += part["text"].get<std::string>();
      }
    } else {
      return bad(where + ".content",
                 fmt::format("'{}.content' must be a string or an array of text parts", where));
    }
    msg.role = std::move(role_text);
    msg.content = std::move(content);
    r.messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<api_error> parse_prompt(const json& body, serving::request& r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad("prompt", "'prompt' is required");
  if (it->is_string()) {
    r.prompt = it->get<std::string>();
  } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    r.prompt = (*it)[0].get<std::string>();
  } else {
    return bad("prompt",
               "'prompt' must be a string (or an array of one string; token-id prompts and "
               "several prompts per request are not supported)");
  }
  if (r.prompt.empty()) return bad("prompt", "'prompt' is empty");
  return std::nullopt;
}

std::optional<api_error> parse_unsupported(api_kind kind, const json& body) {
  for (auto [key, what] :
       {std::pair{"echo", "echoing the prompt"},
        {"suffix", "insertion"},
        {"logit_bias", "logit bias"},
        {"functions", "function calls (the older API: use 'tools')"},
        {"function_call", "function calls (the older API: use 'tool_choice')"}}) {
    if (auto e = only_default(body, key, what)) return e;
  }
  if (kind != api_kind::chat)
    for (const char* key : {"tools", "tool_choice"})
      if (auto e = only_default(body, key, "tool calls (chat completions take them)")) return e;
  if (auto it = body.find("best_of");
      it != body.end() && !it->is_null() && !(it->is_number_integer() && it->get<int>() == 1))
    return bad("best_of",
               fmt::format("'best_of' must be 1 (use n for several choices), got {}", shown(*it)));
  return std::nullopt;
}

/// `response_format` (chat): text, json_object, or json_schema, by constrained decoding (the
/// request's `format` and `schema`). A schema the grammar cannot follow is refused here, with the
/// compiler's words (the keyword and its place), before any peer is asked.
std::optional<api_error> parse_response_format(api_kind kind, const json& body,
                                               serving::request& r) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (kind != api_kind::chat)
    return bad("response_format", "'response_format' is taken by chat completions only");
  const auto type_it = it->is_object() ? it->find("type") : it->end();
  const std::string type = it->is_object() && type_it != it->end() && type_it->is_string()
                               ? type_it->get<std::string>()
                               : "";
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    r.format = "json_object";
    return std::nullopt;
  }
  if (type == "json_schema") {
    const auto js = it->find("json_schema");
    if (js == it->end() || !js->is_object() || !js->contains("schema") ||
        !((*js)["schema"].is_object() || (*js)["schema"].is_boolean()))
      return bad("response_format",
                 "'response_format.json_schema' must be {\"name\": ..., \"schema\": {...}}");
    std::string text = (*js)["schema"].dump();
    if (text.size() > serving::max_schema_bytes)
      return bad("response_format", fmt::format("'response_format.json_schema.schema' is {} "
                                                "bytes, at most {}",
                                                text.size(), serving::max_schema_bytes));
    if (auto compiled = inference::tokenizer::json_schema::compile(text); !compiled)
      return bad("response_format",
                 fmt::format("'response_format.json_schema.schema': {}", compiled.error().message));
    r.format = "json_schema";
    r.schema = std::move(text);
    return std::nullopt;
  }
  return bad("response_format",
             fmt::format("'response_format' must be {{\"type\": \"text\"}}, {{\"type\": "
                         "\"json_object\"}} or {{\"type\": \"json_schema\", \"json_schema\": "
                         "{{\"schema\": ...}}}}, got {}",
                         shown(*it)));
}

}  // namespace

std::optional<api_error> parse_stop(const nlohmann::json& body, std::vector<std::string>& out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const auto one = [&](const json& v, const std::string& where) -> std::optional<api_error> {
    if (!v.is_string())
      return bad("stop", fmt::format("'{}' must be a string, got {}", where, shown(v)));
    const auto& text = v.get_ref<const std::string&>();
    if (text.size() > max_stop_sequence_bytes)
      return bad("stop", fmt::format("'{}' is {} bytes, at most {}", where, text.size(),
                                     max_stop_sequence_bytes));
    if (!text.empty()) out.push_back(text);  // an empty sequence stops nothing
    return std::nullopt;
  };
  if (it->is_string()) return one(*it, "stop");
  if (!it->is_array())
    return bad("stop",
               fmt::format("'stop' must be a string or an array of up to {} strings, got {}",
                           max_stop_sequences, shown(*it)));
  if (it->size() > max_stop_sequences)
    return bad("stop", fmt::format("'stop' holds {} sequences, at most {}", it->size(),
                                   max_stop_sequences));
  for (std::size_t i = 0; i < it->size(); ++i)
    if (auto e = one((*it)[i], fmt::format("stop[{}]", i))) return e;
  return std::nullopt;
}

namespace {

// Chat: logprobs (bool) and top_logprobs (0..20, only with logprobs). Completions (legacy):
// logprobs is the number of alternatives, 0..5.
std::optional<api_error> parse_logprobs(api_kind kind, const json& body, serving::request& r) {
  auto lp = body.find("logprobs");
  const bool has_lp = lp != body.end() && !lp->is_null();
  auto top = body.find("top_logprobs");
  const bool has_top = top != body.end() && !top->is_null();
  if (kind == api_kind::completion) {
    if (has_top)
      return bad("top_logprobs",
                 "'top_logprobs' is a chat field; completions take "
                 "'logprobs' as the number of alternatives");
    if (!has_lp) return std::nullopt;
    return integer(body, "logprobs", 0, 5, r.top_logprobs);
  }
  if (has_lp && !lp->is_boolean()) return bad("logprobs", "'logprobs' must be true or false");
  const bool on = has_lp && lp->get<bool>();
  if (has_top && !on) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (!on) return std::nullopt;
  r.top_logprobs = 0;
  return integer(body, "top_logprobs", 0, serving::max_top_logprobs, r.top_logprobs);
}

std::optional<api_error> parse_sampling(api_kind kind, const json& body, serving::request& r) {
  // OpenAI's defaults (temperature 1, nucleus off) so a client sees the distribution it expects;
  // top_k / min_p / repeat_penalty are llama.cpp's extensions and off unless asked for.
  r.temperature = 1.0f;
  r.top_p = 1.0f;
  r.top_k = 0;
  r.min_p = 0.0f;
  r.repeat_penalty = 1.0f;
  r.max_tokens = kind == api_kind::chat ? default_chat_tokens : default_completion_tokens;
  if (auto e = number(body, "temperature", 0, 2, r.temperature)) return e;
  if (auto e = number(body, "top_p", 0, 1, r.top_p)) return e;
  if (auto e = number(body, "min_p", 0, 1, r.min_p)) return e;
  if (auto e = number(body, "repeat_penalty", 0.01, 10, r.repeat_penalty)) return e;
  if (auto e = number(body, "frequency_penalty", -2, 2, r.frequency_penalty)) return e;
  if (auto e = number(body, "presence_penalty", -2, 2, r.presence_penalty)) return e;
  if (auto e = integer(body, "top_k", 0, 1 << 20, r.top_k)) return e;
  if (auto e = integer(body, "max_tokens", 1, serving::max_tokens_limit, r.max_tokens)) return e;
  if (auto e = integer(body, "max_completion_tokens", 1, serving::max_tokens_limit, r.max_tokens))
    return e;
  if (auto e = integer(body, "seed", std::numeric_limits<std::int64_t>::min(),
                       std::numeric_limits<std::int64_t>::max(), r.seed))
    return e;
  return std::nullopt;
}

}  // namespace

json api_error::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

std::variant<api_request, api_error> parse_request(api_kind kind, std::string_view body_text,
                                                   std::string id, std::uint64_t seed) {
  json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return bad("", "the request body is not valid JSON");
  if (!body.is_object()) return bad("", "the request body must be a JSON object");
  api_request out;
  out.kind = kind;
  serving::request& r = out.request;
  r.id = std::move(id);
  r.seed = seed;
  auto model = body.find("model");
  if (model == body.end() || !model->is_string() || model->get<std::string>().empty())
    return bad("model", "'model' must name a model (GET /v1/models lists them)");
  r.model = model->get<std::string>();
  if (r.model.size() > serving::max_model_bytes)
    return bad("model", fmt::format("'model' is {} bytes, at most {}", r.model.size(),
                                    serving::max_model_bytes));
  if (auto e = kind == api_kind::chat ? parse_messages(body, r) : parse_prompt(body, r)) return *e;
  if (auto e = parse_unsupported(kind, body)) return *e;
  if (kind == api_kind::chat) {
    // The tools go to the model's template in the client's own key order (parsed again, in
    // order, only when there are tools).
    const auto ordered = body.contains("tools")
                             ? nlohmann::ordered_json::parse(body_text, nullptr, false)
                             : nlohmann::ordered_json::object();
    if (auto e = parse_tools(body, ordered, out)) return *e;
  }
  if (auto e = parse_sampling(kind, body, r)) return *e;
  if (auto e = parse_stop(body, out.stop)) return *e;
  if (auto e = parse_logprobs(kind, body, r)) return *e;
  if (auto e = parse_response_format(kind, body, r)) return *e;
  if (!r.tool_choice.empty() && !r.format.empty())
    return bad("response_format",
               "'response_format' with a forced 'tool_choice': the call is the answer's format");
  if (auto it = body.find("n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1 ||
        it->get<std::int64_t>() > max_choices)
      return bad(
          "n", fmt::format("'n' must be an integer from 1 to {}, got {}", max_choices, shown(*it)));
    out.n = static_cast<std::uint32_t>(it->get<std::int64_t>());
    if (out.n > 1 && out.tools)
      return bad("n", "'n' > 1 with 'tools' is not supported (one choice reads tool calls)");
  }
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("stream", "'stream' must be true or false");
    out.stream = it->get<bool>();
  }
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (auto u = it->find("include_usage"); u != it->end() && !u->is_null()) {
      if (!u->is_boolean())
        return bad("stream_options.include_usage", "'include_usage' must be true or false");
      out.include_usage = u->get<bool>();
    }
  }
  if (auto v = serving::validate(r); !v) return bad("", v.error().message);
  return out;
}

api_error error_of(const error& e) {
  api_error a;
  a.message = e.message;
  // A peer's answer: its message without the peer's id (internal to the cluster), and its code
  // where the API has one.
  std::string peer_code;
  if (auto p = serving::parse_peer_error(e.message)) {
    a.message = std::move(p->message);
    peer_code = std::move(p->code);
  }
  if (peer_code == serving::error_code::context_length_exceeded) {
    a.status = 400;
    a.code = peer_code;
    return a;
  }
  switch (e.code) {
    case errc::invalid_argument:
    case errc::unsupported:
      a.status = 400;
      break;
    case errc::not_found:
      a.status = 404;
      a.param = "model";
      a.code = "model_not_found";
      break;
    case errc::no_capacity:
      a.status = 503;
      a.type = "server_error";
      a.code = "no_capacity";
      break;
    case errc::overloaded:
      a.status = 429;
      a.type = "server_error";
      a.code = "overloaded";
      break;
    case errc::closed:
      a.status = 503;
      a.type = "server_error";
      a.code = "unavailable";
      break;
    case errc::timeout:
      a.status = 504;
      a.type = "server_error";
      a.code = "timeout";
      break;
    case errc::unauthorized:
      a.status = 401;
      a.type = "authentication_error";
      a.code = "invalid_api_key";
      break;
    default:
      a.status = 500;
      a.type = "server_error";
      a.code = "internal";
      break;
  }
  return a;
}

api_error error_of(const error& e, api_kind kind) {
  api_error a = error_of(e);
  if (a.code == serving::error_code::context_length_exceeded)
    a.param = kind == api_kind::chat ? "messages" : "prompt";
  return a;
}

std::string_view finish_reason(std::string_view stop) {
  return stop == "end_of_generation" || stop == "stop_sequence" ? "stop" : "length";
}

std::size_t find_stop(std::string_view text, const std::vector<std::string>& stops) {
  std::size_t first = std::string_view::npos;
  for (const auto& s : stops)
    first = std::min(first, text.find(s));
  return first;
}

std::size_t stop_holdback(std::string_view text, const std::vector<std::string>& stops) {
  std::size_t hold = 0;
  for (const auto& s : stops)
    for (std::size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  return hold;
}

json tessera_extension(const serving::outcome& out) {
  return {{"nodes", out.nodes}, {"attempts", out.attempts}};
}

namespace {

json usage(std::uint32_t prompt, std::uint32_t completion) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

}  // namespace

json logprobs_json(const api_request& r, std::span<const serving::token_logprob> lps,
                   std::size_t offset) {
  const auto bytes = [](const std::string& s) {
    json b = json::array();
    for (const unsigned char c : s)
      b.push_back(c);
    return b;
  };
  const std::size_t n = lps.size();
  if (r.kind == api_kind::chat) {
    json content = json::array();
    for (std::size_t i = 0; i < n; ++i) {
      json top = json::array();
      for (const auto& a : lps[i].top)
        top.push_back({{"token", a.text}, {"logprob", a.logprob}, {"bytes", bytes(a.text)}});
      content.push_back({{"token", lps[i].text},
                         {"logprob", lps[i].logprob},
                         {"bytes", bytes(lps[i].text)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (std::size_t i = 0; i < n; ++i) {
    tokens.push_back(lps[i].text);
    token_lps.push_back(lps[i].logprob);
    json top = json::object();
    for (const auto& a : lps[i].top)
      top[a.text] = a.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += lps[i].text.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

api_request choice_request(const api_request& r, std::uint32_t i) {
  api_request c = r;
  c.n = 1;
  c.index = i;
  c.reply_id = r.request.id;
  c.request.id = fmt::format("{}.{}", r.request.id, i);
  c.request.affinity = r.request.id;
  c.request.seed = r.request.seed + i;
  return c;
}

namespace {

const std::string& reply_id(const api_request& r) {
  return r.reply_id.empty() ? r.request.id : r.reply_id;
}

}  // namespace

json reply(const api_request& r, const serving::outcome& out, std::int64_t created_unix) {
  json choice{
      {"index", r.index}, {"finish_reason", finish_reason(out.stop)}, {"logprobs", nullptr}};
  if (r.request.top_logprobs >= 0) {
    // The tokens that begin inside the answer (a stop sequence cut it: those past it go).
    std::size_t n = 0;
    for (std::size_t at = 0; n < out.logprobs.size() && at < out.text.size(); ++n)
      at += out.logprobs[n].text.size();
    choice["logprobs"] = logprobs_json(r, std::span(out.logprobs).first(n));
  }
  if (r.kind == api_kind::chat && r.tools) {
    // The model's answer read for calls in its template's format (mesh/http/tools.hpp).
    auto parsed = parse_tool_calls(out.text);
    if (!parsed.calls.empty()) {
      choice["finish_reason"] = "tool_calls";
      choice["message"] = {
          {"role", "assistant"},
          {"content", parsed.content.empty() ? json(nullptr) : json(parsed.content)},
          {"tool_calls", tool_calls_json(parsed.calls, r.request.id, false)}};
    } else {
      choice["message"] = {{"role", "assistant"}, {"content", out.text}};
    }
  } else if (r.kind == api_kind::chat) {
    choice["message"] = {{"role", "assistant"}, {"content", out.text}};
  } else {
    choice["text"] = out.text;
  }
  return {{"id", reply_id(r)},
          {"object", r.kind == api_kind::chat ? "chat.completion" : "text_completion"},
          {"created", created_unix},
          {"model", r.request.model},
          {"choices", json::array({choice})},
          {"usage", usage(out.prompt_tokens, static_cast<std::uint32_t>(out.tokens.size()))},
          {"tessera", tessera_extension(out)}};
}

json chunk(const api_request& r, std::string_view text, bool first, std::string_view finish,
           std::int64_t created_unix, std::span<const serving::token_logprob> logprobs,
           std::size_t text_offset) {
  json choice{{"index", r.index},
              {"finish_reason", finish.empty() ? json(nullptr) : json(finish)},
              {"logprobs", nullptr}};
  if (!logprobs.empty()) choice["logprobs"] = logprobs_json(r, logprobs, text_offset);
  if (r.kind == api_kind::chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish.empty())) delta["content"] = std::string(text);
    choice["delta"] = delta;
  } else {
    choice["text"] = std::string(text);
  }
  return {{"id", reply_id(r)},
          {"object", r.kind == api_kind::chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_unix},
          {"model", r.request.model},
          {"choices", json::array({choice})}};
}

json tool_calls_chunk(const api_request& r, const std::vector<tool_call>& calls,
                      std::int64_t created_unix) {
  json choice{{"index", 0},
              {"finish_reason", "tool_calls"},
              {"logprobs", nullptr},
              {"delta", {{"tool_calls", tool_calls_json(calls, r.request.id, true)}}}};
  return {{"id", r.request.id},
          {"object", "chat.completion.chunk"},
          {"created", created_unix},
          {"model", r.request.model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const api_request& r, std::uint32_t prompt_tokens, std::uint32_t completion_tokens,
                 std::int64_t created_unix) {
  return {{"id", reply_id(r)},
          {"object", r.kind == api_kind::chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_unix},
          {"model", r.request.model},
          {"choices", json::array()},
          {"usage", usage(prompt_tokens, completion_tokens)}};
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

std::size_t utf8_complete_prefix(std::string_view b) noexcept {
  // Walk back over at most 3 continuation bytes to the last lead byte; if the sequence it starts
  // is longer than what follows it, cut before it. Anything else (ASCII, a complete sequence,
  // stray bytes) is left for the JSON dump to keep or replace.
  const std::size_t n = b.size();
  std::size_t i = n;
  std::size_t back = 0;
  while (i > 0 && back < 4) {
    const auto c = static_cast<unsigned char>(b[i - 1]);
    if ((c & 0xC0) != 0x80) {
      std::size_t need = 1;
      if ((c & 0xE0) == 0xC0)
        need = 2;
      else if ((c & 0xF0) == 0xE0)
        need = 3;
      else if ((c & 0xF8) == 0xF0)
        need = 4;
      return (n - (i - 1)) < need ? i - 1 : n;
    }
    --i;
    ++back;
  }
  return n;
}

}  // namespace tessera::mesh::http
