// Tool calls in the OpenAI API (mesh/http/tools.hpp): what a request may carry, and the calls
// read back from an answer in each published template's format.
#include "mesh/http/tools.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh::http {
namespace {

using json = nlohmann::json;

api_request parse_chat(const std::string& body) {
  auto r = parse_request(api_kind::chat, body, "req-1", 5);
  if (auto* e = std::get_if<api_error>(&r)) {
    api_request bad;
    bad.request.id = "ERROR " + e->param + ": " + e->message;
    return bad;
  }
  return std::get<api_request>(r);
}

const char* kTools =
    R"([{"type":"function","function":{"name":"get_weather","description":"Weather.",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";

TEST(Tools, RequestsCarryToolsInTheClientsKeyOrderAndEarlierCallsAndResults) {
  const auto r = parse_chat(std::string(R"({"model":"m","tools":)") + kTools + R"(,
      "messages":[{"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
          "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"21 C"}]})");
  ASSERT_EQ(r.request.id, "req-1") << r.request.id;
  EXPECT_TRUE(r.tools);
  EXPECT_EQ(r.request.tools, json::parse(kTools).dump().size() > 0 ? r.request.tools : "");
  EXPECT_EQ(r.request.tools.find("\"type\""), 2u) << "key order kept: " << r.request.tools;
  ASSERT_EQ(r.request.messages.size(), 3u);
  EXPECT_NE(r.request.messages[1].tool_calls.find("get_weather"), std::string::npos);
  EXPECT_EQ(r.request.messages[2].role, "tool");
  EXPECT_EQ(r.request.messages[2].tool_call_id, "c1");
  // tool_choice "none": no tools sent, the answer not read for calls.
  const auto none = parse_chat(std::string(R"({"model":"m","tool_choice":"none","tools":)") + kTools +
                               R"(,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_FALSE(none.tools);
  EXPECT_TRUE(none.request.tools.empty());
}

TEST(Tools, RequiredOrANamedFunctionForcesACall) {
  const std::string msgs = R"(,"messages":[{"role":"user","content":"x"}]})";
  const auto req = parse_chat(std::string(R"({"model":"m","tool_choice":"required","tools":)") +
                              kTools + msgs);
  ASSERT_EQ(req.request.id, "req-1") << req.request.id;
  EXPECT_TRUE(req.tools);
  EXPECT_EQ(req.request.tool_choice, "required");
  EXPECT_EQ(req.request.tool_name, "");
  const auto named = parse_chat(
      std::string(R"({"model":"m","tool_choice":{"type":"function","function":{"name":)"
                  R"("get_weather"}},"tools":)") +
      kTools + msgs);
  ASSERT_EQ(named.request.id, "req-1") << named.request.id;
  EXPECT_EQ(named.request.tool_choice, "function");
  EXPECT_EQ(named.request.tool_name, "get_weather");
  const auto auto_ = parse_chat(std::string(R"({"model":"m","tool_choice":"auto","tools":)") +
                                kTools + msgs);
  EXPECT_EQ(auto_.request.tool_choice, "");
  const auto err = [](const std::string& body) { return parse_chat(body).request.id; };
  EXPECT_EQ(err(std::string(R"({"model":"m","tool_choice":{"type":"function","function":)"
                            R"({"name":"get_time"}},"tools":)") +
                kTools + msgs)
                .rfind("ERROR tool_choice: 'tool_choice' names function 'get_time'", 0),
            0u);
  EXPECT_EQ(err(std::string(R"({"model":"m","tool_choice":{"type":"function"},"tools":)") +
                kTools + msgs)
                .rfind("ERROR tool_choice", 0),
            0u);
  EXPECT_EQ(err(std::string(R"({"model":"m","tool_choice":"always","tools":)") + kTools + msgs)
                .rfind("ERROR tool_choice", 0),
            0u);
  EXPECT_EQ(err(std::string(R"({"model":"m","tool_choice":"required","tools":[])") + msgs)
                .rfind("ERROR tool_choice", 0),
            0u);
  EXPECT_EQ(err(R"({"model":"m","tool_choice":"required","tools":[{"type":"function",)"
                R"("function":{"name":"f","parameters":{"type":"object","properties":{"a":)"
                R"({"type":"string","pattern":"x+"}}}}}],"messages":[{"role":"user","content":"x"}]})")
                .rfind("ERROR tools: field 'tools': the parameters of tool 'f': "
                       "#/properties/a/pattern",
                       0),
            0u);
  EXPECT_EQ(err(std::string(R"({"model":"m","tool_choice":"required",)"
                            R"("response_format":{"type":"json_object"},"tools":)") +
                kTools + msgs)
                .rfind("ERROR response_format", 0),
            0u);
}

TEST(Tools, WhatIsMalformedIsRefusedNamingTheField) {
  const auto err = [](const std::string& body) { return parse_chat(body).request.id; };
  EXPECT_EQ(err(R"({"model":"m","tools":[{"type":"function","function":{}}],
                    "messages":[{"role":"user","content":"x"}]})")
                .rfind("ERROR tools[0].function.name", 0),
            0u);
  EXPECT_EQ(err(R"({"model":"m","tools":{},"messages":[{"role":"user","content":"x"}]})")
                .rfind("ERROR tools:", 0),
            0u);
  EXPECT_EQ(err(R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]})")
                .rfind("ERROR messages[0].tool_calls", 0),
            0u);
  auto c = parse_request(api_kind::completion, std::string(R"({"model":"m","prompt":"x","tools":)") +
                                                   kTools + "}",
                         "r", 1);
  ASSERT_TRUE(std::holds_alternative<api_error>(c));
  EXPECT_EQ(std::get<api_error>(c).param, "tools");
}

TEST(Tools, CallsAreReadInEachPublishedFormat) {
  // Hermes / Qwen: text, then blocks.
  auto h = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
      "</tool_call>");
  ASSERT_EQ(h.calls.size(), 2u);
  EXPECT_EQ(h.content, "Let me check.");
  EXPECT_EQ(h.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(h.calls[0].arguments), json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(h.calls[1].arguments, "{}");
  // Mistral.
  auto m = parse_tool_calls(
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]");
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_TRUE(m.content.empty());
  // Llama 3.x: the whole answer, "parameters", with or without the python tag.
  for (const char* text : {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
                           "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                           "\"Oslo\"}}"}) {
    auto l = parse_tool_calls(text);
    ASSERT_EQ(l.calls.size(), 1u) << text;
    EXPECT_EQ(json::parse(l.calls[0].arguments)["city"], "Oslo");
  }
  // Ordinary answers stay content, whole: braces, a tag with no call in it.
  for (const char* text : {"The answer is 4.", "{not json", "{\"a\": 1}",
                           "<tool_call>oops</tool_call>"}) {
    auto o = parse_tool_calls(text);
    EXPECT_TRUE(o.calls.empty()) << text;
    EXPECT_EQ(o.content, text);
  }
}

TEST(Tools, AStreamHoldsBackOnlyWhatMayBeACall) {
  EXPECT_EQ(tool_holdback_from("The answer"), std::string_view::npos);
  EXPECT_EQ(tool_holdback_from("  {\"name\""), 0u);
  EXPECT_EQ(tool_holdback_from("[TOOL_"), 0u);
  EXPECT_EQ(tool_holdback_from("<|pyth"), 0u);
  EXPECT_EQ(tool_holdback_from("Let me check.\n<tool_call>{"), 14u);
  EXPECT_EQ(tool_holdback_from("Let me check.<tool_"), 13u) << "a tail that may be the tag";
  EXPECT_EQ(tool_holdback_from("a < b"), std::string_view::npos);
}

TEST(Tools, RepliesCarryTheCallsAsOpenAIShapesThem) {
  api_request r = parse_chat(std::string(R"({"model":"m","tools":)") + kTools +
                             R"(,"messages":[{"role":"user","content":"x"}]})");
  serving::outcome out;
  out.text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>";
  out.stop = "end_of_generation";
  const json j = reply(r, out, 1);
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_TRUE(call["function"]["arguments"].is_string());
  EXPECT_FALSE(call["id"].get<std::string>().empty());
  const json c = tool_calls_chunk(r, parse_tool_calls(out.text).calls, 1);
  EXPECT_EQ(c["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls");
}

}  // namespace
}  // namespace tessera::mesh::http
