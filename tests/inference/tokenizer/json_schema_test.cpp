// JSON Schema constrained decoding: the compiler's refusals, the grammar against hand-written
// documents, random walks that must never reach a dead end and whose answers must validate (by
// the compiled schema and by a hand-written check), and the token mask under a schema.
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "inference/tokenizer/json_grammar.hpp"
#include "inference/tokenizer/json_schema.hpp"
#include "inference/tokenizer/synth_vocab.hpp"

namespace tessera::inference::tokenizer {
namespace {

using nlohmann::json;

json_schema compiled(const std::string& text) {
  auto s = json_schema::compile(text);
  EXPECT_TRUE(s) << text << ": " << (s ? "" : s.error().describe());
  return s ? std::move(*s) : json_schema::any_object();
}

std::size_t bytes_taken(json_prefix& p, std::string_view text) {
  std::size_t n = 0;
  for (unsigned char c : text) {
    if (!p.feed(c)) return n;
    ++n;
  }
  return n;
}

// A person: bounded strings, a bounded integer, an enum of mixed values, a bounded array, a union
// of a string and null, and an optional recursive child.
const char* const kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8, "description": "read past"},
    "age": {"type": "integer", "minimum": 18, "exclusiveMaximum": 121},
    "role": {"enum": ["admin", "user", null, 3]},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
    "ok": {"type": "boolean"},
    "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
    "child": {"$ref": "#"}
  },
  "required": ["name", "age", "role", "tags"],
  "additionalProperties": false,
  "$defs": {"tag": {"type": "string", "maxLength": 3}}
})";

std::size_t chars(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    n += (c & 0xC0) != 0x80;
  return n;
}

/// kPerson checked by hand, independently of the compiler.
bool is_person(const json& v) {
  if (!v.is_object()) return false;
  static const std::set<std::string> known = {"name", "age", "role", "tags", "ok", "note", "child"};
  for (const auto& [k, x] : v.items())
    if (!known.contains(k)) return false;
  for (const char* r : {"name", "age", "role", "tags"})
    if (!v.contains(r)) return false;
  const auto& name = v["name"];
  if (!name.is_string() || chars(name) < 1 || chars(name) > 8) return false;
  const auto& age = v["age"];
  if (!age.is_number_integer() || age.get<std::int64_t>() < 18 || age.get<std::int64_t>() > 120)
    return false;
  if (v["role"] != "admin" && v["role"] != "user" && !v["role"].is_null() && v["role"] != 3)
    return false;
  const auto& tags = v["tags"];
  if (!tags.is_array() || tags.empty() || tags.size() > 3) return false;
  for (const auto& t : tags)
    if (!t.is_string() || chars(t) > 3) return false;
  if (v.contains("ok") && !v["ok"].is_boolean()) return false;
  if (v.contains("note") && !v["note"].is_null() &&
      !(v["note"].is_string() && chars(v["note"]) <= 5))
    return false;
  return !v.contains("child") || is_person(v["child"]);
}

