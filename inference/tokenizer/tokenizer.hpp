// Tokenizers built from GGUF metadata: SentencePiece-style (tokenizer.ggml.model = "llama":
// scores, ▁ for spaces, <0xNN> byte fallback) and GPT-2-style byte-level BPE ("gpt2": merges,
// byte <-> unicode mapping, llama3 / qwen2 / gpt2 pre-tokenizer splits). Special (control and
// user-defined) tokens are matched in text when the caller allows it. Decoding returns bytes;
// stream_decoder holds back incomplete UTF-8 so streamed output never shows half a character.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/base/result.hpp"
#include "inference/tokenizer/unicode.hpp"

namespace tessera::inference::gguf {
class file;
}

namespace tessera::inference::tokenizer {

using token_id = std::int32_t;

enum class model_kind { spm, bpe };
std::string_view to_string(model_kind k) noexcept;

/// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class token_type : std::int32_t {
  undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

/// Bounds on tokenizer metadata (malformed files are rejected, not trusted).
struct vocab_limits {
  std::size_t max_tokens = 1u << 20;
  std::size_t max_token_bytes = 1024;
  std::size_t max_merges = 1u << 21;
};

/// Everything a tokenizer is made of; what the GGUF keys hold.
struct vocab_data {
  model_kind kind = model_kind::spm;
  std::vector<std::string> tokens;
  std::vector<float> scores;           ///< SPM merge priorities (may be empty for BPE)
  std::vector<token_type> types;       ///< empty: all normal
  std::vector<std::string> merges;     ///< BPE: "left right", rank = index
  pre_split pre = pre_split::gpt2;     ///< BPE pre-tokenizer
  token_id bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;        ///< SPM: a ▁ before the text (and after special tokens)
};

struct encode_options {
  bool add_special = true;    ///< prepend BOS (and append EOS) as the vocabulary asks
  bool parse_special = false; ///< match control / user-defined token texts in the input
};

class tokenizer {
 public:
  /// Validates `data`: sizes agree, ids in range, BPE merges name existing tokens, SPM has byte
  /// tokens or an unk. `what` prefixes error messages (the file name).
  static result<tokenizer> create(vocab_data data, std::string_view what = "tokenizer",
                                  const vocab_limits& lim = {});
  /// Reads tokenizer.ggml.* from a GGUF file. Errors name the file and the key.
  static result<tokenizer> from_gguf(const gguf::file& f, const vocab_limits& lim = {});

  [[nodiscard]] std::vector<token_id> encode(std::string_view text,
                                             const encode_options& opts = {}) const;
  /// The bytes a token stands for (byte tokens give their byte, ▁ gives a space, BPE is unmapped).
  [[nodiscard]] std::string token_bytes(token_id id) const;
  /// Concatenated bytes of `ids`; with `strip_leading_space` the SPM prefix space is dropped.
  [[nodiscard]] std::string decode(std::span<const token_id> ids,
                                   bool strip_leading_space = true) const;

  [[nodiscard]] model_kind kind() const noexcept { return d_.kind; }
  [[nodiscard]] std::size_t size() const noexcept { return d_.tokens.size(); }
  [[nodiscard]] const std::string& text(token_id id) const { return d_.tokens.at(static_cast<std::size_t>(id)); }
  [[nodiscard]] token_type type(token_id id) const noexcept;
  [[nodiscard]] token_id bos() const noexcept { return d_.bos; }
  [[nodiscard]] token_id eos() const noexcept { return d_.eos; }
  [[nodiscard]] token_id eot() const noexcept { return d_.eot; }
  [[nodiscard]] bool add_bos() const noexcept { return d_.add_bos; }
  /// True for tokens that end generation (EOS, EOT).
  [[nodiscard]] bool is_end_of_generation(token_id id) const noexcept;
  /// Token id of an exact token text, -1 if none.
  [[nodiscard]] token_id find(std::string_view token_text) const;
  [[nodiscard]] const vocab_data& data() const noexcept { return d_; }

 private:
  tokenizer() = default;
  void encode_spm(std::string_view text, std::vector<token_id>& out) const;
  void encode_bpe(std::string_view text, std::vector<token_id>& out) const;
  void bpe_word(std::string_view word, std::vector<token_id>& out) const;

  vocab_data d_;
  std::unordered_map<std::string, token_id> index_;
  std::unordered_map<std::string, std::int32_t> merge_rank_;  // "left right" -> rank
  std::vector<token_id> byte_tokens_;                         // SPM <0xNN>, BPE mapped byte; -1
  std::vector<token_id> specials_;                            // sorted longest text first
};

/// Turns a token stream into text safely: never emits half a UTF-8 sequence.
class stream_decoder {
 public:
  explicit stream_decoder(const tokenizer& t) : t_(&t) {}
  /// Text that became complete with `id` (possibly empty).
  std::string push(token_id id);
  /// Whatever is held back (an incomplete sequence at the end of generation), as is.
  std::string flush();

 private:
  const tokenizer* t_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace tessera::inference::tokenizer
