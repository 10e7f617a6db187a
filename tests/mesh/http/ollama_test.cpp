// Ollama's API shapes (mesh/http/ollama.hpp): bodies to serving requests with Ollama's defaults,
// the fields refused by name, and the objects a client reads.
#include "mesh/http/ollama.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh::http {
namespace {

using json = nlohmann::json;

api_request ok(api_dialect d, const std::string& body, bool* empty = nullptr) {
  auto r = parse_ollama(d, body, "req-1", 42, empty);
  if (auto* e = std::get_if<api_error>(&r)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<api_request>(r);
}

TEST(Ollama, GenerateTemplatesThePromptWithOllamasDefaults) {
  bool empty = true;
  const auto r = ok(api_dialect::ollama_generate,
                    R"({"model":"tiny:latest","prompt":"Why?","system":"Be brief."})", &empty);
  EXPECT_FALSE(empty);
  EXPECT_EQ(r.model_as_sent, "tiny:latest");
  EXPECT_EQ(r.request.model, "tiny");
  EXPECT_TRUE(r.stream);  // Ollama streams unless told not to
  EXPECT_EQ(r.kind, api_kind::chat);
  ASSERT_EQ(r.request.messages.size(), 2u);
  EXPECT_EQ(r.request.messages[0].role, "system");
  EXPECT_EQ(r.request.messages[1].content, "Why?");
  EXPECT_FLOAT_EQ(r.request.temperature, ollama_default_temperature);
  EXPECT_EQ(r.request.top_k, ollama_default_top_k);
  EXPECT_FLOAT_EQ(r.request.top_p, ollama_default_top_p);
  EXPECT_FLOAT_EQ(r.request.repeat_penalty, ollama_default_repeat_penalty);
  EXPECT_EQ(r.request.max_tokens, serving::max_tokens_limit);
  EXPECT_EQ(r.request.seed, 42u);
  // raw: the prompt as it is; options map onto the request.
  const auto raw = ok(api_dialect::ollama_generate,
                      R"({"model":"m","prompt":"p","raw":true,"stream":false,
                          "options":{"temperature":0,"top_k":3,"top_p":0.5,"min_p":0.1,
                                     "seed":7,"num_predict":9,"repeat_penalty":1.0,
                                     "presence_penalty":0.5,"stop":["\n"],"num_ctx":8192}})");
  EXPECT_EQ(raw.kind, api_kind::completion);
  EXPECT_EQ(raw.request.prompt, "p");
  EXPECT_FALSE(raw.stream);
  EXPECT_EQ(raw.request.temperature, 0.0f);
  EXPECT_EQ(raw.request.top_k, 3);
  EXPECT_FLOAT_EQ(raw.request.min_p, 0.1f);
  EXPECT_EQ(raw.request.seed, 7u);
  EXPECT_EQ(raw.request.max_tokens, 9u);
  EXPECT_FLOAT_EQ(raw.request.presence_penalty, 0.5f);
  EXPECT_EQ(raw.stop, std::vector<std::string>{"\n"});
  // num_predict -1: as far as a request may go; an empty prompt is the "load" call.
  EXPECT_EQ(
      ok(api_dialect::ollama_generate, R"({"model":"m","prompt":"p","options":{"num_predict":-1}})")
          .request.max_tokens,
      serving::max_tokens_limit);
  ok(api_dialect::ollama_generate, R"({"model":"m"})", &empty);
  EXPECT_TRUE(empty);
}

TEST(Ollama, ChatTakesMessagesAndEveryRefusalNamesItsField) {
  const auto r = ok(api_dialect::ollama_chat,
                    R"({"model":"m","messages":[{"role":"system","content":"s"},
                                                {"role":"user","content":"u"}]})");
  ASSERT_EQ(r.request.messages.size(), 2u);
  EXPECT_EQ(r.dialect, api_dialect::ollama_chat);
  // "format": a JSON schema (an object) is taken and carried to the peer.
  const auto f = ok(api_dialect::ollama_chat,
                    R"({"model":"m","messages":[{"role":"user","content":"u"}],
                        "format":{"type":"object","properties":{"a":{"type":"boolean"}}}})");
  EXPECT_EQ(f.request.format, "json_schema");
  EXPECT_NE(f.request.schema.find("\"boolean\""), std::string::npos) << f.request.schema;
  struct row {
    api_dialect d;
    const char* body;
    const char* param;
  };
  const row rows[] = {
      {api_dialect::ollama_chat, R"({"messages":[{"role":"user","content":"u"}]})", "model"},
      {api_dialect::ollama_chat, R"({"model":"m","messages":[]})", "messages"},
      {api_dialect::ollama_chat, R"({"model":"m","messages":[{"role":"robot","content":"x"}]})",
       "messages[0].role"},
      {api_dialect::ollama_chat,
       R"({"model":"m","messages":[{"role":"user","content":"x","images":["aGk="]}]})",
       "messages[0].images"},
      {api_dialect::ollama_chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"format":{"not":{}}})", "format"},
      {api_dialect::ollama_chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"format":"yaml"})", "format"},
      {api_dialect::ollama_chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]})", "tools[0]"},
      {api_dialect::ollama_generate,
       R"({"model":"m","prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})",
       "tools"},
      {api_dialect::ollama_generate, R"({"model":"m","prompt":"x","context":[1,2]})", "context"},
      {api_dialect::ollama_generate, R"({"model":"m","prompt":5})", "prompt"},
      {api_dialect::ollama_generate, R"({"model":"m","prompt":"x","options":{"temperature":9}})",
       "options.temperature"},
      {api_dialect::ollama_generate, R"({"model":"m","prompt":"x","options":{"num_predict":0}})",
       "options.num_predict"},
      {api_dialect::ollama_generate, R"({"model":"m","prompt":"x","options":{"stop":[1]}})",
       "options.stop"},
      {api_dialect::ollama_generate, R"({"model":"m","prompt":"x","options":[]})", "options"},
      {api_dialect::ollama_generate, R"({"model":"m","prompt":"x","stream":"no"})", "stream"},
  };
  for (const auto& w : rows) {
    auto res = parse_ollama(w.d, w.body, "id", 1);
    ASSERT_TRUE(std::holds_alternative<api_error>(res)) << w.body;
    const auto& e = std::get<api_error>(res);
    EXPECT_EQ(e.status, 400) << w.body;
    EXPECT_EQ(e.param, w.param) << w.body << " -> " << e.message;
    EXPECT_NE(e.message.find(w.param), std::string::npos) << w.body << " -> " << e.message;
  }
  for (const char* garbage : {"", "{", "[]", "null"})
    EXPECT_TRUE(std::holds_alternative<api_error>(
        parse_ollama(api_dialect::ollama_chat, garbage, "id", 1)));
}

