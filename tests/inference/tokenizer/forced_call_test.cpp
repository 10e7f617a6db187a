// Forced tool calls (inference/tokenizer/forced_call.hpp): each published template's call syntax,
// the schema a forced call is held to, and refusals that name the request's field.
#include "inference/tokenizer/forced_call.hpp"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "inference/tokenizer/json_grammar.hpp"

namespace tessera::inference::tokenizer {
namespace {

using nlohmann::json;

std::string template_text(const std::string& name) {
  std::ifstream in(std::string(TESSERA_CHAT_TEMPLATES) + "/" + name + ".jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << name;
  return ss.str();
}

// The whole text is a complete answer of `p`'s grammar.
bool takes_whole(json_prefix p, std::string_view text) {
  return p.feed(text) && p.can_end();
}

const char* const kTools =
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string","maxLength":20},"days":{"type":"integer",)"
    R"("minimum":1,"maximum":7}},"required":["city"],"additionalProperties":false}}},)"
    R"({"type":"function","function":{"name":"get_time"}}])";

TEST(ForcedCall, EachPublishedTemplateWritesItsCallsItsOwnWay) {
  for (const char* name : {"qwen2.5-7b-instruct", "qwen3-8b"}) {
    const auto s = tool_call_syntax_of(template_text(name));
    EXPECT_EQ(s.opening, "<tool_call>\n") << name;
    EXPECT_EQ(s.arguments_key, "arguments") << name;
  }
  const auto m = tool_call_syntax_of(template_text("mistral-7b-instruct-v0.3"));
  EXPECT_EQ(m.opening, "[TOOL_CALLS] [");
  EXPECT_EQ(m.arguments_key, "arguments");
  for (const char* name : {"llama-3.1-8b-instruct", "llama-3.2-3b-instruct"}) {
    const auto l = tool_call_syntax_of(template_text(name));
    EXPECT_EQ(l.opening, "") << name;
    EXPECT_EQ(l.arguments_key, "parameters") << name;
  }
  const auto g = tool_call_syntax_of(template_text("gemma-2-9b-it"));
  EXPECT_EQ(g.opening, "");
  EXPECT_EQ(g.arguments_key, "arguments");
}

TEST(ForcedCall, ANamedToolsCallFollowsItsParameters) {
  const tool_call_syntax hermes{"<tool_call>\n", "arguments"};
  auto c = force_tool_call(kTools, "get_weather", hermes);
  ASSERT_TRUE(c) << c.error().describe();
  EXPECT_EQ(c->opening, "<tool_call>\n");
  const json_prefix p(c->schema);
  EXPECT_TRUE(takes_whole(p, R"({"name":"get_weather","arguments":{"city":"Paris"}})"));
  EXPECT_TRUE(
      takes_whole(p, R"({"arguments": {"city": "Oslo", "days": 3}, "name": "get_weather"})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_time","arguments":{"city":"Paris"}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_weather","arguments":{"days":3}})"));  // city
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_weather","arguments":{"city":"x","days":9}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_weather"})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_weather","arguments":{"city":"x"},"x":1})"));
  EXPECT_TRUE(c->schema.accepts(json::parse(R"({"name":"get_weather","arguments":{"city":"a"}})")));
  // Llama 3: "parameters".
  auto l = force_tool_call(kTools, "get_weather", {"", "parameters"});
  ASSERT_TRUE(l);
  EXPECT_TRUE(takes_whole(json_prefix(l->schema),
                          R"({"name": "get_weather", "parameters": {"city": "Rome"}})"));
  EXPECT_FALSE(takes_whole(json_prefix(l->schema),
                           R"({"name": "get_weather", "arguments": {"city": "Rome"}})"));
}

TEST(ForcedCall, RequiredCallsOneToolHeldToThatToolsParameters) {
  auto c = force_tool_call(kTools, "", {});
  ASSERT_TRUE(c) << c.error().describe();
  const json_prefix p(c->schema);
  EXPECT_TRUE(takes_whole(p, R"({"name":"get_time","arguments":{}})"));
  EXPECT_TRUE(takes_whole(p, R"({"name": "get_weather", "arguments": {"city": "Paris"}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_date","arguments":{}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_time","arguments":[]})"));
  // Once named, the arguments are that tool's: get_time has none, get_weather needs a city.
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_time","arguments":{"city":"Paris"}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_weather","arguments":{}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"get_weather","arguments":{"city":"x","days":9}})"));
  // The name comes first (as the templates write calls), so that it decides the arguments.
  EXPECT_FALSE(takes_whole(p, R"({"arguments":{},"name":"get_time"})"));
  EXPECT_TRUE(c->schema.accepts(json::parse(R"({"arguments":{},"name":"get_time"})")));
  EXPECT_FALSE(c->schema.accepts(json::parse(R"({"name":"get_time","arguments":{"a":1}})")));
  // Two tools of one name cannot be told apart.
  const std::string twice = json::parse(kTools)[1].dump();
  auto dup = force_tool_call("[" + twice + "," + twice + "]", "", {});
  ASSERT_FALSE(dup);
  EXPECT_NE(dup.error().message.find("tools[0] and tools[1] are both named 'get_time'"),
            std::string::npos)
      << dup.error().message;
  // One tool: required is that tool, held to its parameters.
  const std::string one = json::parse(kTools)[0].dump();
  auto only = force_tool_call("[" + one + "]", "", {});
  ASSERT_TRUE(only);
  EXPECT_FALSE(takes_whole(json_prefix(only->schema), R"({"name":"get_weather","arguments":{}})"));
}

TEST(ForcedCall, ReferencesInsideParametersKeepTheirTargets) {
  const std::string tools =
      R"([{"type":"function","function":{"name":"tree","parameters":{"$defs":{"leaf":)"
      R"({"type":"integer","minimum":0,"maximum":9}},"type":"object","properties":{"v":)"
      R"({"$ref":"#/$defs/leaf"},"kids":{"type":"array","maxItems":2,"items":{"$ref":"#"}}},)"
      R"("required":["v"]}}}])";
  auto c = force_tool_call(tools, "tree", {});
  ASSERT_TRUE(c) << c.error().describe();
  const json_prefix p(c->schema);
  EXPECT_TRUE(takes_whole(p, R"({"name":"tree","arguments":{"v":1,"kids":[{"v":2}]}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"tree","arguments":{"v":1,"kids":[{"v":12}]}})"));
  EXPECT_FALSE(takes_whole(p, R"({"name":"tree","arguments":{"v":1,"kids":[{"name":"x"}]}})"));
}

TEST(ForcedCall, RefusalsNameTheField) {
  auto unknown = force_tool_call(kTools, "get_date", {});
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("field 'tool_name': no tool named 'get_date'"),
            std::string::npos)
      << unknown.error().message;
  auto pattern =
      force_tool_call(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
                      R"("properties":{"a":{"type":"string","pattern":"x+"}}}}}])",
                      "f", {});
  ASSERT_FALSE(pattern);
  EXPECT_NE(pattern.error().message.find("field 'tools': the parameters of tool 'f': "
                                         "#/properties/a/pattern"),
            std::string::npos)
      << pattern.error().message;
  for (const char* bad : {"", "{}", "[]", "[1]", R"([{"function":{}}])"}) {
    auto e = force_tool_call(bad, "", {});
    ASSERT_FALSE(e) << bad;
    EXPECT_EQ(e.error().message.rfind("field 'tools'", 0), 0u) << e.error().message;
  }
}

}  // namespace
}  // namespace tessera::inference::tokenizer
