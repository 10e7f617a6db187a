// Chat templates. A model file's own `tokenizer.chat_template` (Jinja) is rendered by the Jinja
// subset in jinja.hpp, as Hugging Face renders it; a model without one (or with one the subset
// cannot parse) gets one of the common families written directly in C++, chosen from metadata:
// the template's marker strings, then the architecture and tokenizer kind.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"
#include "inference/tokenizer/forced_call.hpp"
#include "inference/tokenizer/jinja.hpp"

namespace tessera::inference::gguf {
class file;
}

namespace tessera::inference::tokenizer {

enum class chat_family {
  llama3,   ///< <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  chatml,   ///< <|im_start|>role\n...<|im_end|>\n (qwen2, qwen3, many fine-tunes)
  mistral,  ///< [INST] ... [/INST] (mistral, llama 2 style; system folded into the first turn)
};
std::string_view to_string(chat_family f) noexcept;
result<chat_family> parse_chat_family(std::string_view name);

struct chat_message {
  std::string role;  ///< "system", "user", "assistant" (or "tool": Jinja templates only)
  std::string content;
  /// An assistant's tool calls (OpenAI's JSON array, "" when none), and a tool message's call id
  /// and tool name: what templates that support tools render (Jinja templates only).
  std::string tool_calls_json;
  std::string tool_call_id;
  std::string name;
};

/// A formatted prompt: `text` holds special-token texts to be matched (encode with
/// parse_special = true); `add_bos` says whether the caller must still prepend BOS.
struct chat_prompt {
  std::string text;
  bool add_bos = false;
};

/// Sniffs a Jinja template's family from its markers; nullopt-like error when it has none known.
result<chat_family> detect_chat_family(std::string_view jinja_template);
/// The family for a model file: tokenizer.chat_template if present and recognised, else by
/// general.architecture (qwen2/qwen3 -> chatml) and tokenizer (llama + gpt2 BPE -> llama3,
/// llama + SentencePiece -> mistral).
chat_family chat_family_for(const gguf::file& f);

/// Formats `messages`. Errors: an unknown role, or (mistral) roles out of the user/assistant order.
/// With `add_generation_prompt` the text ends where the assistant's reply begins.
result<chat_prompt> apply_chat_template(chat_family family, const std::vector<chat_message>& messages,
                                        bool add_generation_prompt = true);

class tokenizer;

/// How a model's chat messages become its prompt: its own Jinja template, else a built-in family.
struct chat_template {
  std::shared_ptr<const jinja::template_program> jinja;  ///< null: the family
  chat_family family = chat_family::chatml;
  std::string bos_token, eos_token;  ///< the texts a Jinja template may print
  /// Why the file's template is not used ("" when it is, or when the file has none).
  std::string fallback_reason;
  /// How the Jinja template writes a tool call (what a forced call starts with; forced_call.hpp).
  tool_call_syntax calls;
  /// "jinja" (the file's own), or the family, with the reason the file's template is not used.
  [[nodiscard]] std::string describe() const;
};

/// The template of a model file: tokenizer.chat_template when it is Jinja the subset parses,
/// else chat_family_for(f).
chat_template chat_template_for(const gguf::file& f, const tokenizer& tok);

/// Formats `messages` with `t`. A Jinja template that refuses the conversation
/// (raise_exception) is given it once more in the shape every template takes — system texts
/// folded into the first user turn, consecutive turns of one role joined — and the error names
/// the template's own reason when it still refuses. A leading BOS text is left to the tokenizer
/// (add_bos), which adds it when the vocabulary asks, as llama.cpp does.
/// `tools_json`: the tools the model may call (OpenAI's JSON array; "" none), given to the template
/// as `tools`, as Hugging Face does. Tools, tool calls and tool messages need the file's own Jinja
/// template: with a built-in family they are an error naming the reason.
result<chat_prompt> apply_chat_template(const chat_template& t,
                                        const std::vector<chat_message>& messages,
                                        bool add_generation_prompt = true,
                                        std::string_view tools_json = {});

}  // namespace tessera::inference::tokenizer
