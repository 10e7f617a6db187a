#include "inference/tokenizer/chat.hpp"

#include <algorithm>

#include "inference/gguf/gguf.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::inference::tokenizer {

std::string_view to_string(chat_family f) noexcept {
  switch (f) {
    case chat_family::llama3: return "llama3";
    case chat_family::chatml: return "chatml";
    case chat_family::mistral: return "mistral";
  }
  return "unknown";
}

result<chat_family> parse_chat_family(std::string_view name) {
  for (auto f : {chat_family::llama3, chat_family::chatml, chat_family::mistral}) {
    if (to_string(f) == name) return f;
  }
  return make_error(errc::invalid_argument, "unknown chat template '{}' (llama3, chatml, mistral)",
                    name);
}

result<chat_family> detect_chat_family(std::string_view t) {
  if (t.find("<|start_header_id|>") != std::string_view::npos) return chat_family::llama3;
  if (t.find("<|im_start|>") != std::string_view::npos) return chat_family::chatml;
  if (t.find("[INST]") != std::string_view::npos) return chat_family::mistral;
  return make_error(errc::unsupported, "chat template has no known family markers");
}

chat_family chat_family_for(const gguf::file& f) {
  if (auto t = f.get_string("tokenizer.chat_template")) {
    if (auto fam = detect_chat_family(*t)) return *fam;
  }
  auto arch = f.get_string("general.architecture");
  if (arch && (*arch == "qwen2" || *arch == "qwen3" || *arch == "qwen2moe" || *arch == "qwen3moe"))
    return chat_family::chatml;
  auto model = f.get_string("tokenizer.ggml.model");
  if (model && *model == "gpt2") {
    auto tokens = f.get_array("tokenizer.ggml.tokens", gguf::value_type::string);
    if (tokens) {
      for (const auto& s : (*tokens)->strings) {
        if (s == "<|start_header_id|>") return chat_family::llama3;
      }
    }
    return chat_family::chatml;
  }
  return chat_family::mistral;
}

namespace {

// The shape every template takes: every system text joined (\n\n) apart, and consecutive turns
// of one role joined into one — what llama.cpp does for templates that need it. Tool results and
// turns carrying tool calls stay whole.
std::pair<std::string, std::vector<chat_message>> fold_turns(
    const std::vector<chat_message>& messages) {
  std::string system;
  std::vector<chat_message> turns;
  for (const auto& m : messages) {
    if (m.role == "system") {
      system += (system.empty() ? "" : "\n\n") + m.content;
    } else if (!turns.empty() && turns.back().role == m.role && m.role != "tool" &&
               m.tool_calls_json.empty() && turns.back().tool_calls_json.empty()) {
      turns.back().content += "\n\n" + m.content;
    } else {
      turns.push_back(m);
    }
  }
  return {std::move(system), std::move(turns)};
}

}  // namespace

