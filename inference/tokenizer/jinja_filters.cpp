// The filters (`x | name(...)`) and tests (`x is name`) templates use, and select / reject /
// selectattr / rejectattr, which run a test on each item.
#include "inference/tokenizer/jinja_impl.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

#include <fmt/format.h>

namespace tessera::inference::tokenizer::jinja::detail {

namespace {

std::size_t code_points(const std::string& s) {
  std::size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

}  // namespace

bool renderer::test(const std::string& name, const value& v, const call_args& a, int line) {
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
value renderer::select(const value& v, const call_args& a, bool attr, bool keep, int line) {
  array out;
  const std::size_t first = attr ? 1 : 0;
  const std::string attribute_name = attr ? to_text(arg(a, 0, "attribute")) : std::string();
  const std::string test_name = a.positional.size() > first ? to_text(a.positional[first]) : "";
  call_args targs;
  for (std::size_t i = first + 1; i < a.positional.size(); ++i)
    targs.positional.push_back(a.positional[i]);
  for (const auto& x : iterate(v, line)) {
    const value subject = attr ? attribute_path(x, attribute_name, line) : x;
    const bool pass = test_name.empty() ? subject.truthy() : test(test_name, subject, targs, line);
    if (pass == keep) out.push_back(x);
  }
  return value(std::move(out));
}

value renderer::attribute_path(const value& v, const std::string& path, int line) {
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

value renderer::filter(const std::string& name, const value& v, const call_args& a, int line) {
  if (auto r = text_filter(name, v, a, line)) return std::move(*r);
  if (auto r = conversion_filter(name, v, a, line)) return std::move(*r);
  if (auto r = sequence_filter(name, v, a, line)) return std::move(*r);
  if (auto r = per_item_filter(name, v, a, line)) return std::move(*r);
  fail(line, fmt::format("unknown filter '{}'", name));
}

// Of a string: case, whitespace, escaping, replacing, indenting, counting words.
std::optional<value> renderer::text_filter(const std::string& name, const value& v,
                                           const call_args& a, int line) {
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
        w.is_string() ? w.str()
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
  if (name == "wordcount")
    return value(static_cast<std::int64_t>(split_text(to_text(v), value(), -1).size()));
  return std::nullopt;
}

// A value as another type (JSON text, a string, a number), numbers' own, and default.
std::optional<value> renderer::conversion_filter(const std::string& name, const value& v,
                                                 const call_args& a, int line) {
  if (name == "tojson") {
    const value& ind = arg(a, 0, "indent");
    if (ind.is_number() && (ind.number() < 0 || ind.number() > 64))
      fail(line, "tojson(): indent must be 0..64");
    return value(
        bounded(to_json_text(v, ind.is_number() ? static_cast<int>(ind.integer()) : -1), line));
  }
  if (name == "string") return value(to_text(v));
  if (name == "safe") return v;
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
  if (name == "default" || name == "d") {
    const bool boolean = arg(a, 1, "boolean").truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) {
      const value& d = arg(a, 0, "default_value");
      return d.is_undefined() ? value(std::string()) : d;
    }
    return v;
  }
  return std::nullopt;
}

// Of a list, a dict or a string as a sequence: its length, ends, order, entries, joined text.
std::optional<value> renderer::sequence_filter(const std::string& name, const value& v,
                                               const call_args& a, int line) {
  if (name == "length" || name == "count") {
    if (v.is_string()) return value(static_cast<std::int64_t>(code_points(v.str())));
    if (v.is_array()) return value(static_cast<std::int64_t>(v.items().size()));
    if (v.is_object()) return value(static_cast<std::int64_t>(v.fields().size()));
    if (v.is_undefined()) return value(0);
    fail(line, fmt::format("a {} has no length", type_name(v)));
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
  if (name == "unique") {
    array out;
    for (const auto& x : iterate(v, line))
      if (std::none_of(out.begin(), out.end(), [&](const value& y) { return equal(x, y); }))
        out.push_back(x);
    return value(std::move(out));
  }
  return std::nullopt;
}

// What a filter, an attribute, a test or an operator makes of each item: map, select and the
// like, sort, sum, min and max.
std::optional<value> renderer::per_item_filter(const std::string& name, const value& v,
                                               const call_args& a, int line) {
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
  return std::nullopt;
}

}  // namespace tessera::inference::tokenizer::jinja::detail
