// A JSON Schema compiled into the grammar that constrained decoding follows (OpenAI's
// `response_format: {"type": "json_schema"}`, Ollama's `"format": {schema}`).
//
// What is taken (docs/HTTP.md): `type` (one or a list), `properties`, `required`,
// `additionalProperties` (a schema or false; absent means any value), `items` (a schema or false),
// `minItems` / `maxItems`, `minLength` / `maxLength` (in characters), `minimum` / `maximum` /
// `exclusiveMinimum` / `exclusiveMaximum` on integers, `enum` and `const` (any JSON values),
// `anyOf` / `oneOf` whose alternatives begin differently (an object, an array, a string, a number,
// a boolean, null: the first byte of the value picks the alternative; objects may share the
// union when each declares one same property as required with a `const` of its own, which then
// tells them apart and comes first in the answer: a tagged union), `$ref` to any JSON pointer
// inside the schema (`#`, `#/$defs/x`, `#/definitions/x`; recursion is fine). Annotations (`title`,
// `description`, `default`, `examples`, `format`, `$schema`, ...) are read past. A keyword that
// would constrain the output in a way the grammar cannot follow (`pattern`, `allOf`, `not`,
// `uniqueItems`, bounds on non-integers, ...) is refused naming it and where it is, never ignored:
// an answer that does not validate is worse than a 400.
//
// Compilation also proves each part satisfiable (a least fixpoint over the nodes), and drops what
// can never be produced (an optional property whose schema nothing satisfies), so that every
// prefix the grammar accepts has a completion: the sampler cannot walk into a dead end.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "actors/base/result.hpp"

namespace tessera::inference::tokenizer {

/// The classes a JSON value's first byte decides: '{' '[' '"' '-'/digit 't'/'f' 'n'.
enum class json_class : std::uint8_t { object, array, string, number, boolean, null, count };

class json_schema {
 public:
  /// Bounds of what a schema may ask (a client's schema is input: its size is bounded).
  static constexpr std::size_t max_nodes = 4096;
  static constexpr std::size_t max_properties = 64;  // per object (a bit set tracks which came)
  static constexpr std::size_t max_literals = 4096;  // per enum
  static constexpr std::size_t max_schema_bytes = 64 * 1024;
  /// Containers nest at most this deep in an answer (json_prefix's stack).
  static constexpr std::uint8_t max_depth = 32;
  /// Digits a number may have: bounded, so that every answer can be forced to end.
  static constexpr std::uint8_t max_int_digits = 18, max_frac_digits = 24, max_exp_digits = 2;
  /// A depth no value reaches: the node is unsatisfiable.
  static constexpr std::uint8_t unsatisfiable = 255;
  static constexpr std::uint16_t none = 0xFFFF;
  static constexpr std::uint16_t any = 0;  // node 0: any JSON value

  /// Type bits of a node.
  static constexpr std::uint8_t t_object = 1, t_array = 2, t_string = 4, t_integer = 8,
                                t_number = 16, t_boolean = 32, t_null = 64, t_all = 127;

  struct node {
    /// A union (anyOf / oneOf): `pick[class]` is the alternative that takes a value beginning
    /// with that class, `none` when no alternative does. The fields below are then unused.
    bool is_union = false;
    std::uint16_t pick[static_cast<int>(json_class::count)] = {none, none, none, none, none, none};
    std::uint8_t types = 0;
    // Objects: declared properties sorted by their JSON-escaped names (the bytes a key has
    // between its quotes), so the names a key's prefix still matches are one contiguous range.
    std::vector<std::string> names;
    std::vector<std::uint16_t> values;
    std::uint64_t required = 0;      // bit i: names[i] must appear
    std::uint16_t additional = any;  // the schema of other keys' values; none: no other keys
    // Arrays.
    std::uint16_t items = any;
    std::uint32_t min_items = 0, max_items = std::numeric_limits<std::uint32_t>::max();
    // Strings, in characters (code points).
    std::uint32_t min_length = 0, max_length = std::numeric_limits<std::uint32_t>::max();
    // Integers.
    std::int64_t minimum = std::numeric_limits<std::int64_t>::min();
    std::int64_t maximum = std::numeric_limits<std::int64_t>::max();
    // enum / const: the values as compact JSON text, sorted and unique (the value's bytes must
    // be one of them). Non-empty: `types` is ignored.
    std::vector<std::string> literals;
    bool is_enum = false;
    // A tagged union of objects: `names` holds only the tag, `values[0]` the enum of the
    // alternatives' tag values, and `variants[i]` the object node whose tag is that enum's
    // literals[i]. The tag comes first; once its value is read, the object is that variant.
    std::vector<std::uint16_t> variants;
    // The least container depth a value of this node needs (0 for a scalar, 1 for an object with
    // no required properties, ...): as any value, written as an object, written as an array.
    // `unsatisfiable` when no such value exists. The grammar opens a container, or takes a key,
    // only where the depth left suffices, so that no accepted prefix is a dead end.
    std::uint8_t depth = 0, object_depth = 1, array_depth = 1;
  };

  /// Compiles a schema given as JSON text. Errors name the keyword and its JSON pointer.
  static result<json_schema> compile(std::string_view schema_text);
  /// JSON mode (`json_object`): any JSON object.
  static const json_schema& any_object();

  [[nodiscard]] const node& at(std::uint16_t i) const { return nodes_[i]; }
  [[nodiscard]] std::uint16_t root() const noexcept { return root_; }
  [[nodiscard]] std::size_t size() const noexcept { return nodes_.size(); }
  /// The value satisfies the compiled schema (what the grammar's complete answers do; the tests'
  /// check, and how enum values are filtered by the rest of their schema).
  [[nodiscard]] bool accepts(const nlohmann::json& value) const;
  [[nodiscard]] bool accepts(std::uint16_t node, const nlohmann::json& value) const;

 private:
  friend class schema_compiler;
  std::vector<node> nodes_;
  std::uint16_t root_ = any;
};

/// The class a value beginning with byte `c` has; json_class::count when no value begins so.
[[nodiscard]] json_class class_of(unsigned char c) noexcept;

}  // namespace tessera::inference::tokenizer
