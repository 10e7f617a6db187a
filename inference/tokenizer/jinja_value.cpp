// Template values (jinja.hpp's value): construction, truth and dict entries, values from JSON,
// and Python's str(), repr() and json.dumps of them; with what the evaluator asks of any value
// (its type's name, ==, a call's argument, whether it holds a given list or dict).
#include "inference/tokenizer/jinja_impl.hpp"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "actors/base/log.hpp"

namespace tessera::inference::tokenizer::jinja {

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

namespace detail {
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

bool equal(const value& a, const value& b, std::size_t depth) {
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
bool holds(const value& v, const void* container, std::size_t depth) {
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

}  // namespace detail

value from_json(const nlohmann::json& j) {
  return detail::json_to_value(j);
}
value from_json(const nlohmann::ordered_json& j) {
  return detail::json_to_value(j);
}

std::string to_text(const value& v) {
  return detail::text_of(v, 0);
}

std::string to_json_text(const value& v, int indent) {
  std::string out;
  detail::json_dump(out, v, indent, 0);
  return out;
}

}  // namespace tessera::inference::tokenizer::jinja
