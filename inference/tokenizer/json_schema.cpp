#include "inference/tokenizer/json_schema.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera::inference::tokenizer {

using nlohmann::json;

json_class class_of(unsigned char c) noexcept {
  switch (c) {
    case '{':
      return json_class::object;
    case '[':
      return json_class::array;
    case '"':
      return json_class::string;
    case 't':
    case 'f':
      return json_class::boolean;
    case 'n':
      return json_class::null;
    default:
      return c == '-' || (c >= '0' && c <= '9') ? json_class::number : json_class::count;
  }
}

namespace {

constexpr std::int64_t kLargest = 999'999'999'999'999'999;  // max_int_digits nines

const char* class_name(json_class c) {
  static const char* const names[] = {"an object", "an array",  "a string",
                                      "a number",  "a boolean", "null"};
  return names[static_cast<int>(c)];
}

/// The classes a node's values may have: bit per json_class.
std::uint8_t classes_of_types(std::uint8_t t) {
  std::uint8_t c = 0;
  if (t & json_schema::t_object) c |= 1u << static_cast<int>(json_class::object);
  if (t & json_schema::t_array) c |= 1u << static_cast<int>(json_class::array);
  if (t & json_schema::t_string) c |= 1u << static_cast<int>(json_class::string);
  if (t & (json_schema::t_integer | json_schema::t_number))
    c |= 1u << static_cast<int>(json_class::number);
  if (t & json_schema::t_boolean) c |= 1u << static_cast<int>(json_class::boolean);
  if (t & json_schema::t_null) c |= 1u << static_cast<int>(json_class::null);
  return c;
}

/// Keywords that would constrain the answer in a way the grammar cannot follow: refused, never
/// ignored (an answer that does not validate is worse than a 400).
constexpr std::string_view kRefused[] = {"pattern",
                                         "allOf",
                                         "not",
                                         "if",
                                         "then",
                                         "else",
                                         "contains",
                                         "minContains",
                                         "maxContains",
                                         "prefixItems",
                                         "additionalItems",
                                         "patternProperties",
                                         "propertyNames",
                                         "minProperties",
                                         "maxProperties",
                                         "multipleOf",
                                         "dependentRequired",
                                         "dependentSchemas",
                                         "dependencies",
                                         "unevaluatedProperties",
                                         "unevaluatedItems",
                                         "$dynamicRef",
                                         "$recursiveRef"};

/// Keywords that only describe (read past beside $ref / anyOf, where constraints are refused).
bool is_annotation(std::string_view k) {
  static const std::set<std::string_view> a = {
      "title",     "description", "default",  "examples",    "$comment",   "$schema",
      "$id",       "$anchor",     "$defs",    "definitions", "deprecated", "readOnly",
      "writeOnly", "format",      "nullable", "strict",      "name"};
  return a.contains(k);
}

}  // namespace

class schema_compiler {
 public:
  explicit schema_compiler(const json& doc) : doc_(doc) {}

  result<json_schema> run() {
    out_.nodes_.emplace_back();  // node 0: any value
    out_.nodes_[0].types = json_schema::t_all;
    auto root = compile(doc_, "");
    if (!root) return root.error();
    out_.root_ = *root;
    if (auto e = resolve_unions()) return *e;
    if (auto e = filter_literals()) return *e;
    solve_depths();
    prune();
    const auto d = out_.nodes_[out_.root_].depth;
    if (d == json_schema::unsatisfiable)
      return make_error(errc::invalid_argument, "no JSON value satisfies the schema");
    if (d > json_schema::max_depth)
      return make_error(errc::invalid_argument,
                        "the schema needs values nested {} deep, at most {}", d,
                        json_schema::max_depth);
    return std::move(out_);
  }

 private:
  using node = json_schema::node;

  static std::string where(const std::string& ptr) { return ptr.empty() ? "#" : "#" + ptr; }

  result<std::uint16_t> new_node() {
    if (out_.nodes_.size() >= json_schema::max_nodes)
      return make_error(errc::invalid_argument, "the schema has more than {} subschemas",
                        json_schema::max_nodes);
    out_.nodes_.emplace_back();
    alternatives_.emplace_back();
    return static_cast<std::uint16_t>(out_.nodes_.size() - 1);
  }