TEST(Ollama, ObjectsHaveOllamasShape) {
  auto chat = ok(api_dialect::ollama_chat,
                 R"({"model":"tiny:latest","messages":[{"role":"user","content":"u"}]})");
  const json c = ollama_chunk(chat, "Hel", "2026-11-29T00:00:00.000000Z");
  EXPECT_EQ(c["model"], "tiny:latest");
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hel");
  EXPECT_EQ(c["done"], false);
  serving::outcome out;
  out.prompt_tokens = 12;
  out.tokens = {1, 2, 3};
  out.first_token_s = 0.25;
  out.total_s = 1.0;
  const json f = ollama_final(chat, out, "", "stop", "t");
  EXPECT_EQ(f["done"], true);
  EXPECT_EQ(f["done_reason"], "stop");
  EXPECT_EQ(f["prompt_eval_count"], 12);
  EXPECT_EQ(f["eval_count"], 3);
  EXPECT_EQ(f["total_duration"], 1'000'000'000);
  EXPECT_EQ(f["prompt_eval_duration"], 250'000'000);
  EXPECT_EQ(f["eval_duration"], 750'000'000);
  auto gen = ok(api_dialect::ollama_generate, R"({"model":"m","prompt":"p"})");
  EXPECT_EQ(ollama_final(gen, out, "all of it", "length", "t")["response"], "all of it");
  api_error e;
  e.message = "nope";
  EXPECT_EQ(ollama_error(e), json({{"error", "nope"}}));
  const json tags = ollama_tags(json::array({{{"id", "tiny"}, {"bytes", 5}, {"content", "ab"}}}));
  EXPECT_EQ(tags["models"][0]["name"], "tiny:latest");
  EXPECT_EQ(tags["models"][0]["size"], 5);
  EXPECT_EQ(tags["models"][0]["digest"], "ab");
  EXPECT_EQ(ollama_model_name("tiny:latest"), "tiny");
  EXPECT_EQ(ollama_model_name("tiny:q8"), "tiny:q8");
  const std::string ts = rfc3339_now();
  EXPECT_EQ(ts.size(), 27u) << ts;
  EXPECT_EQ(ts.back(), 'Z');
}

// Ollama's tools: the request's tools and an assistant's earlier calls (arguments an object, as
// Ollama sends them) go to the template; the answer's calls come back in Ollama's shape.
TEST(Ollama, ChatTakesToolsAndAnswersWithToolCalls) {
  auto res = parse_ollama(api_dialect::ollama_chat, R"({"model":"m","stream":false,
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
      "messages":[{"role":"user","content":"Paris?"},
        {"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather",
          "arguments":{"city":"Paris"}}}]},
        {"role":"tool","content":"21 C","tool_name":"get_weather"}]})",
                          "id", 1);
  ASSERT_TRUE(std::holds_alternative<api_request>(res)) << std::get<api_error>(res).message;
  const auto& r = std::get<api_request>(res);
  EXPECT_TRUE(r.tools);
  EXPECT_NE(r.request.tools.find("get_weather"), std::string::npos);
  ASSERT_EQ(r.request.messages.size(), 3u);
  EXPECT_EQ(
      nlohmann::json::parse(r.request.messages[1].tool_calls)[0]["function"]["arguments"]["city"],
      "Paris");
  EXPECT_EQ(r.request.messages[2].name, "get_weather");
  serving::outcome out;
  out.text =
      "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>";
  const auto j = ollama_final(r, out, out.text, "stop", "now");
  EXPECT_EQ(j["message"]["content"], "");
  EXPECT_EQ(j["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["message"]["tool_calls"][0]["function"]["arguments"]["city"], "Rome");
}

}  // namespace
}  // namespace tessera::mesh::http
