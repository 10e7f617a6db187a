#include "inference/tokenizer/jinja.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/base/log.hpp"

namespace tessera::inference::tokenizer::jinja {

namespace {

// Bounds: a template is data from a model file (see jinja.hpp).
constexpr std::size_t kMaxSource = 1u << 20;
constexpr std::size_t kMaxDepth = 64;
constexpr std::uint64_t kMaxIterations = 1'000'000;
constexpr std::size_t kMaxOutput = 16u << 20;

// Errors inside the parser and the evaluator unwind to template_program's entry points, which turn
// them into result<> errors: the recursive descent and the recursive evaluation would otherwise
// thread a result through every one of their many small functions. Nothing else throws it.
struct template_error {
  std::string message;
  /// invalid_argument: the template refused its input (raise_exception); unsupported: what the
  /// template asked is beyond this subset or its bounds (the caller may render another way).
  errc code = errc::unsupported;
};

[[noreturn]] void fail(int line, std::string message) {
  throw template_error{line > 0 ? fmt::format("chat template line {}: {}", line, message)
                                : std::move(message)};
}

// Every string a template builds is bounded like its output: `{% set s = s ~ s %}` in a loop would
// otherwise double past any memory.
std::string bounded(std::string s, int line) {
  if (s.size() > kMaxOutput) fail(line, fmt::format("a string of more than {} bytes", kMaxOutput));
  return s;
}

}  // namespace

// ------------------------------------------------------------------ values

value value::none() {
  value v;
  v.kind_ = kind::none;
  return v;
}
value::value(bool b) : kind_(kind::boolean), b_(b) {}
value::value(std::int64_t i) : kind_(kind::integer), i_(i) {}
value::value(double d) : kind_(kind::number), d_(d) {}
value::value(std::string s) : kind_(kind::string), s_(std::move(s)) {}
value::value(array a) : kind_(kind::array), a_(std::make_shared<array>(std::move(a))) {}
value::value(object o) : kind_(kind::object), o_(std::make_shared<object>(std::move(o))) {}
value::value(function f) : kind_(kind::function), f_(std::make_shared<function>(std::move(f))) {}

bool value::truthy() const noexcept {
  switch (kind_) {
    case kind::undefined:
    case kind::none:
      return false;
    case kind::boolean:
      return b_;
    case kind::integer:
      return i_ != 0;
    case kind::number:
      return d_ != 0;
    case kind::string:
      return !s_.empty();
    case kind::array:
      return !a_->empty();
    case kind::object:
      return !o_->empty();
    case kind::function:
      return true;
  }
  return false;
}

const value* value::find(std::string_view key) const {
  if (kind_ != kind::object) return nullptr;
  for (const auto& [k, v] : *o_)
    if (k == key) return &v;
  return nullptr;
}

void value::set(std::string key, value v) const {
  for (auto& [k, old] : *o_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  o_->emplace_back(std::move(key), std::move(v));
}

namespace {

template <class Json>
value json_to_value(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return value::none();
    case nlohmann::json::value_t::boolean:
      return value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return value(j.template get<std::int64_t>());
    case nlohmann::json::value_t::number_float:
      return value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      array a;
      for (const auto& e : j)
        a.push_back(json_to_value(e));
      return value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      object o;
      for (const auto& [k, e] : j.items())
        o.emplace_back(k, json_to_value(e));
      return value(std::move(o));
    }
    default:
      return value();
  }
}

}  // namespace

value from_json(const nlohmann::json& j) {
  return json_to_value(j);
}
value from_json(const nlohmann::ordered_json& j) {
  return json_to_value(j);
}

namespace {

std::string float_text(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);  // shortest round trip, as repr()
  std::string s(buf, end);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string repr(const value& v, std::size_t depth);
std::string text_of(const value& v, std::size_t depth);

std::string string_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == q) {
          out += '\\';
          out += c;
        } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += q;
  return out;
}

std::string repr(const value& v, std::size_t depth) {
  if (v.is_string()) return string_repr(v.str());
  return text_of(v, depth);
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  out += log::json_escape(s);  // ensure_ascii=False: UTF-8 as it is
  out += '"';
}

void json_dump(std::string& out, const value& v, int indent, int level) {
  if (static_cast<std::size_t>(level) > kMaxDepth) {  // a list that holds itself
    out += "null";
    return;
  }
  const auto newline = [&](int l) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent * l), ' ');
  };
  switch (v.type()) {
    case value::kind::undefined:
    case value::kind::none:
      out += "null";
      return;
    case value::kind::boolean:
      out += v.boolean() ? "true" : "false";
      return;
    case value::kind::integer:
      out += std::to_string(v.integer());
      return;
    case value::kind::number: {
      const double d = v.number();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : float_text(d);
      return;
    }
    case value::kind::string:
      json_string(out, v.str());
      return;
    case value::kind::array: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const auto& e : v.items()) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        json_dump(out, e, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case value::kind::object: {
      if (v.fields().empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.fields()) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        json_string(out, k);
        out += ": ";
        json_dump(out, e, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
    case value::kind::function:
      out += "null";
      return;
  }
}

}  // namespace

namespace {

// Python's str(); a list that holds itself (l.append(l)) prints "[...]" where Python's does, here
// past kMaxDepth levels.
std::string text_of(const value& v, std::size_t depth) {
  switch (v.type()) {
    case value::kind::undefined:
      return "";
    case value::kind::none:
      return "None";
    case value::kind::boolean:
      return v.boolean() ? "True" : "False";
    case value::kind::integer:
      return std::to_string(v.integer());
    case value::kind::number:
      return float_text(v.number());
    case value::kind::string:
      return v.str();
    case value::kind::array: {
      if (depth > kMaxDepth) return "[...]";
      std::string out = "[";
      for (std::size_t i = 0; i < v.items().size(); ++i)
        out += (i ? ", " : "") + repr(v.items()[i], depth + 1);
      return out + "]";
    }
    case value::kind::object: {
      if (depth > kMaxDepth) return "{...}";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.fields()) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + repr(e, depth + 1);
        first = false;
      }
      return out + "}";
    }
    case value::kind::function:
      return "<function>";
  }
  return "";
}

}  // namespace

std::string to_text(const value& v) {
  return text_of(v, 0);
}

std::string to_json_text(const value& v, int indent) {
  std::string out;
  json_dump(out, v, indent, 0);
  return out;
}

// ------------------------------------------------------------------ syntax tree

namespace {

struct token {
  enum class kind : std::uint8_t { name, string, integer, number, op, end } k = kind::end;
  std::string text;
  std::int64_t i = 0;
  double d = 0;
};

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
  enum class op : std::uint8_t {
    literal,
    name,
    list,
    dict,
    attr,
    index,
    slice,
    call,
    filter,
    test,
    not_,
    neg,
    binary,
    and_,
    or_,
    ternary
  };
  op k = op::literal;
  int line = 0;
  value lit;
  std::string name;            // name, attr, filter, test, binary operator
  bool negate = false;         // `is not`
  std::vector<expr_ptr> args;  // operands; list items; dict keys and values alternating
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
};

}  // namespace

struct node {
  enum class type : std::uint8_t {
    text,
    output,
    if_,
    for_,
    set,
    set_block,
    macro,
    break_,
    continue_
  };
  type t = type::text;
  int line = 0;
  std::string text;                  // text; set's name; macro's name
  std::string attr;                  // set ns.attr
  expr_ptr e;                        // output; set's value; for's iterable
  expr_ptr cond;                     // for's filter
  std::vector<std::string> targets;  // for's names
  std::vector<std::pair<expr_ptr, std::vector<node>>> branches;  // if / elif
  std::vector<node> body, else_body;
  std::vector<std::pair<std::string, expr_ptr>> params;  // macro's, with defaults (may be null)
};