  /// Compiles the subschema `s` found at JSON pointer `ptr`; returns its node.
  result<std::uint16_t> compile(const json& s, const std::string& ptr) {
    if (auto it = by_pointer_.find(ptr); it != by_pointer_.end()) return it->second;
    if (s.is_boolean()) {
      if (s.get<bool>()) return json_schema::any;
      auto n = new_node();  // false: a node with no type, which nothing satisfies
      if (n) by_pointer_[ptr] = *n;
      return n;
    }
    if (!s.is_object())
      return make_error(errc::invalid_argument, "{}: a schema must be an object or a boolean",
                        where(ptr));
    for (const auto k : kRefused)
      if (s.contains(k))
        return make_error(errc::invalid_argument,
                          "{}/{}: '{}' is not supported (the grammar cannot follow it)", where(ptr),
                          k, k);
    if (auto it = s.find("$ref"); it != s.end()) return compile_ref(s, *it, ptr);
    for (const char* k : {"anyOf", "oneOf"})
      if (auto it = s.find(k); it != s.end()) return compile_union(s, k, *it, ptr);
    auto n = new_node();
    if (!n) return n;
    by_pointer_[ptr] = *n;  // before the children: a recursive $ref finds it
    if (auto e = fill(*n, s, ptr)) return *e;
    return *n;
  }

  result<std::uint16_t> compile_ref(const json& s, const json& ref, const std::string& ptr) {
    for (const auto& [k, v] : s.items())
      if (k != "$ref" && !is_annotation(k))
        return make_error(errc::invalid_argument, "{}: '{}' beside '$ref' is not supported",
                          where(ptr), k);
    if (!ref.is_string() || !ref.get<std::string>().starts_with("#"))
      return make_error(errc::invalid_argument,
                        "{}/$ref: only references inside the schema ('#...') are taken",
                        where(ptr));
    const std::string target = ref.get<std::string>().substr(1);
    if (!resolving_.insert(ptr).second)
      return make_error(errc::invalid_argument, "{}/$ref: a cycle of references", where(ptr));
    json::json_pointer jp;
    try {
      jp = json::json_pointer(target);
    } catch (const json::exception&) {
      return make_error(errc::invalid_argument, "{}/$ref: '{}' is not a JSON pointer", where(ptr),
                        target.substr(0, 64));
    }
    if (!doc_.contains(jp))
      return make_error(errc::invalid_argument, "{}/$ref: '#{}' is not in the schema", where(ptr),
                        target.substr(0, 64));
    auto n = compile(doc_.at(jp), target);
    resolving_.erase(ptr);
    if (n) by_pointer_[ptr] = *n;
    return n;
  }

  result<std::uint16_t> compile_union(const json& s, const char* key, const json& alts,
                                      const std::string& ptr) {
    for (const auto& [k, v] : s.items())
      if (k != key && !is_annotation(k))
        return make_error(errc::invalid_argument, "{}: '{}' beside '{}' is not supported",
                          where(ptr), k, key);
    if (!alts.is_array() || alts.empty())
      return make_error(errc::invalid_argument, "{}/{}: must be a non-empty array", where(ptr),
                        key);
    auto n = new_node();
    if (!n) return n;
    by_pointer_[ptr] = *n;
    out_.nodes_[*n].is_union = true;
    for (std::size_t i = 0; i < alts.size(); ++i) {
      auto a = compile(alts[i], fmt::format("{}/{}/{}", ptr, key, i));
      if (!a) return a.error();
      alternatives_[*n].push_back(*a);
    }
    union_where_[*n] = fmt::format("{}/{}", where(ptr), key);
    return *n;
  }

