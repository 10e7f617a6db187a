// The parser: a tag's tokens into an expression (Jinja's grammar, by recursive descent) and the
// template's segments into its statements (if, for, set, macro, break, continue).
#include "inference/tokenizer/jinja_impl.hpp"

#include <algorithm>
#include <initializer_list>

#include <fmt/format.h>

namespace tessera::inference::tokenizer::jinja::detail {

namespace {

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

std::vector<node> parse_segments(std::vector<segment> segs) {
  stmt_parser p(std::move(segs));
  return p.parse();
}

}  // namespace tessera::inference::tokenizer::jinja::detail
