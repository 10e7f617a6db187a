#include "inference/tokenizer/unicode.hpp"

#include <algorithm>
#include <array>

#include <utf8proc.h>

namespace tessera::inference::tokenizer {

namespace {

struct byte_maps {
  std::array<char32_t, 256> to_cp{};
  std::array<int, 512> to_byte{};
  byte_maps() {
    to_byte.fill(-1);
    // GPT-2: printable bytes map to themselves, the other 68 to U+0100.. in byte order.
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      to_cp[static_cast<std::size_t>(b)] = cp;
      to_byte[cp] = b;
    }
  }
};

const byte_maps& maps() {
  static const byte_maps m;
  return m;
}

constexpr char32_t end_cp = 0xFFFFFFFE;  // "out of range" for the split scanners

}  // namespace

std::vector<utf8_char> decode_utf8(std::string_view text) {
  std::vector<utf8_char> out;
  out.reserve(text.size());
  std::size_t i = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  while (i < n) {
    unsigned char c = s[i];
    int len = utf8_sequence_length(c);
    char32_t cp = invalid_cp;
    if (len == 1 && c < 0x80) {
      cp = c;
    } else if (len > 1 && i + static_cast<std::size_t>(len) <= n) {
      char32_t v = c & (0x7F >> len);
      bool ok = true;
      for (int k = 1; k < len; ++k) {
        if ((s[i + static_cast<std::size_t>(k)] & 0xC0) != 0x80) ok = false;
        v = (v << 6) | (s[i + static_cast<std::size_t>(k)] & 0x3F);
      }
      // Reject overlong forms, surrogates and values past U+10FFFF.
      static constexpr char32_t min_for_len[] = {0, 0, 0x80, 0x800, 0x10000};
      if (ok && v >= min_for_len[len] && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) cp = v;
    }
    if (cp == invalid_cp) len = 1;
    out.push_back({cp, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(len)});
    i += static_cast<std::size_t>(len);
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int utf8_sequence_length(unsigned char lead) noexcept {
  if (lead < 0xC0) return 1;  // ASCII or a stray continuation byte
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF8) return 4;
  return 1;
}

std::size_t incomplete_utf8_tail(std::string_view s) noexcept {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (std::size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    int len = utf8_sequence_length(c);
    return (len > 1 && static_cast<std::size_t>(len) > back) ? back : 0;
  }
  return 0;
}

bool is_whitespace(char32_t cp) noexcept {
  return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// \p{N} and \p{L} are Unicode's general categories N* and L* (what the reference regex engines
// match): utf8proc's tables (Debian's libutf8proc, Unicode 15). ASCII, most of every prompt, never
// leaves the fast path.
bool is_number(char32_t cp) noexcept {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  if (cp > 0x10FFFF) return false;
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_letter(char32_t cp) noexcept {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z');
  if (cp > 0x10FFFF) return false;
  const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

char32_t to_lower_ascii(char32_t cp) noexcept {
  return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
}

char32_t byte_to_cp(std::uint8_t b) noexcept { return maps().to_cp[b]; }

int cp_to_byte(char32_t cp) noexcept { return cp < 512 ? maps().to_byte[cp] : -1; }

std::string bytes_to_bpe_text(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) append_utf8(out, byte_to_cp(static_cast<std::uint8_t>(c)));
  return out;
}

std::vector<std::string_view> pre_tokenize(std::string_view text, pre_split kind) {
  const auto chars = decode_utf8(text);
  const std::size_t n = chars.size();
  std::vector<std::string_view> out;
  auto cp_at = [&](std::size_t i) -> char32_t { return i < n ? chars[i].cp : end_cp; };
  auto letter = [&](std::size_t i) { return i < n && is_letter(chars[i].cp); };
  auto number = [&](std::size_t i) { return i < n && is_number(chars[i].cp); };
  auto space = [&](std::size_t i) { return i < n && is_whitespace(chars[i].cp); };
  // [^\s\p{L}\p{N}]: any character (malformed bytes included) that is none of those.
  auto other = [&](std::size_t i) { return i < n && !is_whitespace(chars[i].cp) &&
                                           !is_letter(chars[i].cp) && !is_number(chars[i].cp); };
  std::size_t start = 0;
  auto emit = [&](std::size_t end) {
    std::uint32_t b0 = chars[start].offset;
    std::uint32_t b1 = end < n ? chars[end].offset : static_cast<std::uint32_t>(text.size());
    out.push_back(text.substr(b0, b1 - b0));
    start = end;
  };
  const bool llama_like = kind != pre_split::gpt2;
  while (start < n) {
    std::size_t pos = start;
    const char32_t cp = cp_at(pos);
    // Contractions: 's 't 're 've 'm 'll 'd (case-insensitive for llama3/qwen2).
    if (cp == '\'' && pos + 1 < n) {
      char32_t a = llama_like ? to_lower_ascii(cp_at(pos + 1)) : cp_at(pos + 1);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(pos + 2);
        continue;
      }
      if (pos + 2 < n) {
        char32_t b = llama_like ? to_lower_ascii(cp_at(pos + 2)) : cp_at(pos + 2);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          emit(pos + 3);
          continue;
        }
      }
    }
    if (llama_like) {
      // [^\r\n\p{L}\p{N}]?\p{L}+
      if (!(cp == '\r' || cp == '\n' || number(pos)) && (letter(pos) || letter(pos + 1))) {
        ++pos;
        while (letter(pos)) ++pos;
        emit(pos);
        continue;
      }
      // \p{N}{1,3} (llama3) or \p{N} (qwen2)
      if (number(pos)) {
        const std::size_t max_run = kind == pre_split::llama3 ? 3 : 1;
        std::size_t k = 0;
        while (k < max_run && number(pos)) {
          ++pos;
          ++k;
        }
        emit(pos);
        continue;
      }
      // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      std::size_t p2 = cp == ' ' ? pos + 1 : pos;
      if (other(p2)) {
        pos = p2;
        while (other(pos)) ++pos;
        while (cp_at(pos) == '\r' || cp_at(pos) == '\n') ++pos;
        emit(pos);
        continue;
      }
      std::size_t ws = 0, last_newline_end = 0;
      while (space(pos + ws)) {
        char32_t c2 = cp_at(pos + ws);
        if (c2 == '\r' || c2 == '\n') last_newline_end = pos + ws + 1;
        ++ws;
      }
      if (last_newline_end > 0) {  // \s*[\r\n]+
        emit(last_newline_end);
        continue;
      }
      if (ws > 1 && pos + ws < n) {  // \s+(?!\S)
        emit(pos + ws - 1);
        continue;
      }
      if (ws > 0) {  // \s+
        emit(pos + ws);
        continue;
      }
      emit(pos + 1);
      continue;
    }
    // gpt2: ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+'
    std::size_t p2 = cp == ' ' ? pos + 1 : pos;
    if (letter(p2)) {
      pos = p2;
      while (letter(pos)) ++pos;
      emit(pos);
      continue;
    }
    if (number(p2)) {
      pos = p2;
      while (number(pos)) ++pos;
      emit(pos);
      continue;
    }
    if (other(p2)) {
      pos = p2;
      while (other(pos)) ++pos;
      emit(pos);
      continue;
    }
    std::size_t ws = 0;
    while (space(pos + ws)) ++ws;
    if (ws > 1 && pos + ws < n) {
      emit(pos + ws - 1);
      continue;
    }
    emit(pos + std::max<std::size_t>(ws, 1));
  }
  return out;
}

}  // namespace tessera::inference::tokenizer