  std::optional<error> fill(std::uint16_t id, const json& s, const std::string& ptr) {
    node nd;
    const auto bad = [&](std::string_view k, std::string_view why) {
      return make_error(errc::invalid_argument, "{}/{}: {}", where(ptr), k, why);
    };
    // type
    nd.types = json_schema::t_all;
    if (auto it = s.find("type"); it != s.end()) {
      nd.types = 0;
      const json list = it->is_array() ? *it : json::array({*it});
      for (const auto& t : list) {
        static const std::map<std::string, std::uint8_t> bits = {
            {"object", json_schema::t_object}, {"array", json_schema::t_array},
            {"string", json_schema::t_string}, {"integer", json_schema::t_integer},
            {"number", json_schema::t_number}, {"boolean", json_schema::t_boolean},
            {"null", json_schema::t_null}};
        const auto b = t.is_string() ? bits.find(t.get<std::string>()) : bits.end();
        if (b == bits.end())
          return bad("type", fmt::format("{} is not a JSON type", t.dump().substr(0, 40)));
        nd.types |= b->second;
      }
    }
    // Objects.
    std::map<std::string, std::uint16_t> props;  // escaped name -> node
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return bad("properties", "must be an object");
      for (const auto& [k, v] : it->items()) {
        auto c = compile(v, ptr + "/properties/" + escape_pointer(k));
        if (!c) return c.error();
        props[escaped(k)] = *c;
      }
    }
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean() && !it->get<bool>()) {
        nd.additional = json_schema::none;
      } else {
        auto c = compile(*it, ptr + "/additionalProperties");
        if (!c) return c.error();
        nd.additional = *c;
      }
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return bad("required", "must be an array of names");
      for (const auto& r : *it) {
        if (!r.is_string()) return bad("required", "must be an array of names");
        const std::string e = escaped(r.get<std::string>());
        required.insert(e);
        // A required name with no schema of its own takes the additional properties' schema
        // (none: the object cannot be written, which the depth solver finds).
        if (!props.contains(e)) props[e] = nd.additional;
      }
    }
    if (props.size() > json_schema::max_properties)
      return bad("properties",
                 fmt::format("{} names, at most {}", props.size(), json_schema::max_properties));
    for (const auto& [name, v] : props) {
      if (required.contains(name)) nd.required |= std::uint64_t{1} << nd.names.size();
      nd.names.push_back(name);
      nd.values.push_back(v);
    }
    // Arrays.
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) return bad("items", "a list of schemas (a tuple) is not supported");
      if (it->is_boolean() && !it->get<bool>()) {
        nd.max_items = 0;
      } else {
        auto c = compile(*it, ptr + "/items");
        if (!c) return c.error();
        nd.items = *c;
      }
    }
    if (auto it = s.find("uniqueItems"); it != s.end() && *it == true)
      return bad("uniqueItems", "is not supported (the grammar cannot follow it)");
    const auto count = [&](const char* k, std::uint32_t& into) -> std::optional<error> {
      auto it = s.find(k);
      if (it == s.end()) return std::nullopt;
      if (!it->is_number() || it->get<double>() < 0 ||
          std::floor(it->get<double>()) != it->get<double>())
        return bad(k, "must be a non-negative integer");
      into = static_cast<std::uint32_t>(std::min(it->get<double>(), 4.0e9));
      return std::nullopt;
    };
    std::uint32_t max_items = nd.max_items;
    for (auto [k, into] : {std::pair<const char*, std::uint32_t*>{"minItems", &nd.min_items},
                           {"maxItems", &max_items},
                           {"minLength", &nd.min_length},
                           {"maxLength", &nd.max_length}})
      if (auto e = count(k, *into)) return e;
    nd.max_items = std::min(nd.max_items, max_items);
    // Integer bounds.
    if (auto e = bounds(s, nd, bad)) return e;
    // enum / const.
    const auto literal = [&](const json& v) { nd.literals.push_back(v.dump()); };
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return bad("enum", "must be a non-empty array");
      if (it->size() > json_schema::max_literals)
        return bad("enum",
                   fmt::format("{} values, at most {}", it->size(), json_schema::max_literals));
      for (const auto& v : *it)
        literal(v);
      nd.is_enum = true;
    }
    if (auto it = s.find("const"); it != s.end()) {
      if (nd.is_enum) return bad("const", "beside 'enum' is not supported");
      literal(*it);
      nd.is_enum = true;
    }
    out_.nodes_[id] = std::move(nd);
    return std::nullopt;
  }

  /// minimum / maximum / exclusiveMinimum / exclusiveMaximum, on integers: one closed interval.
  template <class Bad>
  static std::optional<error> bounds(const json& s, node& nd, const Bad& bad) {
    constexpr double huge = 1e300;
    const char* first = nullptr;
    const auto read = [&](const char* k, double& v) -> std::optional<error> {
      if (!s.contains(k)) return std::nullopt;
      if (!first) first = k;
      if (!s[k].is_number()) return bad(k, "must be a number");
      v = s[k].get<double>();
      return std::nullopt;
    };
    double mn = -huge, mx = huge, xmn = -huge, xmx = huge;
    if (auto e = read("minimum", mn)) return e;
    if (auto e = read("maximum", mx)) return e;
    // exclusiveMinimum / exclusiveMaximum: numbers (draft 6 on) or flags on minimum / maximum
    // (draft 4).
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean()) {
      if (s["exclusiveMinimum"].get<bool>()) std::swap(mn, xmn);
    } else if (auto e = read("exclusiveMinimum", xmn)) {
      return e;
    }
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean()) {
      if (s["exclusiveMaximum"].get<bool>()) std::swap(mx, xmx);
    } else if (auto e = read("exclusiveMaximum", xmx)) {
      return e;
    }
    if (!first) return std::nullopt;
    if (!(nd.types & json_schema::t_integer) || (nd.types & json_schema::t_number))
      return bad(first, "bounds are taken on integers only (\"type\": \"integer\")");
    const double lo = std::max(std::ceil(mn), std::floor(xmn) + 1);
    const double hi = std::min(std::floor(mx), std::ceil(xmx) - 1);
    // Past max_int_digits the grammar writes nothing anyway: clamp to one past it.
    constexpr double edge = static_cast<double>(kLargest) + 1;
    nd.minimum = static_cast<std::int64_t>(std::clamp(lo, -edge, edge));
    nd.maximum = static_cast<std::int64_t>(std::clamp(hi, -edge, edge));
    return std::nullopt;
  }

  static std::string escaped(const std::string& name) {
    const std::string d = json(name).dump();
    return d.substr(1, d.size() - 2);
  }
  static std::string escape_pointer(const std::string& k) {
    std::string out;
    for (char c : k) {
      if (c == '~')
        out += "~0";
      else if (c == '/')
        out += "~1";
      else
        out += c;
    }
    return out;
  }

  /// Fills each union's `pick`: the alternative that takes each class of value, through nested
  /// unions; two alternatives taking one class are refused (the first byte picks).
  std::optional<error> resolve_unions() {
    std::vector<std::uint8_t> state(out_.nodes_.size(), 0);  // 1 on the stack, 2 done
    for (std::size_t i = 0; i < out_.nodes_.size(); ++i)
      if (out_.nodes_[i].is_union)
        if (auto e = resolve(static_cast<std::uint16_t>(i), state)) return e;
    return std::nullopt;
  }

  std::optional<error> resolve(std::uint16_t u, std::vector<std::uint8_t>& state) {
    if (state[u] == 2) return std::nullopt;
    if (state[u] == 1)
      return make_error(errc::invalid_argument, "{}: alternatives that contain themselves",
                        union_where_[u]);
    state[u] = 1;
    std::uint16_t pick[6] = {json_schema::none, json_schema::none, json_schema::none,
                             json_schema::none, json_schema::none, json_schema::none};
    std::size_t from[6] = {};
    constexpr int obj = static_cast<int>(json_class::object);
    // Several alternatives that are objects: one tagged union of them, when a tag tells them
    // apart (else the refusal below names the first two).
    auto tagged = tag_objects(u);
    if (!tagged) return tagged.error();
    if (*tagged != json_schema::none) {
      pick[obj] = *tagged;
      for (std::size_t a = alternatives_[u].size(); a-- > 0;)
        if (is_plain_object(alternatives_[u][a])) from[obj] = a;
    }
    for (std::size_t a = 0; a < alternatives_[u].size(); ++a) {
      const auto alt = alternatives_[u][a];
      std::uint16_t claims[6];
      std::fill(std::begin(claims), std::end(claims), json_schema::none);
      if (*tagged != json_schema::none && is_plain_object(alt)) {
        // Taken by the tagged union already.
      } else if (out_.nodes_[alt].is_union) {
        if (auto e = resolve(alt, state)) return e;
        std::copy(std::begin(out_.nodes_[alt].pick), std::end(out_.nodes_[alt].pick), claims);
      } else {
        for (int c = 0; c < 6; ++c)
          if (classes(alt) & (1u << c)) claims[c] = alt;
      }
      for (int c = 0; c < 6; ++c) {
        if (claims[c] == json_schema::none) continue;
        if (pick[c] != json_schema::none)
          return make_error(errc::invalid_argument,
                            "{}: alternatives {} and {} both take {} (the first byte of the value "
                            "must pick the alternative)",
                            union_where_[u], from[c], a, class_name(static_cast<json_class>(c)));
        pick[c] = claims[c];
        from[c] = a;
      }
    }
    std::copy(std::begin(pick), std::end(pick), out_.nodes_[u].pick);
    state[u] = 2;
    return std::nullopt;
  }

  [[nodiscard]] bool is_plain_object(std::uint16_t n) const {
    const auto& nd = out_.nodes_[n];
    return !nd.is_union && !nd.is_enum && nd.types == json_schema::t_object && nd.variants.empty();
  }

  /// The tagged union of union `u`'s object alternatives (none when fewer than two claim
  /// objects, or one of them is not a plain object type): the tag is the first property, in name
  /// order, that every one of them requires with a single value (`const`), the values distinct.
  /// An error when several objects and no such tag: the union cannot be followed.
  result<std::uint16_t> tag_objects(std::uint16_t u) {
    std::vector<std::uint16_t> objs;
    bool all_plain = true;
    for (const auto alt : alternatives_[u]) {
      const auto& nd = out_.nodes_[alt];
      const bool claims =
          nd.is_union ? false : (classes(alt) & (1u << static_cast<int>(json_class::object))) != 0;
      if (!claims) continue;
      objs.push_back(alt);
      all_plain = all_plain && is_plain_object(alt);
    }
    if (objs.size() < 2 || !all_plain) return json_schema::none;
    const auto tag_value = [&](std::uint16_t o, const std::string& name) -> const std::string* {
      const auto& nd = out_.nodes_[o];
      const auto it = std::lower_bound(nd.names.begin(), nd.names.end(), name);
      if (it == nd.names.end() || *it != name) return nullptr;
      const auto i = static_cast<std::size_t>(it - nd.names.begin());
      if (!((nd.required >> i) & 1u) || nd.values[i] == json_schema::none) return nullptr;
      const auto& v = out_.nodes_[nd.values[i]];
      if (!v.is_enum || v.literals.size() != 1) return nullptr;
      return &v.literals[0];
    };
    const std::vector<std::string> names = out_.nodes_[objs[0]].names;  // new_node() moves nodes
    for (const auto& name : names) {
      std::vector<std::pair<std::string, std::uint16_t>> by_value;
      for (const auto o : objs)
        if (const auto* l = tag_value(o, name)) by_value.emplace_back(*l, o);
      if (by_value.size() != objs.size()) continue;
      std::sort(by_value.begin(), by_value.end());
      if (std::adjacent_find(by_value.begin(), by_value.end(), [](const auto& a, const auto& b) {
            return a.first == b.first;
          }) != by_value.end())
        continue;
      auto e = new_node();
      if (!e) return e;
      auto t = new_node();
      if (!t) return t;
      auto& en = out_.nodes_[*e];
      en.types = json_schema::t_all;  // what the alternatives' own tag schemas allow
      en.is_enum = true;
      auto& tn = out_.nodes_[*t];
      tn.types = json_schema::t_object;
      tn.names = {name};
      tn.values = {*e};
      tn.required = 1;
      tn.additional = json_schema::none;
      for (auto& [l, o] : by_value) {
        out_.nodes_[*e].literals.push_back(l);
        out_.nodes_[*t].variants.push_back(o);
      }
      return *t;
    }
    return json_schema::none;
  }

  /// The classes a non-union node's values may begin with.
  std::uint8_t classes(std::uint16_t n) const {
    const auto& nd = out_.nodes_[n];
    if (!nd.is_enum) return classes_of_types(nd.types);
    std::uint8_t c = 0;
    for (const auto& l : nd.literals)
      c |= 1u << static_cast<int>(class_of(static_cast<unsigned char>(l[0])));
    return c;
  }

  /// enum / const values that the rest of their schema refuses are dropped; the rest are sorted
  /// and unique (the grammar narrows a sorted range byte by byte).
  std::optional<error> filter_literals() {
    for (auto& nd : out_.nodes_) {
      if (!nd.is_enum) continue;
      // accepts() on the node with its literals set aside: the rest of its schema.
      std::vector<std::string> all = std::move(nd.literals);
      nd.literals.clear();
      nd.is_enum = false;
      const auto id = static_cast<std::uint16_t>(&nd - out_.nodes_.data());
      std::vector<std::string> kept;
      for (const auto& l : all)
        if (out_.accepts(id, json::parse(l))) kept.push_back(l);
      nd.is_enum = true;
      std::sort(kept.begin(), kept.end());
      kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
      nd.literals = std::move(kept);
    }
    return std::nullopt;
  }

  /// The least depth of each node, a least fixpoint (recursion converges; a node that only an
  /// infinitely deep value satisfies stays unsatisfiable).
  void solve_depths() {
    static constexpr int inf = json_schema::unsatisfiable;
    auto& ns = out_.nodes_;
    for (auto& nd : ns)
      nd.depth = nd.object_depth = nd.array_depth = inf;
    const auto sat_add = [](int a) { return std::min(a + 1, inf); };
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& nd : ns) {
        int obj = inf, arr = inf, d = inf;
        if (nd.is_union) {
          for (auto p : nd.pick)
            if (p != json_schema::none) d = std::min<int>(d, ns[p].depth);
        } else if (nd.is_enum) {
          d = nd.literals.empty() ? inf : 0;
        } else {
          if (!nd.variants.empty()) {
            // Every variant must fit where the object opens: the tag picks any of them.
            obj = 0;
            for (const auto v : nd.variants)
              obj = std::max<int>(obj, ns[v].object_depth);
          } else if (nd.types & json_schema::t_object) {
            int need = 0;
            for (std::size_t i = 0; i < nd.names.size(); ++i)
              if ((nd.required >> i) & 1u)
                need = std::max<int>(
                    need, nd.values[i] == json_schema::none ? inf : ns[nd.values[i]].depth);
            obj = need >= inf ? inf : sat_add(need);
          }
          if ((nd.types & json_schema::t_array) && nd.min_items <= nd.max_items)
            arr = nd.min_items == 0
                      ? 1
                      : (ns[nd.items].depth >= inf ? inf : sat_add(ns[nd.items].depth));
          const bool scalar =
              ((nd.types & json_schema::t_string) && nd.min_length <= nd.max_length) ||
              ((nd.types & json_schema::t_integer) && nd.minimum <= nd.maximum &&
               nd.maximum >= -kLargest && nd.minimum <= kLargest) ||
              (nd.types & (json_schema::t_number | json_schema::t_boolean | json_schema::t_null));
          d = std::min({obj, arr, scalar ? 0 : inf});
        }
        if (d != nd.depth || obj != nd.object_depth || arr != nd.array_depth) {
          if (d < nd.depth || obj < nd.object_depth || arr < nd.array_depth) changed = true;
          nd.depth = static_cast<std::uint8_t>(std::min(d, static_cast<int>(nd.depth)));
          nd.object_depth =
              static_cast<std::uint8_t>(std::min(obj, static_cast<int>(nd.object_depth)));
          nd.array_depth =
              static_cast<std::uint8_t>(std::min(arr, static_cast<int>(nd.array_depth)));
        }
      }
    }
  }

  /// Drops what no value can produce: optional properties, additional properties, items,
  /// alternatives and types whose schema is unsatisfiable.
  void prune() {
    static constexpr int inf = json_schema::unsatisfiable;
    auto& ns = out_.nodes_;
    const auto dead = [&](std::uint16_t n) { return n == json_schema::none || ns[n].depth >= inf; };
    for (auto& nd : ns) {
      if (nd.is_union) {
        for (auto& p : nd.pick)
          if (p != json_schema::none && dead(p)) p = json_schema::none;
        continue;
      }
      if (nd.object_depth >= inf) nd.types &= ~json_schema::t_object;
      if (nd.array_depth >= inf) nd.types &= ~json_schema::t_array;
      if (nd.min_length > nd.max_length) nd.types &= ~json_schema::t_string;
      if (nd.minimum > nd.maximum || nd.maximum < -kLargest || nd.minimum > kLargest)
        nd.types &= ~json_schema::t_integer;
      nd.minimum = std::max(nd.minimum, -kLargest);
      nd.maximum = std::min(nd.maximum, kLargest);
      if (nd.additional != json_schema::none && dead(nd.additional))
        nd.additional = json_schema::none;
      if (dead(nd.items)) nd.max_items = 0;  // then min_items is 0: the array is alive
      std::vector<std::string> names;
      std::vector<std::uint16_t> values;
      std::uint64_t required = 0;
      for (std::size_t i = 0; i < nd.names.size(); ++i) {
        const bool req = (nd.required >> i) & 1u;
        if (!req && dead(nd.values[i])) continue;
        if (req) required |= std::uint64_t{1} << names.size();
        names.push_back(nd.names[i]);
        values.push_back(nd.values[i]);
      }
      nd.names = std::move(names);
      nd.values = std::move(values);
      nd.required = required;
    }
  }

  const json& doc_;
  json_schema out_;
  std::map<std::string, std::uint16_t> by_pointer_;
  std::set<std::string> resolving_;
  std::vector<std::vector<std::uint16_t>> alternatives_{1};  // per node: a union's alternatives
  std::map<std::uint16_t, std::string> union_where_;
};