TEST(JsonSchema, RefusesWhatTheGrammarCannotFollowNamingKeywordAndPlace) {
  struct bad {
    std::string schema;
    std::string says;
  };
  for (
      const auto& [schema, says] : std::vector<bad>{
          {R"({"properties": {"a": {"type": "string", "pattern": "^x"}}})",
           "#/properties/a/pattern"},
          {R"({"allOf": [{"type": "string"}]})", "#/allOf: 'allOf' is not supported"},
          {R"({"anyOf": [{"type": "object"}, {"properties": {}}]})",
           "#/anyOf: alternatives 0 and 1 both take an object"},
          {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "both take a number"},
          {R"({"$ref": "#/$defs/missing"})", "'#/$defs/missing' is not in the schema"},
          {R"({"$ref": "https://example.com/s.json"})", "only references inside the schema"},
          {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
           "a cycle of references"},
          {R"({"type": "number", "minimum": 0})", "#/minimum: bounds are taken on integers only"},
          {R"({"type": "strin"})", "#/type: \"strin\" is not a JSON type"},
          {R"({"type": "string", "minLength": 3, "maxLength": 2})", "no JSON value satisfies"},
          {R"({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})",
           "no JSON value satisfies"},
          {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no JSON value satisfies"},
          {R"({"type": "array", "items": [{"type": "string"}]})", "a tuple"},
          {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
          {R"({"required": ["x"], "additionalProperties": false, "type": "object"})",
           "no JSON value satisfies"},
          {"{not json", "the schema is not JSON"},
          {"[1]", "#: a schema must be an object or a boolean"},
      }) {
    const auto s = json_schema::compile(schema);
    ASSERT_FALSE(s) << schema;
    EXPECT_NE(s.error().describe().find(says), std::string::npos)
        << schema << " -> " << s.error().describe();
  }
  // Nesting deeper than the grammar's stack.
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 40; ++i)
    deep = R"({"type": "array", "minItems": 1, "items": )" + deep + "}";
  const auto d = json_schema::compile(deep);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().describe().find("nested 40 deep, at most 32"), std::string::npos)
      << d.error().describe();
  EXPECT_FALSE(json_schema::compile(std::string(json_schema::max_schema_bytes + 1, ' ')));
}

TEST(JsonSchema, TheGrammarTakesValidAnswersAndRefusesTheFirstByteOfAnInvalidOne) {
  const auto schema = compiled(kPerson);
  for (const std::string doc :
       {R"({"name":"Bob","age":42,"role":"admin","tags":["a"]})",
        R"({ "tags" : ["", "xyz", "é€😀"], "role" : null, "age" : 120, "name" : "\"q\"\\\n",
           "note": null, "ok": false, "child": {"name": "c", "age": 18, "role": 3, "tags": ["t"],
           "note": "hello"} })"}) {
    json_prefix p(schema);
    ASSERT_EQ(bytes_taken(p, doc), doc.size()) << doc;
    EXPECT_TRUE(p.complete()) << doc;
    const auto v = json::parse(doc);
    EXPECT_TRUE(schema.accepts(v)) << doc;
    EXPECT_TRUE(is_person(v)) << doc;
  }
  struct bad {
    std::string text;
    std::size_t good;
  };
  for (const auto& [text, good] : std::vector<bad>{
           {R"({"age":17)", 8},   // 17 < 18, and no digit makes it valid
           {R"({"age":121)", 9},  // exclusiveMaximum 121
           {R"({"age":1.5)", 8},  // an integer
           {R"({"age":-1)", 7},   // no negative age can be valid
           {R"({"x")", 2},        // no undeclared keys
           {R"({"name":"")", 9},  // minLength 1
           {R"({"name":"123456789")", 17},
           {R"({"name":"a","name")", 14},  // no duplicates ("n" may still be "note")
           {R"({"name":"a"})", 11},        // required names missing
           {R"({"tags":[])", 9},           // minItems 1
           {R"({"tags":["a","b","c",)", 20},
           {R"({"tags":["abcd")", 13},
           {R"({"role":"guest")", 9},
           {R"({"role":33)", 9},
           {R"({"ok":nul)", 6},
           {R"({"note":12)", 8},
       }) {
    json_prefix p(schema);
    EXPECT_EQ(bytes_taken(p, text), good) << text;
  }
}

// A tagged union: objects told apart by "kind" (a const each), beside a string.
const char* const kShapes = R"({"oneOf": [
  {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer",
   "minimum": 1, "maximum": 9}}, "required": ["kind", "r"], "additionalProperties": false},
  {"type": "object", "properties": {"kind": {"const": "dot"}}, "required": ["kind"],
   "additionalProperties": false},
  {"type": "object", "properties": {"w": {"type": "integer", "minimum": 0, "maximum": 5},
   "kind": {"enum": ["box"]}, "tag": {"type": "string", "maxLength": 2}},
   "required": ["w", "kind"], "additionalProperties": false},
  {"type": "string", "maxLength": 4}
]})";

