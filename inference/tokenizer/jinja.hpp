// A Jinja subset for chat templates: the `tokenizer.chat_template` a GGUF file carries is rendered
// as Hugging Face's apply_chat_template renders it (Jinja2 with trim_blocks, lstrip_blocks and
// loop controls; `tojson` without HTML escaping; `raise_exception` and `strftime_now` as globals),
// so that a real model sees the prompt its authors trained it on.
//
// What is in: text, {{ }}, {% %}, {# #} with `-` whitespace control; if/elif/else, for (one or two
// targets, `if` filter, else, loop.*, break/continue), set (names, namespace attributes, blocks),
// macros; literals, lists, dicts, attribute and item access, slices, calls, every operator of
// Jinja's expression grammar, the filters and tests the published templates of Llama 3.x,
// Qwen 2.5/3, Mistral and Gemma use, and the string, list and dict methods they call. What is out
// (include, import, extends, blocks, call blocks, filter blocks) is a parse error naming the tag.
//
// Values follow Python: lists and dicts are shared (a namespace's attributes can be set from inside
// a loop), dicts keep insertion order, `{{ x }}` prints Python's str(x), an undefined value prints
// nothing and is false.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/base/result.hpp"

namespace tessera::inference::tokenizer::jinja {

class value;
using array = std::vector<value>;
using object = std::vector<std::pair<std::string, value>>;  ///< insertion order, as Python dicts

struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;
};
/// A callable: a global function, a macro, a bound method. Errors end the render with their text.
using function = std::function<result<value>(const call_args&)>;

class value {
 public:
  enum class kind : std::uint8_t {
    undefined,
    none,
    boolean,
    integer,
    number,
    string,
    array,
    object,
    function
  };

  value() = default;  ///< undefined
  static value none();
  value(bool b);          // NOLINT(google-explicit-constructor): literals read naturally
  value(std::int64_t i);  // NOLINT
  value(int i) : value(static_cast<std::int64_t>(i)) {}  // NOLINT
  value(double d);                                       // NOLINT
  value(std::string s);                                  // NOLINT
  value(const char* s) : value(std::string(s)) {}        // NOLINT
  value(array a);                                        // NOLINT
  value(object o);                                       // NOLINT
  value(function f);                                     // NOLINT

  [[nodiscard]] kind type() const noexcept { return kind_; }
  [[nodiscard]] bool is_undefined() const noexcept { return kind_ == kind::undefined; }
  [[nodiscard]] bool is_none() const noexcept { return kind_ == kind::none; }
  [[nodiscard]] bool is_string() const noexcept { return kind_ == kind::string; }
  [[nodiscard]] bool is_array() const noexcept { return kind_ == kind::array; }
  [[nodiscard]] bool is_object() const noexcept { return kind_ == kind::object; }
  [[nodiscard]] bool is_number() const noexcept {
    return kind_ == kind::integer || kind_ == kind::number;
  }
  [[nodiscard]] bool boolean() const noexcept { return b_; }
  [[nodiscard]] std::int64_t integer() const noexcept { return i_; }
  [[nodiscard]] double number() const noexcept {
    return kind_ == kind::integer ? static_cast<double>(i_) : d_;
  }
  [[nodiscard]] const std::string& str() const noexcept { return s_; }
  /// Shared: a copy of the value refers to the same list / dict.
  [[nodiscard]] array& items() const { return *a_; }
  [[nodiscard]] object& fields() const { return *o_; }
  [[nodiscard]] const function& fn() const { return *f_; }

  /// Python's truth value (undefined, None, False, 0, "", [] and {} are false).
  [[nodiscard]] bool truthy() const noexcept;
  /// A dict's entry (nullptr when absent or not a dict).
  [[nodiscard]] const value* find(std::string_view key) const;
  /// Sets a dict's entry (replaces, or appends in order).
  void set(std::string key, value v) const;

 private:
  kind kind_ = kind::undefined;
  bool b_ = false;
  std::int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<array> a_;
  std::shared_ptr<object> o_;
  std::shared_ptr<function> f_;
};

/// JSON (messages and tools as a client sent them) as template values. Key order matters where a
/// template prints a dict (`tools | tojson`): an ordered_json keeps the client's order.
[[nodiscard]] value from_json(const nlohmann::json& j);
[[nodiscard]] value from_json(const nlohmann::ordered_json& j);
/// Python's str() of a value, as `{{ x }}` prints it.
[[nodiscard]] std::string to_text(const value& v);
/// json.dumps(v, ensure_ascii=False) — Hugging Face's `tojson`; indent < 0: one line.
[[nodiscard]] std::string to_json_text(const value& v, int indent = -1);

struct node;  // the parsed template (jinja_impl.hpp, built by jinja_parser.cpp)

/// A parsed template. Bounds: the source up to 1 MiB, nesting 64 deep, 1M loop iterations and
/// 16 MiB of output per render — a template is data from a model file.
class template_program {
 public:
  /// Errors name the line and what is wrong ("chat template line 12: unknown tag 'include'").
  static result<template_program> parse(std::string_view source);
  /// Renders with `globals` (messages, add_generation_prompt, bos_token, ...); the built-in
  /// functions range, namespace, dict, raise_exception and strftime_now are there unless
  /// `globals` names them. A raise_exception(msg) comes back as errc::invalid_argument with msg;
  /// anything beyond this subset or its bounds as errc::unsupported.
  [[nodiscard]] result<std::string> render(const object& globals) const;

  template_program(template_program&&) noexcept;
  template_program& operator=(template_program&&) noexcept;
  ~template_program();

 private:
  template_program();
  std::shared_ptr<const node> root_;
};

}  // namespace tessera::inference::tokenizer::jinja
