// The lexer: a template's source split into text and tags (Hugging Face's whitespace control),
// and a tag's inside into tokens.
#include "inference/tokenizer/jinja_impl.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

namespace tessera::inference::tokenizer::jinja::detail {

namespace {

int count_lines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// Where the tag opened at `open` ends (the position of its `close`), outside string literals; npos
// when it never does.
std::size_t tag_end(std::string_view src, std::size_t open, char type, std::string_view close) {
  std::size_t i = open + 2;
  std::size_t end = std::string_view::npos;
  char quote = 0;
  for (; i + 1 < src.size(); ++i) {
    const char c = src[i];
    if (type == '#') {
      if (src.substr(i, 2) == close) {
        end = i;
        break;
      }
      continue;
    }
    if (quote) {
      if (c == '\\')
        ++i;
      else if (c == quote)
        quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      continue;
    }
    if (src.substr(i, 2) == close) {
      end = i;
      break;
    }
  }
  return end;
}

}  // namespace

// Splits the source into text and tags with Hugging Face's settings: trim_blocks (the newline
// after a block or comment tag goes), lstrip_blocks (spaces and tabs before a block or comment
// tag at the start of a line go), `-` strips every whitespace on its side, one trailing newline of
// the template is dropped (keep_trailing_newline is off).
std::vector<segment> split(std::string_view src) {
  if (src.ends_with("\n")) src.remove_suffix(src.ends_with("\r\n") ? 2 : 1);
  std::vector<segment> out;
  std::size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  bool strip_next = false;  // the previous tag ended with '-'
  while (pos < src.size()) {
    std::size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(
        src.substr(pos, open == std::string_view::npos ? src.size() - pos : open - pos));
    if (strip_next) {
      std::size_t k = 0;
      while (k < text.size() && is_space(text[k]))
        ++k;
      text.erase(0, k);
      strip_next = false;
    }
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({segment::kind::text, std::move(text), line});
      break;
    }
    const char type = src[open + 1];
    const char marker = open + 2 < src.size() ? src[open + 2] : '\0';
    if (marker == '-') {
      while (!text.empty() && is_space(text.back()))
        text.pop_back();
    } else if ((type == '%' || type == '#') && marker != '+') {
      const std::size_t nl = text.rfind('\n');
      const std::size_t from = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || line_starting) &&
          std::all_of(text.begin() + static_cast<long>(from), text.end(),
                      [](char c) { return c == ' ' || c == '\t'; }))
        text.erase(from);
    }
    const int text_line = line;
    line += count_lines(src.substr(pos, open - pos));
    if (!text.empty()) out.push_back({segment::kind::text, std::move(text), text_line});
    // Find the tag's end, outside string literals.
    const std::string_view close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    const std::size_t end = tag_end(src, open, type, close);
    if (end == std::string_view::npos)
      fail(line, fmt::format("a tag opened here is never closed with '{}'", close));
    std::size_t inner_from = open + 2, inner_to = end;
    if (inner_from < inner_to && (src[inner_from] == '-' || src[inner_from] == '+')) ++inner_from;
    bool strip_after = false;
    if (inner_to > inner_from && src[inner_to - 1] == '-') {
      strip_after = true;
      --inner_to;
    }
    std::string inner(src.substr(inner_from, inner_to - inner_from));
    if (type != '#')
      out.push_back(
          {type == '{' ? segment::kind::output : segment::kind::stmt, std::move(inner), line});
    line += count_lines(src.substr(open, end + 2 - open));
    pos = end + 2;
    if (strip_after) {
      strip_next = true;
    } else if (type != '{' && pos < src.size() && src[pos] == '\n') {
      ++pos;  // trim_blocks
      ++line;
    }
    line_starting = pos == 0 || src[pos - 1] == '\n';
  }
  return out;
}

std::vector<token> tokenize(std::string_view s, int line) {
  std::vector<token> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
      continue;
    }
    token t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_'))
        ++j;
      t.k = token::kind::name;
      t.text = std::string(s.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_'))
        ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j])))
          ++j;
      }
      std::string num(s.substr(i, j - i));
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      if (is_float) {
        t.k = token::kind::number;
        t.d = std::strtod(num.c_str(), nullptr);
      } else {
        t.k = token::kind::integer;
        auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), t.i);
        if (ec != std::errc()) fail(line, fmt::format("integer '{}' out of range", num));
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      std::size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        switch (e) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '\\':
            v += '\\';
            break;
          case '\'':
            v += '\'';
            break;
          case '"':
            v += '"';
            break;
          default:
            v += '\\';
            v += e;
        }
      }
      if (j >= s.size()) fail(line, "a string literal is never closed");
      t.k = token::kind::string;
      t.text = std::move(v);
      i = j + 1;
    } else {
      static constexpr std::string_view two[] = {"//", "**", "==", "!=", "<=", ">="};
      t.k = token::kind::op;
      for (auto op : two)
        if (s.substr(i, 2) == op) t.text = std::string(op);
      if (t.text.empty()) {
        if (std::string_view("+-*/%~|.,:()[]{}<>=").find(c) == std::string_view::npos)
          fail(line, fmt::format("unexpected character '{}'", c));
        t.text = std::string(1, c);
      }
      i += t.text.size();
    }
    out.push_back(std::move(t));
  }
  out.push_back(token{});
  return out;
}

}  // namespace tessera::inference::tokenizer::jinja::detail