TEST(JsonSchema, ATaggedUnionOfObjectsFollowsTheVariantItsTagNames) {
  const auto schema = compiled(kShapes);
  for (const std::string doc : {R"({"kind":"circle","r":3})", R"({"kind": "dot"})",
                                R"({"kind":"box","tag":"ab","w":0})", R"("abc")"}) {
    json_prefix p(schema);
    ASSERT_EQ(bytes_taken(p, doc), doc.size()) << doc;
    EXPECT_TRUE(p.complete()) << doc;
    EXPECT_TRUE(schema.accepts(json::parse(doc))) << doc;
  }
  struct bad {
    std::string text;
    std::size_t good;
  };
  for (const auto& [text, good] : std::vector<bad>{
           {R"({"r":3,"kind":"circle"})", 2},  // the tag comes first
           {R"({"kind":"square")", 9},         // no such variant
           {R"({"kind":"dot","r":1})", 13},    // a dot has no radius
           {R"({"kind":"circle"})", 16},       // a circle needs one
           {R"({"kind":"circle","r":10})", 22},
           {R"({"kind":"box","kind")", 15},  // the tag once
       }) {
    json_prefix p(schema);
    EXPECT_EQ(bytes_taken(p, text), good) << text;
  }
  // accepts() reads the value, whose keys have no order.
  EXPECT_TRUE(schema.accepts(json::parse(R"({"r":3,"kind":"circle"})")));
  EXPECT_FALSE(schema.accepts(json::parse(R"({"kind":"dot","r":1})")));
  EXPECT_FALSE(schema.accepts(json::parse(R"({"kind":"square"})")));
  EXPECT_FALSE(schema.accepts(json::parse(R"({"r":3})")));
  // Without a tag that tells the objects apart, the union is refused as before.
  for (const char* untagged :
       {R"({"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                      {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}]})",
        R"({"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                      {"type": "object", "properties": {"k": {"const": 2}}}]})"}) {
    auto e = json_schema::compile(untagged);
    ASSERT_FALSE(e) << untagged;
    EXPECT_NE(e.error().message.find("both take an object"), std::string::npos)
        << e.error().message;
  }
}

TEST(JsonSchema, TopLevelScalarsAndEnumsEndWhereTheyMay) {
  const auto ints = compiled(R"({"type": "integer", "minimum": -5, "maximum": 300})");
  json_prefix twelve(ints);
  ASSERT_TRUE(twelve.feed("12"));
  EXPECT_TRUE(twelve.can_end());
  EXPECT_FALSE(twelve.complete());
  for (const auto& [text, good] : std::vector<std::pair<std::string, std::size_t>>{
           {"-6", 1}, {"-0", 2}, {"301", 2}, {"3000", 3}, {"00", 1}, {"300 ", 4}}) {
    json_prefix p(ints);
    EXPECT_EQ(bytes_taken(p, text), good) << text;
  }
  json_prefix minus(ints);
  ASSERT_TRUE(minus.feed("-"));
  EXPECT_FALSE(minus.can_end());

  const auto e = compiled(R"({"enum": ["a", "ab", 1, 12, {"k": [true]}]})");
  json_prefix a(e);
  ASSERT_TRUE(a.feed("\"a\""));
  EXPECT_TRUE(a.complete());
  json_prefix one(e);
  ASSERT_TRUE(one.feed("1"));
  EXPECT_TRUE(one.can_end());
  EXPECT_TRUE(one.feed('2'));
  EXPECT_TRUE(one.can_end());
  EXPECT_FALSE(json_prefix(one).feed('3'));
  json_prefix obj(e);
  ASSERT_TRUE(obj.feed(R"({"k":[true]})"));
  EXPECT_TRUE(obj.complete());
  json_prefix spaced(e);
  EXPECT_EQ(bytes_taken(spaced, R"({"k": )"), 5u);  // enum values are written compactly
}

/// A random walk through the bytes the grammar takes: never a dead end; once past `patience`
/// steps it prefers bytes that close things, so that it ends.
std::string walk(const json_schema& schema, std::mt19937_64& rng, bool& ended) {
  json_prefix p(schema);
  std::string text;
  static const std::string closing = "\"}]0,:e";
  for (int step = 0; step < 4000; ++step) {
    if (p.complete() || (p.can_end() && rng() % 4 == 0)) {
      ended = true;
      return text;
    }
    std::vector<unsigned char> ok;
    for (int c = 0; c < 256; ++c) {
      json_prefix next = p;
      if (next.feed(static_cast<unsigned char>(c))) ok.push_back(static_cast<unsigned char>(c));
    }
    if (ok.empty()) {
      ADD_FAILURE() << "a dead end after: " << text;
      ended = false;
      return text;
    }
    unsigned char c = ok[rng() % ok.size()];
    if (step > 150) {
      for (char pref : closing)
        if (std::find(ok.begin(), ok.end(), static_cast<unsigned char>(pref)) != ok.end()) {
          c = static_cast<unsigned char>(pref);
          break;
        }
    }
    (void)p.feed(c);
    text += static_cast<char>(c);
  }
  ended = p.complete() || p.can_end();
  return text;
}

