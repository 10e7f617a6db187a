// UTF-8 and the small part of Unicode the tokenizers need: code point classes for the
// pre-tokenizer splits (\p{L}, \p{N}, \s), GPT-2's byte <-> unicode mapping, and the hand-written
// equivalents of the llama3 / qwen2 / gpt2 pre-tokenizer regexes (std::regex has no \p{..}).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::inference::tokenizer {

/// Sentinel for malformed UTF-8: each bad byte decodes to one invalid_cp and is kept as a byte.
inline constexpr char32_t invalid_cp = 0xFFFFFFFF;

/// One decoded code point and the byte span it came from.
struct utf8_char {
  char32_t cp;            ///< invalid_cp for a malformed byte
  std::uint32_t offset;   ///< byte offset in the input
  std::uint32_t length;   ///< bytes (1 for a malformed byte)
};

/// Decodes `text`; malformed sequences become one invalid_cp per byte (never dropped).
std::vector<utf8_char> decode_utf8(std::string_view text);
/// Appends the UTF-8 encoding of `cp` (must be a valid scalar value).
void append_utf8(std::string& out, char32_t cp);
/// Length of the UTF-8 sequence a lead byte announces (1 for ASCII and stray bytes, 2..4).
int utf8_sequence_length(unsigned char lead) noexcept;
/// Bytes at the end of `s` that form an incomplete (so far valid) UTF-8 sequence, 0..3.
std::size_t incomplete_utf8_tail(std::string_view s) noexcept;

/// Unicode classes as the pre-tokenizer regexes use them: \p{L} (general category L*), \p{N}
/// (N*) from Unicode's database (libutf8proc), \s (the White_Space property).
bool is_letter(char32_t cp) noexcept;
bool is_number(char32_t cp) noexcept;
bool is_whitespace(char32_t cp) noexcept;
char32_t to_lower_ascii(char32_t cp) noexcept;

/// GPT-2 byte-level BPE mapping: every byte to a printable code point and back.
char32_t byte_to_cp(std::uint8_t b) noexcept;
/// The byte a mapped code point stands for, or -1 when `cp` is not in the mapping.
int cp_to_byte(char32_t cp) noexcept;
/// The bytes of `s` re-spelled with byte_to_cp (UTF-8 encoded), as in GPT-2 vocabularies.
std::string bytes_to_bpe_text(std::string_view s);

/// Pre-tokenizer rule sets (tokenizer.ggml.pre).
enum class pre_split { gpt2, llama3, qwen2 };

/// Splits `text` into the chunks the pre-tokenizer regex of `kind` would match, in order. The
/// chunks concatenate back to `text` exactly.
std::vector<std::string_view> pre_tokenize(std::string_view text, pre_split kind);

}  // namespace tessera::inference::tokenizer
