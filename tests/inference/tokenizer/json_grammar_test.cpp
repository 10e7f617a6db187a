// JSON-constrained decoding: the byte-level validator against nlohmann's parser, and the token
// mask against a synthetic vocabulary.
#include "inference/tokenizer/json_grammar.hpp"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "inference/tokenizer/synth_vocab.hpp"

namespace tessera::inference::tokenizer {
namespace {

/// Feeds `text`; returns how many bytes were accepted before the first refusal.
std::size_t accepted(json_prefix& p, std::string_view text) {
  std::size_t n = 0;
  for (unsigned char c : text) {
    if (!p.feed(c)) return n;
    ++n;
  }
  return n;
}

TEST(JsonPrefix, AcceptsObjectsByteByByteAndKnowsWhenOneIsComplete) {
  for (const std::string doc :
       {R"({})", R"( { "a" : 1 } )", "{\"a\":[1,-2.5e+3,0.25,0,-0,1E9,true,false,null,[],{}]}",
        "{\"s\":\"x\\u00e9\\n\\\"\\\\\\/"
        "\\b\\f\\r\\t\",\"\xc3\xa9\":\"\xe2\x82\xac\xf0\x9f\x98\x80\"}",
        "{\n  \"nested\": {\"deep\": [[[{\"k\": \"v\"}]]]}\n}\n"}) {
    json_prefix p;
    ASSERT_EQ(accepted(p, doc), doc.size()) << doc;
    EXPECT_TRUE(p.complete()) << doc;
    EXPECT_TRUE(nlohmann::json::parse(doc).is_object());
  }
  json_prefix p;
  ASSERT_EQ(accepted(p, R"({"a":1)"), 6u);
  EXPECT_FALSE(p.complete());
}

TEST(JsonPrefix, RefusesTheFirstByteThatNoValidObjectHas) {
  struct bad {
    std::string text;
    std::size_t good;  // bytes accepted before the refusal
  };
  for (const auto& [text, good] : std::vector<bad>{
           {"[1]", 0},  // the top level is an object
           {"1", 0},
           {"{\"a\" 1}", 5},         // a colon after a key
           {"{\"a\":01}", 6},        // no leading zeros
           {"{\"a\":tru}", 8},       // not a literal
           {"{\"a\":\"\x01\"}", 6},  // control characters are escaped
           {"{,", 1},
           {"{\"a\":1,}", 7},                // no trailing comma
           {"{\"a\":1]", 6},                 // brackets match
           {"{\"a\":\"\xc0\xaf\"}", 6},      // an overlong UTF-8 form
           {"{\"a\":\"\xed\xa0\x80\"}", 7},  // a UTF-8 surrogate
           {"{\"a\":\"\\ud800\"}", 9},       // a surrogate escape
           {"{\"a\":\"\\x\"}", 7},           // an unknown escape
           {"{\"a\":-}", 6},
           {"{\"a\":1.}", 7},
           {"{} x", 3},  // nothing after the object but blanks
       }) {
    json_prefix p;
    EXPECT_EQ(accepted(p, text), good) << text;
  }
  // Bounds: nesting and runs of blanks.
  json_prefix deep;
  std::string nest = "{\"a\":";
  for (int i = 0; i < 40; ++i)
    nest += "[";
  EXPECT_EQ(accepted(deep, nest), 5u + json_prefix::max_depth - 1);
  json_prefix blanks;
  EXPECT_EQ(accepted(blanks, "{" + std::string(40, ' ')), 1u + json_prefix::max_blank_run);
}

// Random JSON objects as nlohmann writes them (compact and indented) are accepted whole; random
// byte strings from JSON's alphabet that json_prefix accepts and calls complete are objects
// nlohmann parses, and every prefix of an accepted string was accepted.
TEST(JsonPrefix, AgreesWithNlohmannOnRandomDocumentsAndRandomBytes) {
  std::mt19937_64 rng(5);
  const auto value = [&](auto&& self, int depth) -> nlohmann::json {
    switch (rng() % (depth < 4 ? 7 : 4)) {
      case 0:
        return static_cast<std::int64_t>(rng() % 2000) - 1000;
      case 1:
        return std::ldexp(static_cast<double>(rng() % 10000), -static_cast<int>(rng() % 20));
      case 2: {
        static const char* const pieces[] = {"a", "\xc3\xa9", "\"", "\\", "\n", "\xf0\x9f\x98\x80"};
        std::string str;
        for (std::uint64_t k = rng() % 5; k > 0; --k)
          str += pieces[rng() % 6];
        return str;
      }
      case 3:
        return rng() % 2 == 0 ? nlohmann::json(nullptr) : nlohmann::json(rng() % 2 == 0);
      case 4: {
        auto a = nlohmann::json::array();
        for (std::uint64_t k = rng() % 4; k > 0; --k)
          a.push_back(self(self, depth + 1));
        return a;
      }
      default: {
        auto o = nlohmann::json::object();
        for (std::uint64_t k = rng() % 4; k > 0; --k)
          o["k" + std::to_string(rng() % 10)] = self(self, depth + 1);
        return o;
      }
    }
  };
  for (int n = 0; n < 2000; ++n) {
    nlohmann::json doc = nlohmann::json::object();
    doc["v"] = value(value, 0);
    const std::string text = doc.dump(n % 2 == 0 ? -1 : 2);
    json_prefix p;
    ASSERT_EQ(accepted(p, text), text.size()) << text;
    EXPECT_TRUE(p.complete()) << text;
  }
  const std::string alphabet = "{}[]:,\"a01-.eE tfnrulse\\";
  int complete = 0;
  for (int n = 0; n < 200000; ++n) {
    std::string text;
    json_prefix p;
    for (int k = 0; k < 24; ++k) {
      const char c = alphabet[rng() % alphabet.size()];
      json_prefix next = p;
      if (!next.feed(static_cast<unsigned char>(c))) continue;  // what a mask would refuse
      p = next;
      text += c;
    }
    if (!p.complete()) continue;
    ++complete;
    const auto parsed = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << text;
    EXPECT_TRUE(parsed.is_object()) << text;
  }
  EXPECT_GT(complete, 100);
}

TEST(JsonVocab, MasksTokensThatCannotContinueAndOnlyEndsACompleteObject) {
  auto v = synth_bpe_vocab(1024);
  ASSERT_TRUE(v) << v.error().describe();
  auto t = tokenizer::create(std::move(*v));
  ASSERT_TRUE(t) << t.error().describe();
  const json_vocab jv(*t);
  std::vector<float> logits(t->size() + 3, 1.0f);  // a model's vocabulary may be padded
  json_prefix start;
  const auto n = jv.mask(start, logits);
  ASSERT_GT(n, 0u);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isinf(logits[i])) continue;
    ASSERT_LT(i, t->size());
    const auto bytes = t->token_bytes(static_cast<token_id>(i));
    json_prefix p;
    EXPECT_TRUE(p.feed(bytes)) << "allowed token " << i << " '" << bytes << "'";
    EXPECT_FALSE(t->is_end_of_generation(static_cast<token_id>(i)));
  }
  // Inside a string (the mask's fast path for string-safe tokens) and in the other states, the
  // mask allows exactly the tokens whose bytes the validator takes.
  for (const char* prefix : {"{\"k\":\"ab", "{\"k\":\"a\xc3", "{\"k\":\"a\\", "{\"k\":[1",
                             "{\"k\":tr", "{\"k\":{\"x\":null},"}) {
    json_prefix st;
    ASSERT_TRUE(st.feed(prefix)) << prefix;
    std::vector<float> l(t->size(), 1.0f);
    jv.mask(st, l);
    for (std::size_t i = 0; i < l.size(); ++i) {
      const auto id = static_cast<token_id>(i);
      json_prefix p = st;
      const bool takes = !t->is_end_of_generation(id) && t->type(id) != token_type::control &&
                         !t->token_bytes(id).empty() && p.feed(t->token_bytes(id));
      ASSERT_EQ(!std::isinf(l[i]), takes) << prefix << " token " << i;
    }
  }
  // A complete object: only the end of generation remains.
  json_prefix done;
  ASSERT_TRUE(done.feed("{}"));
  std::vector<float> after(t->size(), 1.0f);
  jv.mask(done, after);
  for (std::size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(!std::isinf(after[i]), t->is_end_of_generation(static_cast<token_id>(i))) << i;
}

}  // namespace
}  // namespace tessera::inference::tokenizer