result<json_schema> json_schema::compile(std::string_view schema_text) {
  if (schema_text.size() > max_schema_bytes)
    return make_error(errc::invalid_argument, "the schema is {} bytes, at most {}",
                      schema_text.size(), max_schema_bytes);
  const json doc = json::parse(schema_text, nullptr, false);
  if (doc.is_discarded()) return make_error(errc::invalid_argument, "the schema is not JSON");
  return schema_compiler(doc).run();
}

const json_schema& json_schema::any_object() {
  static const json_schema s = [] {
    json_schema out;
    out.nodes_.resize(2);
    out.nodes_[0].types = t_all;
    out.nodes_[1].types = t_object;
    out.root_ = 1;
    return out;
  }();
  return s;
}

bool json_schema::accepts(const json& value) const {
  return accepts(root_, value);
}

bool json_schema::accepts(std::uint16_t n, const json& v) const {
  if (n == none) return false;
  const node& nd = nodes_[n];
  if (nd.is_union) {
    json_class c = json_class::null;
    switch (v.type()) {
      case json::value_t::object:
        c = json_class::object;
        break;
      case json::value_t::array:
        c = json_class::array;
        break;
      case json::value_t::string:
        c = json_class::string;
        break;
      case json::value_t::boolean:
        c = json_class::boolean;
        break;
      case json::value_t::null:
        break;
      default:
        c = json_class::number;
    }
    return accepts(nd.pick[static_cast<int>(c)], v);
  }
  if (nd.is_enum) return std::binary_search(nd.literals.begin(), nd.literals.end(), v.dump());
  if (!nd.variants.empty()) {  // a tagged union: the tag's value picks the variant
    if (!v.is_object()) return false;
    const auto& lits = nodes_[nd.values[0]].literals;
    for (const auto& [k, x] : v.items()) {
      const std::string d = json(k).dump();
      if (d.substr(1, d.size() - 2) != nd.names[0]) continue;
      const auto it = std::lower_bound(lits.begin(), lits.end(), x.dump());
      if (it == lits.end() || *it != x.dump()) return false;
      return accepts(nd.variants[static_cast<std::size_t>(it - lits.begin())], v);
    }
    return false;
  }
  if (v.is_object()) {
    if (!(nd.types & t_object)) return false;
    std::uint64_t seen = 0;
    for (const auto& [k, x] : v.items()) {
      const std::string d = json(k).dump();
      const auto name = d.substr(1, d.size() - 2);
      const auto it = std::lower_bound(nd.names.begin(), nd.names.end(), name);
      if (it != nd.names.end() && *it == name) {
        const auto i = static_cast<std::size_t>(it - nd.names.begin());
        seen |= std::uint64_t{1} << i;
        if (!accepts(nd.values[i], x)) return false;
      } else if (!accepts(nd.additional, x)) {
        return false;
      }
    }
    return (nd.required & ~seen) == 0;
  }
  if (v.is_array()) {
    if (!(nd.types & t_array) || v.size() < nd.min_items || v.size() > nd.max_items) return false;
    return std::all_of(v.begin(), v.end(), [&](const json& x) { return accepts(nd.items, x); });
  }
  if (v.is_string()) {
    if (!(nd.types & t_string)) return false;
    const auto& s = v.get_ref<const std::string&>();
    const auto chars = static_cast<std::size_t>(std::count_if(
        s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
    return chars >= nd.min_length && chars <= nd.max_length;
  }
  if (v.is_boolean()) return (nd.types & t_boolean) != 0;
  if (v.is_null()) return (nd.types & t_null) != 0;
  // A number.
  if (nd.types & t_number) return true;
  if (!(nd.types & t_integer)) return false;
  const double d = v.get<double>();
  if (std::floor(d) != d) return false;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    return nd.maximum >= 0 && u <= static_cast<std::uint64_t>(nd.maximum) &&
           (nd.minimum <= 0 || u >= static_cast<std::uint64_t>(nd.minimum));
  }
  if (v.is_number_integer())
    return v.get<std::int64_t>() >= nd.minimum && v.get<std::int64_t>() <= nd.maximum;
  return d >= static_cast<double>(nd.minimum) && d <= static_cast<double>(nd.maximum);
}

}  // namespace tessera::inference::tokenizer