namespace {

// ------------------------------------------------------------------ lexer

struct segment {
  enum class kind : std::uint8_t { text, output, stmt } k = kind::text;
  std::string text;
  int line = 1;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int count_lines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

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

// ------------------------------------------------------------------ parser

class expr_parser {
 public:
  expr_parser(std::vector<token> toks, int line) : t_(std::move(toks)), line_(line) {}

  [[nodiscard]] const token& peek(std::size_t ahead = 0) const {
    return t_[std::min(pos_ + ahead, t_.size() - 1)];
  }
  bool at_end() const { return peek().k == token::kind::end; }
  bool is_op(std::string_view op, std::size_t ahead = 0) const {
    return peek(ahead).k == token::kind::op && peek(ahead).text == op;
  }
  bool is_name(std::string_view n, std::size_t ahead = 0) const {
    return peek(ahead).k == token::kind::name && peek(ahead).text == n;
  }
  token next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail(line_, fmt::format("expected '{}', found '{}'", op, describe(peek())));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().k != token::kind::name)
      fail(line_, fmt::format("expected a name, found '{}'", describe(peek())));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, fmt::format("unexpected '{}'", describe(peek())));
  }
  static std::string describe(const token& t) {
    return t.k == token::kind::end ? "end of tag" : t.text.empty() ? "literal" : t.text;
  }

  expr_ptr expression() {
    if (++depth_ > kMaxDepth) fail(line_, "expression nested too deeply");
    auto e = ternary();
    --depth_;
    return e;
  }

  // An expression, or several separated by commas (a tuple, as a list).
  expr_ptr tuple_or_expression() {
    auto first = expression();
    if (!is_op(",")) return first;
    auto l = make(expr::op::list);
    l->args.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (at_end() || is_op(")")) break;
      l->args.push_back(expression());
    }
    return l;
  }

 private:
  expr_ptr make(expr::op k) {
    auto e = std::make_unique<expr>();
    e->k = k;
    e->line = line_;
    return e;
  }
  expr_ptr binary(std::string op, expr_ptr l, expr_ptr r) {
    auto e = make(expr::op::binary);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  expr_ptr ternary() {
    auto body = or_expr();
    if (!is_name("if")) return body;
    ++pos_;
    auto e = make(expr::op::ternary);
    auto cond = or_expr();
    expr_ptr other;
    if (is_name("else")) {
      ++pos_;
      other = ternary();
    } else {
      other = make(expr::op::literal);  // undefined
    }
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(body));
    e->args.push_back(std::move(other));
    return e;
  }
  expr_ptr or_expr() {
    auto l = and_expr();
    while (is_name("or")) {
      ++pos_;
      auto e = make(expr::op::or_);
      e->args.push_back(std::move(l));
      e->args.push_back(and_expr());
      l = std::move(e);
    }
    return l;
  }
  expr_ptr and_expr() {
    auto l = not_expr();
    while (is_name("and")) {
      ++pos_;
      auto e = make(expr::op::and_);
      e->args.push_back(std::move(l));
      e->args.push_back(not_expr());
      l = std::move(e);
    }
    return l;
  }
  expr_ptr not_expr() {
    if (is_name("not")) {
      ++pos_;
      auto e = make(expr::op::not_);
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  expr_ptr compare() {
    auto l = math1();
    for (;;) {
      static constexpr std::string_view ops[] = {"==", "!=", "<", ">", "<=", ">="};
      std::string op;
      for (auto o : ops)
        if (is_op(o)) op = std::string(o);
      if (!op.empty()) {
        ++pos_;
      } else if (is_name("in")) {
        ++pos_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        return l;
      }
      l = binary(op, std::move(l), math1());
    }
  }
  expr_ptr math1() {
    auto l = concat();
    while (is_op("+") || is_op("-")) {
      auto op = next().text;
      l = binary(op, std::move(l), concat());
    }
    return l;
  }
  expr_ptr concat() {
    auto l = math2();
    while (is_op("~")) {
      ++pos_;
      l = binary("~", std::move(l), math2());
    }
    return l;
  }
  expr_ptr math2() {
    auto l = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto op = next().text;
      l = binary(op, std::move(l), power());
    }
    return l;
  }
  expr_ptr power() {
    auto l = unary();
    while (is_op("**")) {
      ++pos_;
      l = binary("**", std::move(l), unary());
    }
    return l;
  }
  expr_ptr unary() {
    if (is_op("-")) {
      ++pos_;
      auto e = make(expr::op::neg);
      e->args.push_back(unary());
      return e;
    }
    if (is_op("+")) {
      ++pos_;
      return unary();
    }
    return filters(postfix(primary()));
  }

  void call_arguments(expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().k == token::kind::name && is_op("=", 1)) {
        std::string k = next().text;
        ++pos_;
        e.kwargs.emplace_back(std::move(k), expression());
      } else {
        e.args.push_back(expression());
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }

  expr_ptr primary() {
    const token& t = peek();
    if (t.k == token::kind::string) {
      std::string s;
      while (peek().k == token::kind::string)
        s += next().text;  // adjacent literals join
      auto e = make(expr::op::literal);
      e->lit = value(std::move(s));
      return e;
    }
    if (t.k == token::kind::integer || t.k == token::kind::number) {
      auto e = make(expr::op::literal);
      e->lit = t.k == token::kind::integer ? value(t.i) : value(t.d);
      ++pos_;
      return e;
    }
    if (t.k == token::kind::name) {
      const std::string n = next().text;
      auto e = make(expr::op::literal);
      if (n == "true" || n == "True")
        e->lit = value(true);
      else if (n == "false" || n == "False")
        e->lit = value(false);
      else if (n == "none" || n == "None")
        e->lit = value::none();
      else {
        e->k = expr::op::name;
        e->name = n;
      }
      return e;
    }
    if (is_op("(")) {
      ++pos_;
      if (is_op(")")) {
        ++pos_;
        return make(expr::op::list);
      }
      auto e = tuple_or_expression();
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++pos_;
      auto e = make(expr::op::list);
      while (!is_op("]")) {
        e->args.push_back(expression());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      ++pos_;
      auto e = make(expr::op::dict);
      while (!is_op("}")) {
        e->args.push_back(expression());
        expect_op(":");
        e->args.push_back(expression());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("}");
      return e;
    }
    fail(line_, fmt::format("unexpected '{}'", describe(t)));
  }

  expr_ptr postfix(expr_ptr e) {
    for (;;) {
      if (is_op(".")) {
        ++pos_;
        auto a = make(expr::op::attr);
        if (peek().k == token::kind::integer) {  // x.0: an item
          a->k = expr::op::index;
          auto idx = make(expr::op::literal);
          idx->lit = value(next().i);
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
        } else {
          a->name = expect_name();
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        ++pos_;
        expr_ptr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = expression();
          if (k < 2 && is_op(":")) {
            ++pos_;
            slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        auto s = make(slice ? expr::op::slice : expr::op::index);
        s->args.push_back(std::move(e));
        if (slice) {
          for (auto& p : parts)
            s->args.push_back(std::move(p));  // null: omitted
        } else {
          if (!parts[0]) fail(line_, "an empty subscript");
          s->args.push_back(std::move(parts[0]));
        }
        e = std::move(s);
      } else if (is_op("(")) {
        auto c = make(expr::op::call);
        c->args.push_back(std::move(e));
        call_arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  expr_ptr filters(expr_ptr e) {
    for (;;) {
      if (is_op("|")) {
        ++pos_;
        auto f = make(expr::op::filter);
        f->name = expect_name();
        f->args.push_back(std::move(e));
        if (is_op("(")) call_arguments(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++pos_;
        auto t = make(expr::op::test);
        if (is_name("not")) {
          ++pos_;
          t->negate = true;
        }
        // `none`, `true` and `false` are names here (tests), not literals.
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          call_arguments(*t);
        } else {
          const token& a = peek();
          const bool starts_arg =
              (a.k == token::kind::name && a.text != "else" && a.text != "or" && a.text != "and" &&
               a.text != "if" && a.text != "is" && a.text != "in" && a.text != "not") ||
              a.k == token::kind::string || a.k == token::kind::integer ||
              a.k == token::kind::number || is_op("[") || is_op("{");
          if (starts_arg) t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<token> t_;
  std::size_t pos_ = 0;
  int line_;
  std::size_t depth_ = 0;
};

class stmt_parser {
 public:
  explicit stmt_parser(std::vector<segment> segs) : segs_(std::move(segs)) {}

  std::vector<node> parse() {
    std::vector<node> body;
    auto end = block(body, {});
    if (!end.empty()) fail(line_, fmt::format("'{}' without its opening tag", end));
    return body;
  }

 private:
  // Parses into `out` until a statement whose keyword is in `until` (returned, its parser left
  // in `last_`), or the end of the template ("" returned).
  std::string block(std::vector<node>& out, std::initializer_list<std::string_view> until) {
    if (++depth_ > kMaxDepth) fail(line_, "blocks nested too deeply");
    while (pos_ < segs_.size()) {
      const segment& s = segs_[pos_++];
      line_ = s.line;
      if (s.k == segment::kind::text) {
        node n;
        n.t = node::type::text;
        n.text = s.text;
        out.push_back(std::move(n));
        continue;
      }
      expr_parser p(tokenize(s.text, s.line), s.line);
      if (s.k == segment::kind::output) {
        node n;
        n.t = node::type::output;
        n.line = s.line;
        n.e = p.expression();
        p.expect_end();
        out.push_back(std::move(n));
        continue;
      }
      const std::string kw = p.expect_name();
      if (std::find(until.begin(), until.end(), kw) != until.end()) {
        last_.emplace(std::move(p));
        --depth_;
        return kw;
      }
      out.push_back(statement(kw, p, s.line));
    }
    if (until.size() != 0) {
      std::string names;
      std::size_t i = 0;
      for (auto u : until)
        names += fmt::format("{}'{}'", i++ == 0 ? "" : i == until.size() ? " or " : ", ", u);
      fail(line_, fmt::format("the template ends inside a block: {} expected", names));
    }
    --depth_;
    return {};
  }

  expr_parser take_last() {
    expr_parser p = std::move(*last_);
    last_.reset();
    return p;
  }

  node statement(const std::string& kw, expr_parser& p, int line) {
    node n;
    n.line = line;
    if (kw == "if") {
      n.t = node::type::if_;
      expr_ptr cond = p.expression();
      p.expect_end();
      for (;;) {
        std::vector<node> body;
        const std::string end = block(body, {"elif", "else", "endif"});
        n.branches.emplace_back(std::move(cond), std::move(body));
        expr_parser q = take_last();
        if (end == "elif") {
          cond = q.expression();
          q.expect_end();
          continue;
        }
        q.expect_end();
        if (end == "else") {
          if (block(n.else_body, {"endif"}).empty()) fail(line, "'if' without 'endif'");
          take_last().expect_end();
        }
        return n;
      }
    }
    if (kw == "for") {
      n.t = node::type::for_;
      n.targets.push_back(p.expect_name());
      while (p.is_op(",")) {
        p.next();
        n.targets.push_back(p.expect_name());
      }
      if (!p.is_name("in")) fail(line, "'for' without 'in'");
      p.next();
      // The iterable stops before a trailing `if` (a loop filter), so parse below the ternary.
      n.e = parse_iterable(p, line);
      if (p.is_name("if")) {
        p.next();
        n.cond = p.expression();
      }
      if (p.is_name("recursive")) fail(line, "recursive loops are not supported");
      p.expect_end();
      const std::string end = block(n.body, {"else", "endfor"});
      take_last().expect_end();
      if (end == "else") {
        block(n.else_body, {"endfor"});
        take_last().expect_end();
      }
      return n;
    }
    if (kw == "set") {
      n.t = node::type::set;
      n.text = p.expect_name();
      if (p.is_op(".")) {
        p.next();
        n.attr = p.expect_name();
      }
      if (p.at_end()) {
        n.t = node::type::set_block;
        block(n.body, {"endset"});
        take_last().expect_end();
        return n;
      }
      p.expect_op("=");
      n.e = p.tuple_or_expression();
      p.expect_end();
      return n;
    }
    if (kw == "macro") {
      n.t = node::type::macro;
      n.text = p.expect_name();
      p.expect_op("(");
      while (!p.is_op(")")) {
        std::string name = p.expect_name();
        expr_ptr def;
        if (p.is_op("=")) {
          p.next();
          def = p.expression();
        }
        n.params.emplace_back(std::move(name), std::move(def));
        if (!p.is_op(",")) break;
        p.next();
      }
      p.expect_op(")");
      p.expect_end();
      block(n.body, {"endmacro"});
      take_last().expect_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      n.t = kw == "break" ? node::type::break_ : node::type::continue_;
      p.expect_end();
      return n;
    }
    fail(line, fmt::format("unknown or unsupported tag '{}'", kw));
  }

  static expr_ptr parse_iterable(expr_parser& p, int line) {
    // `for x in a if c`: the `if` outside brackets is the loop's filter, not a ternary without
    // else, so the iterable is parsed from the tokens before it.
    std::vector<token> toks;
    int depth = 0;
    while (!p.at_end() && !(depth == 0 && (p.is_name("if") || p.is_name("recursive")))) {
      if (p.is_op("(") || p.is_op("[") || p.is_op("{")) ++depth;
      if (p.is_op(")") || p.is_op("]") || p.is_op("}")) --depth;
      toks.push_back(p.next());
    }
    toks.push_back(token{});
    expr_parser sub(std::move(toks), line);
    auto e = sub.tuple_or_expression();
    sub.expect_end();
    return e;
  }

  std::vector<segment> segs_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::size_t depth_ = 0;
  std::optional<expr_parser> last_;
};

}  // namespace

// ------------------------------------------------------------------ evaluation

namespace {

enum class flow : std::uint8_t { normal, break_, continue_ };

std::string type_name(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
      return "undefined";
    case value::kind::none:
      return "none";
    case value::kind::boolean:
      return "boolean";
    case value::kind::integer:
      return "integer";
    case value::kind::number:
      return "float";
    case value::kind::string:
      return "string";
    case value::kind::array:
      return "list";
    case value::kind::object:
      return "dict";
    case value::kind::function:
      return "function";
  }
  return "?";
}

bool equal(const value& a, const value& b, std::size_t depth = 0) {
  if (depth > kMaxDepth) return false;  // a list that holds itself
  const auto numeric = [](const value& v) {
    return v.is_number() || v.type() == value::kind::boolean;
  };
  if (numeric(a) && numeric(b)) {
    const auto n = [](const value& v) {
      return v.type() == value::kind::boolean ? (v.boolean() ? 1.0 : 0.0) : v.number();
    };
    return n(a) == n(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array() && &a.items() == &b.items()) return true;  // the same list, as Python says
  if (a.is_object() && &a.fields() == &b.fields()) return true;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none:
      return true;
    case value::kind::string:
      return a.str() == b.str();
    case value::kind::array: {
      if (a.items().size() != b.items().size()) return false;
      for (std::size_t i = 0; i < a.items().size(); ++i)
        if (!equal(a.items()[i], b.items()[i], depth + 1)) return false;
      return true;
    }
    case value::kind::object: {
      if (a.fields().size() != b.fields().size()) return false;
      for (const auto& [k, v] : a.fields()) {
        const value* o = b.find(k);
        if (o == nullptr || !equal(v, *o, depth + 1)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

std::size_t code_points(const std::string& s) {
  std::size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

std::string strip_chars(const std::string& s, const value& chars, bool left, bool right) {
  const std::string set = chars.is_string() ? chars.str() : std::string(" \t\n\r\v\f");
  std::size_t b = 0, e = s.size();
  if (left)
    while (b < e && set.find(s[b]) != std::string::npos)
      ++b;
  if (right)
    while (e > b && set.find(s[e - 1]) != std::string::npos)
      --e;
  return s.substr(b, e - b);
}

std::string title_case(const std::string& s, bool every_word) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (alpha && start)
      c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    else if (alpha)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (every_word)
      start = !alpha;
    else if (alpha)
      start = false;
  }
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to,
                        std::int64_t count) {
  if (from.empty()) return s;
  std::size_t pos = 0;
  for (std::int64_t n = 0; count < 0 || n < count; ++n) {
    pos = s.find(from, pos);
    if (pos == std::string::npos) break;
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

std::vector<std::string> split_text(const std::string& s, const value& sep, std::int64_t max) {
  std::vector<std::string> out;
  if (!sep.is_string()) {  // runs of whitespace, none at the ends
    std::size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space(s[i]))
        ++i;
      if (i >= s.size()) break;
      if (max >= 0 && static_cast<std::int64_t>(out.size()) == max) {
        std::string rest = s.substr(i);
        while (!rest.empty() && is_space(rest.back()))
          rest.pop_back();
        out.push_back(rest);
        break;
      }
      std::size_t j = i;
      while (j < s.size() && !is_space(s[j]))
        ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep.str();
  if (d.empty()) fail(0, "split(): empty separator");
  std::size_t i = 0;
  for (;;) {
    const std::size_t j = s.find(d, i);
    if (j == std::string::npos || (max >= 0 && static_cast<std::int64_t>(out.size()) == max)) {
      out.push_back(s.substr(i));
      break;
    }
    out.push_back(s.substr(i, j - i));
    i = j + d.size();
  }
  return out;
}

// Python's slice of n items: the indices it selects.
std::vector<std::size_t> slice_indices(std::size_t n, const value& a, const value& b,
                                       const value& c) {
  const std::int64_t len = static_cast<std::int64_t>(n);
  const std::int64_t step = c.is_number() ? c.integer() : 1;
  if (step == 0) fail(0, "slice step cannot be zero");
  auto clamp = [&](const value& v, std::int64_t dflt, bool is_start) {
    if (!v.is_number()) return dflt;
    std::int64_t x = v.integer();
    if (x < 0) x += len;
    if (step > 0) return std::clamp<std::int64_t>(x, 0, len);
    (void)is_start;
    return std::clamp<std::int64_t>(x, -1, len - 1);
  };
  const std::int64_t start = clamp(a, step > 0 ? 0 : len - 1, true);
  const std::int64_t stop = clamp(b, step > 0 ? len : -1, false);
  std::vector<std::size_t> out;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop;) {
    out.push_back(static_cast<std::size_t>(i));
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return out;
}

const value& arg(const call_args& a, std::size_t i, std::string_view kw) {
  static const value undefined;
  if (i < a.positional.size()) return a.positional[i];
  for (const auto& [k, v] : a.keyword)
    if (k == kw) return v;
  return undefined;
}

// Whether `v` is, or holds, the list or dict at `container`. Lists and dicts are shared pointers:
// one that held itself would never be freed, so the mutations that could make a cycle (append,
// setting a namespace's attribute, update) refuse it. Python would allow it; no template needs it.
bool holds(const value& v, const void* container, std::size_t depth = 0) {
  if (depth > kMaxDepth) return true;  // deeper than any value a template builds: refuse
  if (v.is_array()) {
    if (&v.items() == container) return true;
    for (const auto& x : v.items())
      if (holds(x, container, depth + 1)) return true;
  }
  if (v.is_object()) {
    if (&v.fields() == container) return true;
    for (const auto& [k, x] : v.fields())
      if (holds(x, container, depth + 1)) return true;
  }
  return false;
}

class renderer {
 public:
  explicit renderer(const object& globals) {
    scopes_.emplace_back();
    install_builtins();
    for (const auto& [k, v] : globals)
      scopes_.front()[k] = v;
  }

  std::string run(const std::vector<node>& body) {
    exec(body);
    return std::move(out_);
  }

 private:
  using scope = std::unordered_map<std::string, value>;

  void install_builtins() {
    auto& g = scopes_.front();
    g["range"] = value(function([](const call_args& a) -> result<value> {
      std::int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].integer();
      } else if (a.positional.size() >= 2) {
        start = a.positional[0].integer();
        stop = a.positional[1].integer();
        if (a.positional.size() > 2) step = a.positional[2].integer();
      }
      if (step == 0) return make_error(errc::unsupported, "range(): step is zero");
      array out;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (out.size() >= kMaxIterations)
          return make_error(errc::unsupported, "range(): more than {} items", kMaxIterations);
        out.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;  // past the 64-bit range: the end
      }
      return value(std::move(out));
    }));
    const auto keywords = [](const call_args& a) -> result<value> {
      object o;
      for (const auto& [k, v] : a.keyword)
        o.emplace_back(k, v);
      return value(std::move(o));
    };
    g["namespace"] = value(function(keywords));
    g["dict"] = value(function(keywords));
    g["raise_exception"] = value(function([](const call_args& a) -> result<value> {
      return make_error(errc::invalid_argument, "{}", to_text(arg(a, 0, "message")));
    }));
    g["strftime_now"] = value(function([](const call_args& a) -> result<value> {
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::size_t n =
          std::strftime(buf, sizeof buf, to_text(arg(a, 0, "format")).c_str(), &tm);
      return value(std::string(buf, n));
    }));
  }

  value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return value();
  }

  void emit(const std::string& s) {
    out_ += s;
    if (out_.size() > kMaxOutput)
      fail(0, fmt::format("the rendered prompt passes {} bytes", kMaxOutput));
  }

  flow exec(const std::vector<node>& body) {
    for (const auto& n : body) {
      const flow f = exec(n);
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  flow exec(const node& n) {
    switch (n.t) {
      case node::type::text:
        emit(n.text);
        return flow::normal;
      case node::type::output:
        emit(to_text(eval(*n.e)));
        return flow::normal;
      case node::type::if_:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond).truthy()) return exec(body);
        return exec(n.else_body);
      case node::type::for_:
        return exec_for(n);
      case node::type::set:
        assign(n, eval(*n.e));
        return flow::normal;
      case node::type::set_block: {
        std::string saved = std::move(out_);
        out_.clear();
        exec(n.body);
        std::string text = std::move(out_);
        out_ = std::move(saved);
        assign(n, value(std::move(text)));
        return flow::normal;
      }
      case node::type::macro:
        define_macro(n);
        return flow::normal;
      case node::type::break_:
        return flow::break_;
      case node::type::continue_:
        return flow::continue_;
    }
    return flow::normal;
  }

  void assign(const node& n, value v) {
    if (n.attr.empty()) {
      scopes_.back()[n.text] = std::move(v);
      return;
    }
    const value target = lookup(n.text);
    if (!target.is_object())
      fail(n.line, fmt::format("cannot set '{}.{}': '{}' is a {}, not a namespace", n.text, n.attr,
                               n.text, type_name(target)));
    if (holds(v, &target.fields()))
      fail(n.line, fmt::format("'{}.{}' would hold '{}' itself", n.text, n.attr, n.text));
    target.set(n.attr, std::move(v));
  }

  void define_macro(const node& n) {
    const node* m = &n;
    scopes_.back()[n.text] = value(function([this, m](const call_args& a) -> result<value> {
      if (macro_depth_ >= kMaxDepth)
        return make_error(errc::unsupported,
                          "chat template line {}: macros call each other "
                          "more than {} deep",
                          m->line, kMaxDepth);
      ++macro_depth_;
      scope s;
      for (std::size_t i = 0; i < m->params.size(); ++i) {
        const auto& [name, def] = m->params[i];
        value v = arg(a, i, name);
        if (v.is_undefined() && def) v = eval(*def);
        s[name] = std::move(v);
      }
      std::string saved = std::move(out_);
      out_.clear();
      scopes_.push_back(std::move(s));
      exec(m->body);
      scopes_.pop_back();
      --macro_depth_;
      std::string text = std::move(out_);
      out_ = std::move(saved);
      return value(std::move(text));
    }));
  }

  static array iterate(const value& v, int line) {
    switch (v.type()) {
      case value::kind::array:
        return v.items();
      case value::kind::object: {
        array keys;
        for (const auto& [k, e] : v.fields())
          keys.emplace_back(k);
        return keys;
      }
      case value::kind::string: {
        array chars;
        const std::string& s = v.str();
        for (std::size_t i = 0; i < s.size();) {
          std::size_t len = 1;
          while (i + len < s.size() && (static_cast<unsigned char>(s[i + len]) & 0xC0) == 0x80)
            ++len;
          chars.emplace_back(s.substr(i, len));
          i += len;
        }
        return chars;
      }
      case value::kind::undefined:
      case value::kind::none:
        return {};
      default:
        fail(line, fmt::format("a {} is not iterable", type_name(v)));
    }
  }

  flow exec_for(const node& n) {
    array items = iterate(eval(*n.e), n.line);
    auto bind = [&](scope& s, const value& item) {
      if (n.targets.size() == 1) {
        s[n.targets[0]] = item;
        return;
      }
      if (!item.is_array() || item.items().size() != n.targets.size())
        fail(n.line,
             fmt::format("cannot unpack a {} into {} names", type_name(item), n.targets.size()));
      for (std::size_t i = 0; i < n.targets.size(); ++i)
        s[n.targets[i]] = item.items()[i];
    };
    if (n.cond) {  // the loop filter runs before loop.* counts
      array kept;
      for (const auto& item : items) {
        scope s;
        bind(s, item);
        scopes_.push_back(std::move(s));
        const bool keep = eval(*n.cond).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body);
    const auto len = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < len; ++i) {
      if (++iterations_ > kMaxIterations)
        fail(n.line, fmt::format("more than {} loop iterations", kMaxIterations));
      scope s;
      bind(s, items[static_cast<std::size_t>(i)]);
      object loop;
      loop.emplace_back("index", value(i + 1));
      loop.emplace_back("index0", value(i));
      loop.emplace_back("revindex", value(len - i));
      loop.emplace_back("revindex0", value(len - i - 1));
      loop.emplace_back("first", value(i == 0));
      loop.emplace_back("last", value(i == len - 1));
      loop.emplace_back("length", value(len));
      loop.emplace_back("previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)] : value());
      loop.emplace_back("nextitem", i + 1 < len ? items[static_cast<std::size_t>(i + 1)] : value());
      s["loop"] = value(std::move(loop));
      scopes_.push_back(std::move(s));
      const flow f = exec(n.body);
      scopes_.pop_back();
      if (f == flow::break_) break;
    }
    return flow::normal;
  }

  value call(const value& f, const call_args& a, int line) {
    if (f.type() != value::kind::function)
      fail(line, fmt::format("a {} is not callable", type_name(f)));
    auto r = f.fn()(a);
    if (!r) throw template_error{r.error().message, r.error().code};
    return std::move(*r);
  }

  call_args arguments(const expr& e, std::size_t skip) {
    call_args a;
    for (std::size_t i = skip; i < e.args.size(); ++i)
      a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs)
      a.keyword.emplace_back(k, eval(*v));
    return a;
  }

  value eval(const expr& e) {
    switch (e.k) {
      case expr::op::literal:
        return e.lit;
      case expr::op::name:
        return lookup(e.name);
      case expr::op::list: {
        array a;
        for (const auto& x : e.args)
          a.push_back(eval(*x));
        return value(std::move(a));
      }
      case expr::op::dict: {
        object o;
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const std::string k = to_text(eval(*e.args[i]));
          value v = eval(*e.args[i + 1]);
          auto it = std::find_if(o.begin(), o.end(), [&](const auto& f) { return f.first == k; });
          if (it != o.end())
            it->second = std::move(v);
          else
            o.emplace_back(k, std::move(v));
        }
        return value(std::move(o));
      }
      case expr::op::attr:
        return attribute(eval(*e.args[0]), e.name, e.line);
      case expr::op::index:
        return item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case expr::op::slice: {
        const value v = eval(*e.args[0]);
        const value a = e.args[1] ? eval(*e.args[1]) : value();
        const value b = e.args[2] ? eval(*e.args[2]) : value();
        const value c = e.args[3] ? eval(*e.args[3]) : value();
        if (v.is_string()) {
          std::string out;
          for (auto i : slice_indices(v.str().size(), a, b, c))
            out += v.str()[i];
          return value(std::move(out));
        }
        if (v.is_array()) {
          array out;
          for (auto i : slice_indices(v.items().size(), a, b, c))
            out.push_back(v.items()[i]);
          return value(std::move(out));
        }
        fail(e.line, fmt::format("cannot slice a {}", type_name(v)));
      }
      case expr::op::call:
        return call(eval(*e.args[0]), arguments(e, 1), e.line);
      case expr::op::filter:
        return filter(e.name, eval(*e.args[0]), arguments(e, 1), e.line);
      case expr::op::test: {
        const bool r = test(e.name, eval(*e.args[0]), arguments(e, 1), e.line);
        return value(e.negate ? !r : r);
      }
      case expr::op::not_:
        return value(!eval(*e.args[0]).truthy());
      case expr::op::neg: {
        const value v = eval(*e.args[0]);
        if (v.type() == value::kind::integer) {
          if (v.integer() == std::numeric_limits<std::int64_t>::min())
            fail(e.line, "integer overflow in '-'");
          return value(-v.integer());
        }
        if (v.is_number()) return value(-v.number());
        fail(e.line, fmt::format("cannot negate a {}", type_name(v)));
      }
      case expr::op::and_: {
        value l = eval(*e.args[0]);
        return l.truthy() ? eval(*e.args[1]) : l;
      }
      case expr::op::or_: {
        value l = eval(*e.args[0]);
        return l.truthy() ? l : eval(*e.args[1]);
      }
      case expr::op::ternary:
        return eval(*e.args[0]).truthy() ? eval(*e.args[1]) : eval(*e.args[2]);
      case expr::op::binary:
        return binary(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
    }
    return value();
  }

  static value item(const value& v, const value& key, int line) {
    if (v.is_array() || v.is_string()) {
      if (key.type() != value::kind::integer) {
        if (v.is_array()) return value();
        fail(line, fmt::format("a string index must be an integer, not a {}", type_name(key)));
      }
      const auto n = static_cast<std::int64_t>(v.is_array() ? v.items().size() : v.str().size());
      std::int64_t i = key.integer();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return value();
      if (v.is_array()) return v.items()[static_cast<std::size_t>(i)];
      return value(std::string(1, v.str()[static_cast<std::size_t>(i)]));
    }
    if (v.is_object()) {
      const value* f = v.find(to_text(key));
      return f ? *f : attribute(v, to_text(key), line);
    }
    return value();
  }

  static value method(const value& self, const std::string& name);

  static value attribute(const value& v, const std::string& name, int line) {
    (void)line;
    if (v.is_object()) {
      if (const value* f = v.find(name)) return *f;
    }
    return method(v, name);
  }

  value binary(const std::string& op, const value& a, const value& b, int line) {
    if (op == "==") return value(equal(a, b));
    if (op == "!=") return value(!equal(a, b));
    if (op == "~") return value(bounded(to_text(a) + to_text(b), line));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        found = b.str().find(to_text(a)) != std::string::npos;
      } else if (b.is_array()) {
        for (const auto& x : b.items())
          found = found || equal(a, x);
      } else if (b.is_object()) {
        found = b.find(to_text(a)) != nullptr;
      } else if (!b.is_undefined() && !b.is_none()) {
        fail(line,
             fmt::format("'in' needs a string, list or dict on its right, not a {}", type_name(b)));
      }
      return value(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (a.is_number() && b.is_number()) {
        c = a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
      } else if (a.is_string() && b.is_string()) {
        c = a.str().compare(b.str());
      } else {
        fail(line, fmt::format("cannot compare a {} with a {}", type_name(a), type_name(b)));
      }
      if (op == "<") return value(c < 0);
      if (op == ">") return value(c > 0);
      if (op == "<=") return value(c <= 0);
      return value(c >= 0);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return value(bounded(a.str() + b.str(), line));
      if (a.is_array() && b.is_array()) {
        if (a.items().size() + b.items().size() > kMaxIterations)
          fail(line, fmt::format("a list of more than {} items", kMaxIterations));
        array out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return value(std::move(out));
      }
    }
    if (op == "*" && a.is_string() && b.type() == value::kind::integer) {
      std::string out;
      for (std::int64_t i = 0; i < b.integer() && out.size() <= kMaxOutput; ++i)
        out += a.str();
      return value(std::move(out));
    }
    const auto numeric = [](const value& v) {
      return v.is_number() || v.type() == value::kind::boolean;
    };
    if (!numeric(a) || !numeric(b))
      fail(line, fmt::format("'{}' of a {} and a {}", op, type_name(a), type_name(b)));
    const auto as_int = [](const value& v) {
      return v.type() == value::kind::boolean ? (v.boolean() ? 1 : 0) : v.integer();
    };
    const bool ints = a.type() != value::kind::number && b.type() != value::kind::number;
    const double x = a.type() == value::kind::boolean ? as_int(a) : a.number();
    const double y = b.type() == value::kind::boolean ? as_int(b) : b.number();
    // Python's integers do not overflow; ours are 64 bits, and past them is an error, not UB.
    std::int64_t r = 0;
    const auto overflow = [&] { fail(line, fmt::format("integer overflow in '{}'", op)); };
    if (op == "+") {
      if (!ints) return value(x + y);
      if (__builtin_add_overflow(as_int(a), as_int(b), &r)) overflow();
      return value(r);
    }
    if (op == "-") {
      if (!ints) return value(x - y);
      if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) overflow();
      return value(r);
    }
    if (op == "*") {
      if (!ints) return value(x * y);
      if (__builtin_mul_overflow(as_int(a), as_int(b), &r)) overflow();
      return value(r);
    }
    if (op == "**") {
      const double p = std::pow(x, y);
      if (!ints || as_int(b) < 0) return value(p);
      if (!(std::fabs(p) < 9.2e18)) overflow();
      return value(static_cast<std::int64_t>(p));
    }
    if (y == 0) fail(line, "division by zero");
    if (ints && as_int(b) == -1 && as_int(a) == std::numeric_limits<std::int64_t>::min())
      overflow();
    if (op == "/") return value(x / y);
    if (op == "//") {
      if (ints) {
        const std::int64_t q = as_int(a) / as_int(b);
        return value((as_int(a) % as_int(b) != 0 && ((as_int(a) < 0) != (as_int(b) < 0))) ? q - 1
                                                                                          : q);
      }
      return value(std::floor(x / y));
    }
    if (op == "%") {
      if (ints) {
        const std::int64_t m = as_int(a) % as_int(b);
        return value(m != 0 && ((m < 0) != (as_int(b) < 0)) ? m + as_int(b) : m);
      }
      return value(x - y * std::floor(x / y));
    }
    fail(line, fmt::format("unknown operator '{}'", op));
  }

  bool test(const std::string& name, const value& v, const call_args& a, int line) {
    const value& x = arg(a, 0, "value");
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.type() == value::kind::integer;
    if (name == "float") return v.type() == value::kind::number;
    if (name == "boolean") return v.type() == value::kind::boolean;
    if (name == "true") return v.type() == value::kind::boolean && v.boolean();
    if (name == "false") return v.type() == value::kind::boolean && !v.boolean();
    if (name == "mapping") return v.is_object();
    if (name == "sequence") return v.is_array() || v.is_string() || v.is_object();
    if (name == "iterable") return v.is_array() || v.is_string() || v.is_object();
    if (name == "callable") return v.type() == value::kind::function;
    if (name == "odd") return v.type() == value::kind::integer && v.integer() % 2 != 0;
    if (name == "even") return v.type() == value::kind::integer && v.integer() % 2 == 0;
    if (name == "divisibleby")
      return x.type() == value::kind::integer && x.integer() != 0 &&
             v.type() == value::kind::integer &&
             (x.integer() == -1 || v.integer() % x.integer() == 0);  // INT64_MIN % -1 is UB
    if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return equal(v, x);
    if (name == "ne" || name == "!=") return !equal(v, x);
    if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
      static const std::map<std::string, std::string> ops{
          {"lt", "<"}, {"gt", ">"}, {"le", "<="}, {"ge", ">="}};
      return binary(ops.at(name), v, x, line).truthy();
    }
    if (name == "in") return binary("in", v, x, line).truthy();
    if (name == "lower") return v.is_string() && to_text(filter("lower", v, {}, line)) == v.str();
    if (name == "upper") return v.is_string() && to_text(filter("upper", v, {}, line)) == v.str();
    fail(line, fmt::format("unknown test '{}'", name));
  }

  // select / reject / selectattr / rejectattr: the items (or their attribute) that pass a test.
  value select(const value& v, const call_args& a, bool attr, bool keep, int line) {
    array out;
    const std::size_t first = attr ? 1 : 0;
    const std::string attribute_name = attr ? to_text(arg(a, 0, "attribute")) : std::string();
    const std::string test_name = a.positional.size() > first ? to_text(a.positional[first]) : "";
    call_args targs;
    for (std::size_t i = first + 1; i < a.positional.size(); ++i)
      targs.positional.push_back(a.positional[i]);
    for (const auto& x : iterate(v, line)) {
      const value subject = attr ? attribute_path(x, attribute_name, line) : x;
      const bool pass =
          test_name.empty() ? subject.truthy() : test(test_name, subject, targs, line);
      if (pass == keep) out.push_back(x);
    }
    return value(std::move(out));
  }

  static value attribute_path(const value& v, const std::string& path, int line) {
    value cur = v;
    std::size_t i = 0;
    while (i <= path.size()) {
      const std::size_t j = std::min(path.find('.', i), path.size());
      const std::string part = path.substr(i, j - i);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
            return std::isdigit(static_cast<unsigned char>(c));
          }))
        cur = item(cur, value(static_cast<std::int64_t>(std::stoll(part))), line);
      else
        cur = attribute(cur, part, line);
      i = j + 1;
    }
    return cur;
  }

  value filter(const std::string& name, const value& v, const call_args& a, int line) {
    if (name == "length" || name == "count") {
      if (v.is_string()) return value(static_cast<std::int64_t>(code_points(v.str())));
      if (v.is_array()) return value(static_cast<std::int64_t>(v.items().size()));
      if (v.is_object()) return value(static_cast<std::int64_t>(v.fields().size()));
      if (v.is_undefined()) return value(0);
      fail(line, fmt::format("a {} has no length", type_name(v)));
    }
    if (name == "trim") return value(strip_chars(to_text(v), arg(a, 0, "chars"), true, true));
    if (name == "upper" || name == "lower") {
      std::string s = to_text(v);
      for (char& c : s)
        c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                              : std::tolower(static_cast<unsigned char>(c)));
      return value(std::move(s));
    }
    if (name == "title") return value(title_case(to_text(v), true));
    if (name == "capitalize") return value(title_case(to_text(v), false));
    if (name == "tojson") {
      const value& ind = arg(a, 0, "indent");
      if (ind.is_number() && (ind.number() < 0 || ind.number() > 64))
        fail(line, "tojson(): indent must be 0..64");
      return value(
          bounded(to_json_text(v, ind.is_number() ? static_cast<int>(ind.integer()) : -1), line));
    }
    if (name == "string") return value(to_text(v));
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : to_text(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return value(std::move(out));
    }
    if (name == "int") {
      if (v.type() == value::kind::integer) return v;
      if (v.is_number())
        return value(std::fabs(v.number()) < 9.2e18 ? static_cast<std::int64_t>(v.number())
                                                    : std::int64_t{0});
      if (v.is_string()) {
        std::int64_t i = 0;
        const std::string s = strip_chars(v.str(), value(), true, true);
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
        return value(ec == std::errc() && p == s.data() + s.size() ? i : 0);
      }
      return value(v.type() == value::kind::boolean && v.boolean() ? 1 : 0);
    }
    if (name == "float") {
      if (v.is_number()) return value(v.number());
      if (v.is_string()) return value(std::strtod(v.str().c_str(), nullptr));
      return value(0.0);
    }
    if (name == "abs") {
      if (v.type() == value::kind::integer)
        return value(v.integer() < 0 && v.integer() != std::numeric_limits<std::int64_t>::min()
                         ? -v.integer()
                         : v.integer());
      return value(std::fabs(v.number()));
    }
    if (name == "round") {
      const value& p = arg(a, 0, "precision");
      const double scale = std::pow(10.0, p.is_number() ? static_cast<double>(p.integer()) : 0.0);
      return value(std::round(v.number() * scale) / scale);
    }
    if (name == "first" || name == "last") {
      const array items = iterate(v, line);
      if (items.empty()) return value();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return value(iterate(v, line));
    if (name == "reverse") {
      if (v.is_string()) return value(std::string(v.str().rbegin(), v.str().rend()));
      array items = iterate(v, line);
      std::reverse(items.begin(), items.end());
      return value(std::move(items));
    }
    if (name == "items") {
      array out;
      if (v.is_object())
        for (const auto& [k, x] : v.fields())
          out.emplace_back(array{value(k), x});
      return value(std::move(out));
    }
    if (name == "dictsort") {
      array out;
      if (v.is_object())
        for (const auto& [k, x] : v.fields())
          out.emplace_back(array{value(k), x});
      std::sort(out.begin(), out.end(), [](const value& p, const value& q) {
        return p.items()[0].str() < q.items()[0].str();
      });
      return value(std::move(out));
    }
    if (name == "join") {
      const std::string sep = to_text(arg(a, 0, "d"));
      const value& attr = arg(a, 1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& x : iterate(v, line)) {
        out += (first ? "" : sep) +
               to_text(attr.is_undefined() ? x : attribute_path(x, to_text(attr), line));
        first = false;
      }
      return value(std::move(out));
    }
    if (name == "default" || name == "d") {
      const bool boolean = arg(a, 1, "boolean").truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) {
        const value& d = arg(a, 0, "default_value");
        return d.is_undefined() ? value(std::string()) : d;
      }
      return v;
    }
    if (name == "replace")
      return value(
          bounded(replace_all(to_text(v), to_text(arg(a, 0, "old")), to_text(arg(a, 1, "new")),
                              arg(a, 2, "count").is_number() ? arg(a, 2, "count").integer() : -1),
                  line));
    if (name == "indent") {
      const value& w = arg(a, 0, "width");
      if (w.is_number() && (w.number() < 0 || w.number() > 1024))
        fail(line, "indent(): width must be 0..1024");
      const std::string pad =
          w.is_string()
              ? w.str()
              : std::string(w.is_number() ? static_cast<std::size_t>(w.integer()) : 4, ' ');
      const bool first = arg(a, 1, "first").truthy();
      const bool blank = arg(a, 2, "blank").truthy();
      const auto lines = split_text(to_text(v), value("\n"), -1);
      std::string out;
      for (std::size_t i = 0; i < lines.size(); ++i) {
        if (i) out += '\n';
        if ((i > 0 || first) && (blank || !lines[i].empty())) out += pad;
        out += lines[i];
      }
      return value(bounded(std::move(out), line));
    }
    if (name == "map") {
      array out;
      const value& attr = arg(a, 99, "attribute");
      for (const auto& x : iterate(v, line)) {
        if (!attr.is_undefined()) {
          value r = attribute_path(x, to_text(attr), line);
          if (r.is_undefined()) r = arg(a, 99, "default");
          out.push_back(r);
        } else if (!a.positional.empty()) {
          call_args rest;
          rest.positional.assign(a.positional.begin() + 1, a.positional.end());
          rest.keyword = a.keyword;
          out.push_back(filter(to_text(a.positional[0]), x, rest, line));
        } else {
          out.push_back(x);
        }
      }
      return value(std::move(out));
    }
    if (name == "select") return select(v, a, false, true, line);
    if (name == "reject") return select(v, a, false, false, line);
    if (name == "selectattr") return select(v, a, true, true, line);
    if (name == "rejectattr") return select(v, a, true, false, line);
    if (name == "unique") {
      array out;
      for (const auto& x : iterate(v, line))
        if (std::none_of(out.begin(), out.end(), [&](const value& y) { return equal(x, y); }))
          out.push_back(x);
      return value(std::move(out));
    }
    if (name == "sort") {
      array out = iterate(v, line);
      const bool rev = arg(a, 0, "reverse").truthy();
      const value& attr = arg(a, 2, "attribute");
      auto key = [&](const value& x) {
        return attr.is_undefined() ? x : attribute_path(x, to_text(attr), line);
      };
      std::stable_sort(out.begin(), out.end(), [&](const value& p, const value& q) {
        return binary(rev ? ">" : "<", key(p), key(q), line).truthy();
      });
      return value(std::move(out));
    }
    if (name == "sum") {
      value total(0);
      for (const auto& x : iterate(v, line))
        total = binary("+", total, x, line);
      return total;
    }
    if (name == "min" || name == "max") {
      const array items = iterate(v, line);
      if (items.empty()) return value();
      value best = items.front();
      for (const auto& x : items)
        if (binary(name == "min" ? "<" : ">", x, best, line).truthy()) best = x;
      return best;
    }
    if (name == "wordcount")
      return value(static_cast<std::int64_t>(split_text(to_text(v), value(), -1).size()));
    fail(line, fmt::format("unknown filter '{}'", name));
  }

  std::vector<scope> scopes_;
  std::string out_;
  std::uint64_t iterations_ = 0;
  std::size_t macro_depth_ = 0;
};

// Methods of strings, lists and dicts that templates call, bound to their value.
value renderer::method(const value& self, const std::string& name) {
  auto bound = [](auto fn) { return value(function(std::move(fn))); };
  if (self.is_string()) {
    const std::string s = self.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return bound([s, name](const call_args& a) -> result<value> {
        return value(strip_chars(s, arg(a, 0, "chars"), name != "rstrip", name != "lstrip"));
      });
    if (name == "split")
      return bound([s](const call_args& a) -> result<value> {
        const value& max = arg(a, 1, "maxsplit");
        array out;
        for (auto& p : split_text(s, arg(a, 0, "sep"), max.is_number() ? max.integer() : -1))
          out.emplace_back(std::move(p));
        return value(std::move(out));
      });
    if (name == "startswith" || name == "endswith")
      return bound([s, name](const call_args& a) -> result<value> {
        const value& p = arg(a, 0, "prefix");
        std::vector<std::string> options;
        if (p.is_array())
          for (const auto& x : p.items())
            options.push_back(to_text(x));
        else
          options.push_back(to_text(p));
        for (const auto& o : options)
          if (name == "startswith" ? s.starts_with(o) : s.ends_with(o)) return value(true);
        return value(false);
      });
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
      return bound([s, name](const call_args&) -> result<value> {
        if (name == "title" || name == "capitalize") return value(title_case(s, name == "title"));
        std::string out = s;
        for (char& c : out)
          c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                                : std::tolower(static_cast<unsigned char>(c)));
        return value(std::move(out));
      });
    if (name == "replace")
      return bound([s](const call_args& a) -> result<value> {
        const value& c = arg(a, 2, "count");
        return value(bounded(replace_all(s, to_text(arg(a, 0, "old")), to_text(arg(a, 1, "new")),
                                         c.is_number() ? c.integer() : -1),
                             0));
      });
    if (name == "find")
      return bound([s](const call_args& a) -> result<value> {
        const auto p = s.find(to_text(arg(a, 0, "sub")));
        return value(p == std::string::npos ? std::int64_t{-1} : static_cast<std::int64_t>(p));
      });
    if (name == "count")
      return bound([s](const call_args& a) -> result<value> {
        const std::string sub = to_text(arg(a, 0, "sub"));
        std::int64_t n = 0;
        if (!sub.empty())
          for (auto p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size()))
            ++n;
        return value(n);
      });
    if (name == "join")
      return bound([s](const call_args& a) -> result<value> {
        std::string out;
        const value& items = arg(a, 0, "iterable");
        if (items.is_array())
          for (std::size_t i = 0; i < items.items().size() && out.size() <= kMaxOutput; ++i)
            out += (i ? s : "") + to_text(items.items()[i]);
        return value(bounded(std::move(out), 0));
      });
    return value();
  }
  if (self.is_array()) {
    if (name == "append")
      return bound([self](const call_args& a) -> result<value> {
        if (self.items().size() >= kMaxIterations)
          return make_error(errc::unsupported, "append(): more than {} items", kMaxIterations);
        if (holds(arg(a, 0, "item"), &self.items()))
          return make_error(errc::unsupported, "append(): a list cannot hold itself");
        self.items().push_back(arg(a, 0, "item"));
        return value::none();
      });
    if (name == "pop")
      return bound([self](const call_args& a) -> result<value> {
        auto& items = self.items();
        if (items.empty()) return make_error(errc::unsupported, "pop(): the list is empty");
        const value& i = arg(a, 0, "index");
        auto at = static_cast<std::int64_t>(items.size()) - 1;
        if (i.is_number())
          at =
              i.integer() < 0 ? i.integer() + static_cast<std::int64_t>(items.size()) : i.integer();
        if (at < 0 || at >= static_cast<std::int64_t>(items.size()))
          return make_error(errc::unsupported, "pop(): index out of range");
        value v = items[static_cast<std::size_t>(at)];
        items.erase(items.begin() + at);
        return v;
      });
    return value();
  }
  if (self.is_object()) {
    if (name == "items" || name == "keys" || name == "values")
      return bound([self, name](const call_args&) -> result<value> {
        array out;
        for (const auto& [k, v] : self.fields()) {
          if (name == "items")
            out.emplace_back(array{value(k), v});
          else if (name == "keys")
            out.emplace_back(k);
          else
            out.push_back(v);
        }
        return value(std::move(out));
      });
    if (name == "get")
      return bound([self](const call_args& a) -> result<value> {
        const value* f = self.find(to_text(arg(a, 0, "key")));
        if (f) return *f;
        const value& d = arg(a, 1, "default");
        return d.is_undefined() ? value::none() : d;
      });
    if (name == "update")
      return bound([self](const call_args& a) -> result<value> {
        const value& o = arg(a, 0, "other");
        for (const auto& [k, v] : a.keyword)
          if (holds(v, &self.fields()))
            return make_error(errc::unsupported, "update(): a dict cannot hold itself");
        if (holds(o, &self.fields()) && !(o.is_object() && &o.fields() == &self.fields()))
          return make_error(errc::unsupported, "update(): a dict cannot hold itself");
        if (o.is_object() && &o.fields() != &self.fields())
          for (const auto& [k, v] : o.fields())
            self.set(k, v);
        for (const auto& [k, v] : a.keyword)
          self.set(k, v);
        return value::none();
      });
  }
  return value();
}

}  // namespace

// ------------------------------------------------------------------ entry points

template_program::template_program() = default;
template_program::template_program(template_program&&) noexcept = default;
template_program& template_program::operator=(template_program&&) noexcept = default;
template_program::~template_program() = default;

result<template_program> template_program::parse(std::string_view source) {
  if (source.size() > kMaxSource)
    return make_error(errc::invalid_argument, "chat template: {} bytes, more than the {} allowed",
                      source.size(), kMaxSource);
  try {
    auto root = std::make_shared<node>();
    stmt_parser p(split(source));
    root->body = p.parse();
    template_program t;
    t.root_ = std::move(root);
    return t;
  } catch (const template_error& e) {
    return make_error(errc::invalid_argument, "{}", e.message);
  }
}

result<std::string> template_program::render(const object& globals) const {
  try {
    renderer r(globals);
    return r.run(root_->body);
  } catch (const template_error& e) {
    return make_error(e.code, "{}", e.message);
  }
}

}  // namespace tessera::inference::tokenizer::jinja
