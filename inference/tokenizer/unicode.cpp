#include "inference/tokenizer/unicode.hpp"

#include <algorithm>
#include <array>

namespace tessera::inference::tokenizer {

namespace {

struct range {
  char32_t lo, hi;
};

// Code points >= U+0100 that are NOT letters: marks, punctuation, symbols, digits, spaces, format
// and private-use characters of the common blocks. Everything else >= U+0100 counts as a letter.
// Sorted, non-overlapping. Approximation: the marks inside Indic and other abugida blocks count as
// letters here (Unicode says Mn/Mc), so those scripts may split differently from the reference
// regex engine; Latin, Greek, Cyrillic, Hebrew, Arabic, CJK, kana, Hangul and emoji are covered.
constexpr range non_letters[] = {
    {0x02C2, 0x02C5}, {0x02D2, 0x02DF}, {0x02E5, 0x02EB}, {0x02ED, 0x02ED}, {0x02EF, 0x036F},
    {0x0375, 0x0375}, {0x037E, 0x037E}, {0x0384, 0x0385}, {0x0387, 0x0387}, {0x03F6, 0x03F6},
    {0x0482, 0x0489}, {0x055A, 0x055F}, {0x0589, 0x058F}, {0x0591, 0x05CF}, {0x05F3, 0x061F},
    {0x064B, 0x066D}, {0x0670, 0x0670}, {0x06D4, 0x06D4}, {0x06D6, 0x06E4}, {0x06E7, 0x06ED},
    {0x06F0, 0x06F9}, {0x06FD, 0x06FE}, {0x0700, 0x070F}, {0x0964, 0x0970}, {0x09E6, 0x09EF},
    {0x0A66, 0x0A6F}, {0x0AE6, 0x0AEF}, {0x0B66, 0x0B6F}, {0x0BE6, 0x0BFA}, {0x0C66, 0x0C6F},
    {0x0CE6, 0x0CEF}, {0x0D66, 0x0D6F}, {0x0DE6, 0x0DEF}, {0x0E3F, 0x0E3F}, {0x0E4F, 0x0E5B},
    {0x0ED0, 0x0ED9}, {0x0F00, 0x0F3F}, {0x1040, 0x1049}, {0x10FB, 0x10FB}, {0x1360, 0x137C},
    {0x1680, 0x1680}, {0x169B, 0x169C}, {0x16EB, 0x16F0}, {0x17D4, 0x17DB}, {0x17E0, 0x17E9},
    {0x1800, 0x180F}, {0x1810, 0x1819}, {0x1AB0, 0x1AFF}, {0x1DC0, 0x1DFF}, {0x1FBD, 0x1FBD},
    {0x1FBF, 0x1FC1}, {0x1FCD, 0x1FCF}, {0x1FDD, 0x1FDF}, {0x1FED, 0x1FEF}, {0x1FFD, 0x1FFE},
    {0x2000, 0x2070}, {0x2072, 0x207E}, {0x2080, 0x208F}, {0x20A0, 0x2101}, {0x2103, 0x2106},
    {0x2108, 0x2109}, {0x2114, 0x2114}, {0x2116, 0x2118}, {0x211E, 0x2123}, {0x2125, 0x2125},
    {0x2127, 0x2127}, {0x2129, 0x2129}, {0x212E, 0x212E}, {0x213A, 0x213B}, {0x2140, 0x2144},
    {0x214A, 0x214D}, {0x214F, 0x2182}, {0x2185, 0x2BFF}, {0x2CE5, 0x2CEA}, {0x2CEF, 0x2CFF},
    {0x2D70, 0x2D70}, {0x2DE0, 0x2E2E}, {0x2E30, 0x2FFF}, {0x3000, 0x3004}, {0x3007, 0x3030},
    {0x3036, 0x303A}, {0x303D, 0x303F}, {0x3099, 0x309C}, {0x30A0, 0x30A0}, {0x30FB, 0x30FB},
    {0x3190, 0x319F}, {0x31C0, 0x31EF}, {0x3200, 0x33FF}, {0x4DC0, 0x4DFF}, {0xA490, 0xA4CF},
    {0xA4FE, 0xA4FF}, {0xA60D, 0xA60F}, {0xA620, 0xA629}, {0xA670, 0xA67E}, {0xA6F0, 0xA6F7},
    {0xA700, 0xA716}, {0xA720, 0xA721}, {0xA789, 0xA78A}, {0xA828, 0xA82F}, {0xA830, 0xA839},
    {0xA874, 0xA877}, {0xA8CE, 0xA8D9}, {0xA900, 0xA909}, {0xA92E, 0xA92F}, {0xA9C1, 0xA9CD},
    {0xA9D0, 0xA9D9}, {0xA9DE, 0xA9DF}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xAA5C, 0xAA5F},
    {0xABF0, 0xABF9}, {0xD800, 0xF8FF}, {0xFB29, 0xFB29}, {0xFD3E, 0xFD3F}, {0xFDFC, 0xFDFF},
    {0xFE00, 0xFE6F}, {0xFEFF, 0xFEFF}, {0xFF00, 0xFF20}, {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65},
    {0xFFE0, 0xFFFF}, {0x10100, 0x1013F}, {0x104A0, 0x104A9}, {0x1D000, 0x1D24F},
    {0x1D2E0, 0x1D37F}, {0x1D7CE, 0x1D7FF}, {0x1EC70, 0x1ECBF}, {0x1F000, 0x1FBFF},
    {0xE0000, 0xE01EF}, {0xF0000, 0x10FFFF},
};

// \p{N} beyond ASCII: decimal digits of the scripts (Nd), letter numbers (Nl) and other numbers
// (No) of the common blocks. Sorted, non-overlapping.
constexpr range numbers[] = {
    {0x00B2, 0x00B3}, {0x00B9, 0x00B9}, {0x00BC, 0x00BE}, {0x0660, 0x0669}, {0x06F0, 0x06F9},
    {0x07C0, 0x07C9}, {0x0966, 0x096F}, {0x09E6, 0x09EF}, {0x09F4, 0x09F9}, {0x0A66, 0x0A6F},
    {0x0AE6, 0x0AEF}, {0x0B66, 0x0B6F}, {0x0B72, 0x0B77}, {0x0BE6, 0x0BF2}, {0x0C66, 0x0C6F},
    {0x0C78, 0x0C7E}, {0x0CE6, 0x0CEF}, {0x0D58, 0x0D5E}, {0x0D66, 0x0D78}, {0x0DE6, 0x0DEF},
    {0x0E50, 0x0E59}, {0x0ED0, 0x0ED9}, {0x0F20, 0x0F33}, {0x1040, 0x1049}, {0x1090, 0x1099},
    {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17E9}, {0x17F0, 0x17F9}, {0x1810, 0x1819},
    {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99}, {0x1B50, 0x1B59},
    {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0x2070, 0x2070}, {0x2074, 0x2079},
    {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF},
    {0x2776, 0x2793}, {0x2CFD, 0x2CFD}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A},
    {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F}, {0x3280, 0x3289},
    {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF}, {0xA830, 0xA835}, {0xA8D0, 0xA8D9},
    {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9},
    {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x104A0, 0x104A9}, {0x1D360, 0x1D378},
    {0x1D7CE, 0x1D7FF}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9},
};

template <std::size_t N>
bool in_ranges(const range (&table)[N], char32_t cp) noexcept {
  auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                             [](char32_t c, const range& r) { return c < r.lo; });
  if (it == std::begin(table)) return false;
  --it;
  return cp >= it->lo && cp <= it->hi;
}

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

bool is_number(char32_t cp) noexcept {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(numbers, cp);
}

bool is_letter(char32_t cp) noexcept {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z');
  if (cp < 0x100)
    return cp == 0xAA || cp == 0xB5 || cp == 0xBA || (cp >= 0xC0 && cp != 0xD7 && cp != 0xF7);
  if (cp > 0x10FFFF) return false;
  return !in_ranges(non_letters, cp) && !is_number(cp) && !is_whitespace(cp);
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