TEST(JsonSchema, RandomWalksNeverReachADeadEndAndTheirAnswersValidate) {
  std::mt19937_64 rng(11);
  const auto person = compiled(kPerson);
  const std::vector<std::string> others = {
      R"({"type": "object", "additionalProperties": {"type": "integer", "minimum": -3, "maximum": 3}})",
      R"({"type": ["string", "null", "boolean"], "maxLength": 2})",
      R"({"anyOf": [{"type": "array", "items": {"$ref": "#"}, "maxItems": 2}, {"enum": [1, 10, 100, "x"]}]})",
      R"({"type": "object", "properties": {"a\"b": {"const": "q"}, "a": {"type": "number"}, "ab": {"type": "null"}}, "required": ["a"], "additionalProperties": false})",
      R"({"type": "integer", "minimum": 1000, "maximum": 1005})",
      R"({"type": "object", "properties": {"x": {"type": "object", "properties": {"y": {"$ref": "#/properties/x"}}}}})",
      kShapes,
  };
  int ended = 0;
  for (int n = 0; n < 300; ++n) {
    bool done = false;
    const auto text = walk(person, rng, done);
    if (!done) continue;
    ++ended;
    const auto v = json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    EXPECT_TRUE(is_person(v)) << text;
    EXPECT_TRUE(person.accepts(v)) << text;
  }
  EXPECT_GT(ended, 250);
  for (const auto& s : others) {
    const auto schema = compiled(s);
    for (int n = 0; n < 150; ++n) {
      bool done = false;
      const auto text = walk(schema, rng, done);
      ASSERT_TRUE(done) << s << ": " << text;
      const auto v = json::parse(text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << s << ": " << text;
      EXPECT_TRUE(schema.accepts(v)) << s << ": " << text;
    }
  }
}

TEST(JsonSchema, TheMaskUnderASchemaIsExactlyWhatTheGrammarTakes) {
  auto v = synth_bpe_vocab(1024);
  ASSERT_TRUE(v) << v.error().describe();
  auto t = tokenizer::create(std::move(*v));
  ASSERT_TRUE(t) << t.error().describe();
  const json_vocab jv(*t);
  const auto schema = compiled(
      R"({"type": "object", "properties": {"k": {"type": "string", "maxLength": 3},
          "n": {"type": "integer", "maximum": 50}, "more": {"type": "boolean"}},
          "required": ["k"], "additionalProperties": false})");
  for (const char* prefix : {"", "{", "{\"k\":\"", "{\"k\":\"ab", "{\"k\":\"abc", "{\"", "{\"m",
                             "{\"k\":\"a\",\"n\":4", "{\"k\":\"a\","}) {
    json_prefix st(schema);
    ASSERT_TRUE(st.feed(prefix)) << prefix;
    std::vector<float> l(t->size(), 1.0f);
    const auto n = jv.mask(st, l);
    EXPECT_GT(n, 0u) << prefix;
    for (std::size_t i = 0; i < l.size(); ++i) {
      const auto id = static_cast<token_id>(i);
      json_prefix p = st;
      const bool takes = t->is_end_of_generation(id)
                             ? st.can_end()
                             : t->type(id) != token_type::control && !t->token_bytes(id).empty() &&
                                   p.feed(t->token_bytes(id));
      ASSERT_EQ(!std::isinf(l[i]), takes) << prefix << " token " << i;
    }
  }
  // A top-level integer may end (or go on) after a digit: the end of generation is allowed.
  const auto ints = compiled(R"({"type": "integer", "maximum": 99})");
  json_prefix four(ints);
  ASSERT_TRUE(four.feed("4"));
  std::vector<float> l(t->size(), 1.0f);
  jv.mask(four, l);
  bool end_allowed = false;
  for (std::size_t i = 0; i < l.size(); ++i)
    if (t->is_end_of_generation(static_cast<token_id>(i)) && !std::isinf(l[i])) end_allowed = true;
  EXPECT_TRUE(end_allowed);
}

}  // namespace
}  // namespace tessera::inference::tokenizer
