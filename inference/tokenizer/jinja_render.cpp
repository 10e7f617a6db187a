// The evaluator: a parsed template rendered with its globals — statements (output, if, for with
// loop.*, set, macros, break and continue), expressions, the operators, and the built-in globals
// (range, namespace, dict, raise_exception, strftime_now).
#include "inference/tokenizer/jinja_impl.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>

#include <fmt/format.h>

namespace tessera::inference::tokenizer::jinja::detail {

namespace {

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

// `a in b` and `a not in b`.
value membership(const std::string& op, const value& a, const value& b, int line) {
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

// <, >, <= and >= of two numbers or two strings.
value ordering(const std::string& op, const value& a, const value& b, int line) {
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

// The numeric operators, booleans counting as 0 and 1.
value arithmetic(const std::string& op, const value& a, const value& b, int line) {
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
  if (ints && as_int(b) == -1 && as_int(a) == std::numeric_limits<std::int64_t>::min()) overflow();
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

}  // namespace

renderer::renderer(const object& globals) {
  scopes_.emplace_back();
  install_builtins();
  for (const auto& [k, v] : globals)
    scopes_.front()[k] = v;
}

std::string renderer::run(const std::vector<node>& body) {
  exec(body);
  return std::move(out_);
}

void renderer::install_builtins() {
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
    const std::size_t n = std::strftime(buf, sizeof buf, to_text(arg(a, 0, "format")).c_str(), &tm);
    return value(std::string(buf, n));
  }));
}

value renderer::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  return value();
}

void renderer::emit(const std::string& s) {
  out_ += s;
  if (out_.size() > kMaxOutput)
    fail(0, fmt::format("the rendered prompt passes {} bytes", kMaxOutput));
}

flow renderer::exec(const std::vector<node>& body) {
  for (const auto& n : body) {
    const flow f = exec(n);
    if (f != flow::normal) return f;
  }
  return flow::normal;
}

flow renderer::exec(const node& n) {
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

void renderer::assign(const node& n, value v) {
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

void renderer::define_macro(const node& n) {
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

array renderer::iterate(const value& v, int line) {
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

flow renderer::exec_for(const node& n) {
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

value renderer::call(const value& f, const call_args& a, int line) {
  if (f.type() != value::kind::function)
    fail(line, fmt::format("a {} is not callable", type_name(f)));
  auto r = f.fn()(a);
  if (!r) throw template_error{r.error().message, r.error().code};
  return std::move(*r);
}

call_args renderer::arguments(const expr& e, std::size_t skip) {
  call_args a;
  for (std::size_t i = skip; i < e.args.size(); ++i)
    a.positional.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs)
    a.keyword.emplace_back(k, eval(*v));
  return a;
}

value renderer::eval(const expr& e) {
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
    case expr::op::slice:
      return eval_slice(e);
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

value renderer::eval_slice(const expr& e) {
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

value renderer::item(const value& v, const value& key, int line) {
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

value renderer::attribute(const value& v, const std::string& name, int line) {
  (void)line;
  if (v.is_object()) {
    if (const value* f = v.find(name)) return *f;
  }
  return method(v, name);
}

value renderer::binary(const std::string& op, const value& a, const value& b, int line) {
  if (op == "==") return value(equal(a, b));
  if (op == "!=") return value(!equal(a, b));
  if (op == "~") return value(bounded(to_text(a) + to_text(b), line));
  if (op == "in" || op == "not in") return membership(op, a, b, line);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") return ordering(op, a, b, line);
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
  return arithmetic(op, a, b, line);
}

}  // namespace tessera::inference::tokenizer::jinja::detail
