// The Jinja engine's insides (private to inference/tokenizer; the API is jinja.hpp): its bounds
// and errors, the syntax tree, and the renderer's class. Seven files define them, one concern
// each: jinja.cpp is template_program's entry points, jinja_value.cpp the values (Python's str(),
// repr() and json.dumps, ==), jinja_lexer.cpp splits the source into text and tags and a tag into
// tokens, jinja_parser.cpp parses tokens into the tree, jinja_render.cpp evaluates the tree
// (statements, expressions, operators, the built-in globals), jinja_filters.cpp holds the filters
// and tests, jinja_methods.cpp the string, list and dict methods and the string operations they
// share with the filters.
#pragma once

#include "inference/tokenizer/jinja.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace tessera::inference::tokenizer::jinja {

namespace detail {

// Bounds: a template is data from a model file (see jinja.hpp).
inline constexpr std::size_t kMaxSource = 1u << 20;
inline constexpr std::size_t kMaxDepth = 64;
inline constexpr std::uint64_t kMaxIterations = 1'000'000;
inline constexpr std::size_t kMaxOutput = 16u << 20;

// Errors inside the parser and the evaluator unwind to template_program's entry points, which turn
// them into result<> errors: the recursive descent and the recursive evaluation would otherwise
// thread a result through every one of their many small functions. Nothing else throws it.
struct template_error {
  std::string message;
  /// invalid_argument: the template refused its input (raise_exception); unsupported: what the
  /// template asked is beyond this subset or its bounds (the caller may render another way).
  errc code = errc::unsupported;
};

[[noreturn]] inline void fail(int line, std::string message) {
  throw template_error{line > 0 ? fmt::format("chat template line {}: {}", line, message)
                                : std::move(message)};
}

// Every string a template builds is bounded like its output: `{% set s = s ~ s %}` in a loop would
// otherwise double past any memory.
inline std::string bounded(std::string s, int line) {
  if (s.size() > kMaxOutput) fail(line, fmt::format("a string of more than {} bytes", kMaxOutput));
  return s;
}

// ------------------------------------------------------------------ syntax tree

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

}  // namespace detail

// In jinja itself, not detail: jinja.hpp declares it (template_program holds the root).
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
  detail::expr_ptr e;                // output; set's value; for's iterable
  detail::expr_ptr cond;             // for's filter
  std::vector<std::string> targets;  // for's names
  std::vector<std::pair<detail::expr_ptr, std::vector<node>>> branches;  // if / elif
  std::vector<node> body, else_body;
  // macro's, with defaults (may be null)
  std::vector<std::pair<std::string, detail::expr_ptr>> params;
};

namespace detail {

// ------------------------------------------------------------------ lexer (jinja_lexer.cpp)

struct segment {
  enum class kind : std::uint8_t { text, output, stmt } k = kind::text;
  std::string text;
  int line = 1;
};

inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Splits the source into text and tags with Hugging Face's settings (jinja_lexer.cpp says which).
std::vector<segment> split(std::string_view src);
// The tokens of one tag's inside, ending with a token of kind end.
std::vector<token> tokenize(std::string_view s, int line);

// ------------------------------------------------------------------ parser (jinja_parser.cpp)

// The template's statements, parsed from its segments.
std::vector<node> parse_segments(std::vector<segment> segs);

// ------------------------------------------------------------------ values (jinja_value.cpp)

std::string type_name(const value& v);
bool equal(const value& a, const value& b, std::size_t depth = 0);
const value& arg(const call_args& a, std::size_t i, std::string_view kw);
// Whether `v` is, or holds, the list or dict at `container` (jinja_value.cpp says why it matters).
bool holds(const value& v, const void* container, std::size_t depth = 0);

// ------------------------------------------------------------------ strings (jinja_methods.cpp)

std::string strip_chars(const std::string& s, const value& chars, bool left, bool right);
std::string title_case(const std::string& s, bool every_word);
std::string replace_all(std::string s, const std::string& from, const std::string& to,
                        std::int64_t count);
std::vector<std::string> split_text(const std::string& s, const value& sep, std::int64_t max);

// ------------------------------------------------------------------ evaluation

enum class flow : std::uint8_t { normal, break_, continue_ };

// Statements and expressions (jinja_render.cpp), filters and tests (jinja_filters.cpp), methods
// (jinja_methods.cpp).
class renderer {
 public:
  explicit renderer(const object& globals);

  std::string run(const std::vector<node>& body);

 private:
  using scope = std::unordered_map<std::string, value>;

  void install_builtins();
  value lookup(const std::string& name) const;
  void emit(const std::string& s);
  flow exec(const std::vector<node>& body);
  flow exec(const node& n);
  void assign(const node& n, value v);
  void define_macro(const node& n);
  static array iterate(const value& v, int line);
  flow exec_for(const node& n);
  value call(const value& f, const call_args& a, int line);
  call_args arguments(const expr& e, std::size_t skip);
  value eval(const expr& e);
  value eval_slice(const expr& e);
  static value item(const value& v, const value& key, int line);
  static value method(const value& self, const std::string& name);
  static value attribute(const value& v, const std::string& name, int line);
  value binary(const std::string& op, const value& a, const value& b, int line);

  bool test(const std::string& name, const value& v, const call_args& a, int line);
  value select(const value& v, const call_args& a, bool attr, bool keep, int line);
  static value attribute_path(const value& v, const std::string& path, int line);
  value filter(const std::string& name, const value& v, const call_args& a, int line);
  // The filter's groups: each is nullopt for a name not its own.
  std::optional<value> text_filter(const std::string& name, const value& v, const call_args& a,
                                   int line);
  std::optional<value> conversion_filter(const std::string& name, const value& v,
                                         const call_args& a, int line);
  std::optional<value> sequence_filter(const std::string& name, const value& v, const call_args& a,
                                       int line);
  std::optional<value> per_item_filter(const std::string& name, const value& v, const call_args& a,
                                       int line);

  std::vector<scope> scopes_;
  std::string out_;
  std::uint64_t iterations_ = 0;
  std::size_t macro_depth_ = 0;
};

}  // namespace detail

}  // namespace tessera::inference::tokenizer::jinja
