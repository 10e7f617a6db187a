// Chat templates for the common model families, written directly in C++ (no Jinja engine). The
// family is chosen from metadata: tokenizer.chat_template content first, then the architecture
// and tokenizer kind.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"

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
  std::string role;  ///< "system", "user" or "assistant"
  std::string content;
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

}  // namespace tessera::inference::tokenizer
