// The methods of strings, lists and dicts that templates call (`s.strip()`, `l.append(x)`,
// `d.items()`), bound to their value, and the Python string operations they share with the
// filters.
#include "inference/tokenizer/jinja_impl.hpp"

#include <cctype>

namespace tessera::inference::tokenizer::jinja::detail {

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

namespace {

template <class Fn>
value bound(Fn fn) {
  return value(function(std::move(fn)));
}

value string_method(const value& self, const std::string& name) {
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

value list_method(const value& self, const std::string& name) {
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
        at = i.integer() < 0 ? i.integer() + static_cast<std::int64_t>(items.size()) : i.integer();
      if (at < 0 || at >= static_cast<std::int64_t>(items.size()))
        return make_error(errc::unsupported, "pop(): index out of range");
      value v = items[static_cast<std::size_t>(at)];
      items.erase(items.begin() + at);
      return v;
    });
  return value();
}

value dict_method(const value& self, const std::string& name) {
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
  return value();
}

}  // namespace

// Methods of strings, lists and dicts that templates call, bound to their value.
value renderer::method(const value& self, const std::string& name) {
  if (self.is_string()) return string_method(self, name);
  if (self.is_array()) return list_method(self, name);
  if (self.is_object()) return dict_method(self, name);
  return value();
}

}  // namespace tessera::inference::tokenizer::jinja::detail