result<chat_prompt> apply_chat_template(chat_family family, const std::vector<chat_message>& messages,
                                        bool add_generation_prompt) {
  for (const auto& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      return make_error(errc::invalid_argument,
                        "chat message role '{}' is not system, user or assistant", m.role);
  }
  chat_prompt p;
  switch (family) {
    case chat_family::llama3:
      p.text = "<|begin_of_text|>";
      for (const auto& m : messages) {
        p.text += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      if (add_generation_prompt) p.text += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return p;
    case chat_family::chatml:
      for (const auto& m : messages) {
        p.text += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      if (add_generation_prompt) p.text += "<|im_start|>assistant\n";
      return p;
    case chat_family::mistral: {
      // <s>[INST] {system}\n\n{user} [/INST] {assistant}</s>[INST] {user} [/INST]
      // The template alternates user and assistant turns and takes one system text. What clients
      // send is looser (two user messages in a row, a system message later on), so messages are
      // folded into that shape first, as llama.cpp's mistral rendering does: every system text
      // goes before the first user turn, and consecutive turns of one role are joined.
      p.add_bos = true;
      auto [system, turns] = fold_turns(messages);
      if (!turns.empty() && turns.front().role != "user")
        return make_error(errc::invalid_argument,
                          "mistral chat template: the first message after the system text must be "
                          "the user's, not the {}'s",
                          turns.front().role);
      for (const auto& m : turns) {
        if (m.role == "user") {
          p.text += "[INST] ";
          if (!system.empty()) {
            p.text += system + "\n\n";
            system.clear();
          }
          p.text += m.content + " [/INST]";
        } else {
          p.text += " " + m.content + "</s>";
        }
      }
      if (!system.empty()) p.text += "[INST] " + system + " [/INST]";  // a system text alone
      (void)add_generation_prompt;  // the reply follows [/INST] directly
      return p;
    }
  }
  return make_error(errc::invalid_argument, "unknown chat family");
}

std::string chat_template::describe() const {
  if (jinja) return "jinja";
  return std::string(to_string(family)) +
         (fallback_reason.empty() ? ""
                                  : " (the file's template is not used: " + fallback_reason + ")");
}

chat_template chat_template_for(const gguf::file& f, const tokenizer& tok) {
  chat_template t;
  t.family = chat_family_for(f);
  if (tok.bos() >= 0) t.bos_token = tok.text(tok.bos());
  if (tok.eos() >= 0) t.eos_token = tok.text(tok.eos());
  auto text = f.get_string("tokenizer.chat_template");
  // Synthetic files name a family instead of carrying Jinja: only text with Jinja tags is one.
  if (!text || (text->find("{%") == std::string::npos && text->find("{{") == std::string::npos))
    return t;
  auto program = jinja::template_program::parse(*text);
  if (!program) {
    t.fallback_reason = program.error().message;
    return t;
  }
  t.jinja = std::make_shared<const jinja::template_program>(std::move(*program));
  t.calls = tool_call_syntax_of(*text);
  return t;
}

namespace {

// A tool call's `function.arguments` arrive as JSON text (OpenAI); templates expect a mapping
// (they print it with tojson), as Hugging Face and llama.cpp pass it.
jinja::value tool_calls_value(const std::string& text) {
  auto calls = nlohmann::ordered_json::parse(text, nullptr, false);
  if (calls.is_discarded() || !calls.is_array()) return jinja::value(jinja::array{});
  for (auto& c : calls) {
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
    auto& f = c["function"];
    if (f.contains("arguments") && f["arguments"].is_string()) {
      auto args = nlohmann::ordered_json::parse(f["arguments"].get<std::string>(), nullptr, false);
      if (!args.is_discarded() && args.is_object()) f["arguments"] = std::move(args);
    }
  }
  return jinja::from_json(calls);
}

result<std::string> render_jinja(const chat_template& t, const std::vector<chat_message>& messages,
                                 bool add_generation_prompt, std::string_view tools_json) {
  jinja::array msgs;
  for (const auto& m : messages) {
    jinja::object o{{"role", jinja::value(m.role)}, {"content", jinja::value(m.content)}};
    if (!m.tool_calls_json.empty())
      o.emplace_back("tool_calls", tool_calls_value(m.tool_calls_json));
    if (!m.tool_call_id.empty()) o.emplace_back("tool_call_id", jinja::value(m.tool_call_id));
    if (!m.name.empty()) o.emplace_back("name", jinja::value(m.name));
    msgs.emplace_back(std::move(o));
  }
  jinja::object globals{{"messages", jinja::value(std::move(msgs))},
                        {"add_generation_prompt", jinja::value(add_generation_prompt)},
                        {"bos_token", jinja::value(t.bos_token)},
                        {"eos_token", jinja::value(t.eos_token)}};
  if (!tools_json.empty()) {
    auto tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
    if (tools.is_discarded() || !tools.is_array())
      return make_error(errc::invalid_argument, "'tools' is not a JSON array");
    globals.emplace_back("tools", jinja::from_json(tools));
  }
  return t.jinja->render(globals);
}

}  // namespace

result<chat_prompt> apply_chat_template(const chat_template& t,
                                        const std::vector<chat_message>& messages,
                                        bool add_generation_prompt, std::string_view tools_json) {
  const bool tool_use =
      !tools_json.empty() || std::any_of(messages.begin(), messages.end(), [](const auto& m) {
        return m.role == "tool" || !m.tool_calls_json.empty();
      });
  if (!t.jinja) {
    if (tool_use)
      return make_error(errc::invalid_argument,
                        "tools need the model's own chat template, and this model file has none "
                        "that Tessera renders (it uses the built-in {} family)",
                        to_string(t.family));
    return apply_chat_template(t.family, messages, add_generation_prompt);
  }
  for (const auto& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      return make_error(errc::invalid_argument,
                        "chat message role '{}' is not system, user, assistant or tool", m.role);
  }
  auto text = render_jinja(t, messages, add_generation_prompt, tools_json);
  // A template that asks for more than the Jinja subset does (an unknown filter, a bound): the
  // model is still served, with its built-in family, as a file without a template is — unless
  // tools need the file's template.
  const auto beyond_subset = [&](const error& e) -> result<chat_prompt> {
    if (tool_use)
      return make_error(errc::invalid_argument,
                        "the model's chat template cannot be rendered here ({}), and tools need it",
                        e.message);
    return apply_chat_template(t.family, messages, add_generation_prompt);
  };
  if (!text && text.error().code == errc::unsupported) return beyond_subset(text.error());
  if (!text) {
    // Many templates refuse a system role, or turns that do not alternate; clients send both.
    auto [system, folded] = fold_turns(messages);
    if (!system.empty()) {
      if (!folded.empty() && folded.front().role == "user")
        folded.front().content = system + "\n\n" + folded.front().content;
      else
        folded.insert(folded.begin(), chat_message{"user", system});
    }
    auto again = render_jinja(t, folded, add_generation_prompt, tools_json);
    if (!again && again.error().code == errc::unsupported) return beyond_subset(again.error());
    if (!again)
      return make_error(errc::invalid_argument,
                        "the model's chat template refuses the messages: {}", text.error().message);
    text = std::move(again);
  }
  chat_prompt p;
  p.text = std::move(*text);
  if (!t.bos_token.empty() && p.text.starts_with(t.bos_token)) p.text.erase(0, t.bos_token.size());
  p.add_bos = true;  // the tokenizer adds BOS when the vocabulary asks for it
  return p;
}

}  // namespace tessera::inference::tokenizer
