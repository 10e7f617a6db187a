// The OpenAI-compatible API's translation rules: bodies to serving requests (defaults, every
// refusal names its field), outcomes to replies and stream chunks, UTF-8 cut points.
#include "mesh/http/openai.hpp"
#include "mesh/serving/follower.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh::http {
namespace {

using json = nlohmann::json;

api_request ok(api_kind kind, const std::string& body) {
  auto r = parse_request(kind, body, "cmpl-1", 42);
  if (auto* e = std::get_if<api_error>(&r)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<api_request>(r);
}

api_error refused(api_kind kind, const std::string& body) {
  auto r = parse_request(kind, body, "cmpl-1", 42);
  if (auto* e = std::get_if<api_error>(&r)) return *e;
  ADD_FAILURE() << body << " was accepted";
  return {};
}

TEST(OpenAI, CompletionTakesOpenAIsDefaultsAndTheGivenSeed) {
  auto r = ok(api_kind::completion, R"({"model":"tiny","prompt":"Once"})");
  EXPECT_EQ(r.request.id, "cmpl-1");
  EXPECT_EQ(r.request.model, "tiny");
  EXPECT_EQ(r.request.prompt, "Once");
  EXPECT_TRUE(r.request.messages.empty());
  EXPECT_EQ(r.request.max_tokens, default_completion_tokens);
  EXPECT_EQ(r.request.temperature, 1.0f);
  EXPECT_EQ(r.request.top_p, 1.0f);
  EXPECT_EQ(r.request.top_k, 0);
  EXPECT_EQ(r.request.min_p, 0.0f);
  EXPECT_EQ(r.request.seed, 42u);
  EXPECT_FALSE(r.stream);
}

TEST(OpenAI, CompletionFieldsMapOntoTheRequest) {
  auto r = ok(api_kind::completion,
              R"({"model":"m","prompt":["p"],"max_tokens":7,"temperature":0,"top_p":0.5,
                  "top_k":3,"min_p":0.1,"repeat_penalty":1.1,"seed":9,"stream":true,
                  "stream_options":{"include_usage":true},"n":1,"stop":null,"user":"u",
                  "frequency_penalty":0.25,"presence_penalty":-0.5})");
  EXPECT_EQ(r.request.prompt, "p");
  EXPECT_EQ(r.request.max_tokens, 7u);
  EXPECT_EQ(r.request.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.request.top_p, 0.5f);
  EXPECT_EQ(r.request.top_k, 3);
  EXPECT_FLOAT_EQ(r.request.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.request.repeat_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.request.frequency_penalty, 0.25f);
  EXPECT_FLOAT_EQ(r.request.presence_penalty, -0.5f);
  EXPECT_EQ(r.request.seed, 9u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAI, ChatTakesStringAndTextPartContentAndDeveloperRole) {
  auto r = ok(api_kind::chat, R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hel"},{"type":"text","text":"lo"}]},
      {"role":"assistant","content":null},
      {"role":"user","content":"again"}],"max_completion_tokens":5})");
  ASSERT_EQ(r.request.messages.size(), 4u);
  EXPECT_EQ(r.request.messages[0].role, "system");
  EXPECT_EQ(r.request.messages[1].content, "hello");
  EXPECT_EQ(r.request.messages[2].content, "");
  EXPECT_EQ(r.request.max_tokens, 5u);
  EXPECT_TRUE(r.request.prompt.empty());
  EXPECT_EQ(ok(api_kind::chat, R"({"model":"m","messages":[{"role":"user","content":"x"}]})")
                .request.max_tokens,
            default_chat_tokens);
}

TEST(OpenAI, EveryRefusalNamesItsField) {
  struct row {
    api_kind kind;
    const char* body;
    const char* param;
  };
  const row rows[] = {
      {api_kind::completion, R"({"prompt":"x"})", "model"},
      {api_kind::completion, R"({"model":"","prompt":"x"})", "model"},
      {api_kind::completion, R"({"model":"m"})", "prompt"},
      {api_kind::completion, R"({"model":"m","prompt":""})", "prompt"},
      {api_kind::completion, R"({"model":"m","prompt":[1,2,3]})", "prompt"},
      {api_kind::completion, R"({"model":"m","prompt":["a","b"]})", "prompt"},
      {api_kind::completion, R"({"model":"m","prompt":"x","max_tokens":0})", "max_tokens"},
      {api_kind::completion, R"({"model":"m","prompt":"x","max_tokens":100000})", "max_tokens"},
      {api_kind::completion, R"({"model":"m","prompt":"x","max_tokens":1.5})", "max_tokens"},
      {api_kind::completion, R"({"model":"m","prompt":"x","temperature":3})", "temperature"},
      {api_kind::completion, R"({"model":"m","prompt":"x","temperature":"hot"})", "temperature"},
      {api_kind::completion, R"({"model":"m","prompt":"x","top_p":-1})", "top_p"},
      {api_kind::completion, R"({"model":"m","prompt":"x","n":9})", "n"},
      {api_kind::completion, R"({"model":"m","prompt":"x","n":0})", "n"},
      {api_kind::chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":2,
           "tools":[{"type":"function","function":{"name":"f"}}]})",
       "n"},
      {api_kind::completion, R"({"model":"m","prompt":"x","best_of":3})", "best_of"},
      {api_kind::completion, R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})", "stop"},
      {api_kind::completion, R"({"model":"m","prompt":"x","stop":[1]})", "stop"},
      {api_kind::completion, R"({"model":"m","prompt":"x","stop":{"a":1}})", "stop"},
      {api_kind::completion, R"({"model":"m","prompt":"x","logprobs":9})", "logprobs"},
      {api_kind::completion, R"({"model":"m","prompt":"x","echo":true})", "echo"},
      {api_kind::completion, R"({"model":"m","prompt":"x","presence_penalty":2.5})",
       "presence_penalty"},
      {api_kind::completion, R"({"model":"m","prompt":"x","frequency_penalty":"x"})",
       "frequency_penalty"},
      {api_kind::completion, R"({"model":"m","prompt":"x","stream":"yes"})", "stream"},
      {api_kind::chat, R"({"model":"m"})", "messages"},
      {api_kind::chat, R"({"model":"m","messages":[]})", "messages"},
      {api_kind::chat, R"({"model":"m","messages":["hi"]})", "messages[0]"},
      {api_kind::chat, R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role"},
      {api_kind::chat, R"({"model":"m","messages":[{"role":"robot","content":"x"}]})",
       "messages[0].role"},
      {api_kind::chat,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0]"},
      {api_kind::chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]})",
       "tools[0]"},
      {api_kind::chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"})",
       "tool_choice"},
      {api_kind::completion,
       R"({"model":"m","prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})",
       "tools"},
      {api_kind::chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],
           "response_format":{"type":"json_schema","json_schema":{}}})",
       "response_format"},
      {api_kind::chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],
           "response_format":{"type":"json_schema","json_schema":{"name":"s",
             "schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}}}}})",
       "response_format"},
      {api_kind::completion, R"({"model":"m","prompt":"x","response_format":{"type":"text"}})",
       "response_format"},
  };
  for (const auto& r : rows) {
    const auto e = refused(r.kind, r.body);
    EXPECT_EQ(e.status, 400) << r.body;
    EXPECT_EQ(e.param, r.param) << r.body << " -> " << e.message;
    EXPECT_NE(e.message.find(r.param), std::string::npos) << r.body << " -> " << e.message;
  }
}

// response_format json_object becomes the request's format (constrained decoding on the peer);
// text is the default.
TEST(OpenAI, ResponseFormatJsonObjectAsksForAJsonAnswer) {
  auto parsed = parse_request(api_kind::chat,
                              R"({"model":"m","messages":[{"role":"user","content":"x"}],
                                  "response_format":{"type":"json_object"}})",
                              "id", 1);
  ASSERT_TRUE(std::holds_alternative<api_request>(parsed));
  EXPECT_EQ(std::get<api_request>(parsed).request.format, "json_object");
  parsed = parse_request(api_kind::chat,
                         R"({"model":"m","messages":[{"role":"user","content":"x"}],
                             "response_format":{"type":"text"}})",
                         "id", 1);
  ASSERT_TRUE(std::holds_alternative<api_request>(parsed));
  EXPECT_EQ(std::get<api_request>(parsed).request.format, "");
}

// n > 1: each choice is a stream of its own — its own id and seed, the API request's id as the
// reply's and as the affinity that routes every choice to one peer.
TEST(OpenAI, ChoicesAreStreamsOfTheirOwnRoutedTogether) {
  auto parsed = parse_request(api_kind::completion, R"({"model":"m","prompt":"x","n":3,"seed":7})",
                              "cmpl-abc", 1);
  ASSERT_TRUE(std::holds_alternative<api_request>(parsed));
  const auto& r = std::get<api_request>(parsed);
  EXPECT_EQ(r.n, 3u);
  const auto c = choice_request(r, 2);
  EXPECT_EQ(c.n, 1u);
  EXPECT_EQ(c.index, 2u);
  EXPECT_EQ(c.request.id, "cmpl-abc.2");
  EXPECT_EQ(c.request.affinity, "cmpl-abc");
  EXPECT_EQ(c.request.seed, 9u);
  EXPECT_TRUE(serving::validate(c.request)) << c.request.id;
  serving::outcome out;
  out.text = "hi";
  const auto j = reply(c, out, 0);
  EXPECT_EQ(j["id"], "cmpl-abc");
  EXPECT_EQ(j["choices"][0]["index"], 2);
  EXPECT_EQ(chunk(c, "h", false, "", 0)["choices"][0]["index"], 2);
}

// response_format json_schema carries the schema to the peer; one the grammar cannot follow is a
// 400 that quotes the compiler (the keyword and where it is).
TEST(OpenAI, ResponseFormatJsonSchemaCarriesTheSchemaOrNamesWhatIsRefused) {
  auto parsed = parse_request(api_kind::chat,
                              R"({"model":"m","messages":[{"role":"user","content":"x"}],
                                  "response_format":{"type":"json_schema","json_schema":{
                                    "name":"p","strict":true,"schema":{"type":"object",
                                    "properties":{"n":{"type":"integer"}},"required":["n"]}}}})",
                              "id", 1);
  ASSERT_TRUE(std::holds_alternative<api_request>(parsed));
  const auto& r = std::get<api_request>(parsed).request;
  EXPECT_EQ(r.format, "json_schema");
  EXPECT_EQ(nlohmann::json::parse(r.schema)["required"][0], "n") << r.schema;
  const auto e = refused(api_kind::chat,
                         R"({"model":"m","messages":[{"role":"user","content":"x"}],
                             "response_format":{"type":"json_schema","json_schema":{
                               "schema":{"properties":{"a":{"allOf":[]}}}}}})");
  EXPECT_EQ(e.param, "response_format");
  EXPECT_NE(e.message.find("#/properties/a/allOf: 'allOf' is not supported"), std::string::npos)
      << e.message;
}

// `stop`: a string or up to four; empty ones stop nothing. The text ends before the first to
// appear, and a stream holds back only the bytes that may begin one.
TEST(OpenAI, StopSequencesAreParsedFoundAndHeldBack) {
  auto parsed = parse_request(api_kind::completion,
                              R"({"model":"m","prompt":"x","stop":["\n\n","END",""]})", "id", 1);
  ASSERT_TRUE(std::holds_alternative<api_request>(parsed));
  EXPECT_EQ(std::get<api_request>(parsed).stop, (std::vector<std::string>{"\n\n", "END"}));
  parsed = parse_request(api_kind::chat,
                         R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":"###"})",
                         "id", 1);
  ASSERT_TRUE(std::holds_alternative<api_request>(parsed));
  EXPECT_EQ(std::get<api_request>(parsed).stop, (std::vector<std::string>{"###"}));
  const std::vector<std::string> stops{"END", "\n\n"};
  EXPECT_EQ(find_stop("once upon a time END of it", stops), 17u);
  EXPECT_EQ(find_stop("a\n\nb END", stops), 1u);  // the first to appear, whichever it is
  EXPECT_EQ(find_stop("no stop here", stops), std::string_view::npos);
  EXPECT_EQ(stop_holdback("the EN", stops), 2u);  // "EN" may become "END"
  EXPECT_EQ(stop_holdback("the E", stops), 1u);
  EXPECT_EQ(stop_holdback("line\n", stops), 1u);
  EXPECT_EQ(stop_holdback("the ENx", stops), 0u);
  EXPECT_EQ(stop_holdback("", stops), 0u);
  EXPECT_EQ(finish_reason("stop_sequence"), "stop");
}

// logprobs: chat's boolean with top_logprobs (0..20), completions' legacy count (0..5); the
// objects in OpenAI's two shapes.
TEST(OpenAI, LogprobsAreParsedAndShaped) {
  const auto chat = ok(api_kind::chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],
                                          "logprobs":true,"top_logprobs":3})");
  EXPECT_EQ(chat.request.top_logprobs, 3);
  EXPECT_EQ(ok(api_kind::chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],
                                   "logprobs":true})")
                .request.top_logprobs,
            0);
  EXPECT_EQ(ok(api_kind::chat, R"({"model":"m","messages":[{"role":"user","content":"x"}]})")
                .request.top_logprobs,
            -1);
  const auto cmpl = ok(api_kind::completion, R"({"model":"m","prompt":"x","logprobs":2})");
  EXPECT_EQ(cmpl.request.top_logprobs, 2);
  for (const auto& [kind, body, param] :
       {std::tuple{api_kind::chat,
                   R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
                   "top_logprobs"},
        std::tuple{api_kind::chat,
                   R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,
                       "top_logprobs":21})",
                   "top_logprobs"},
        std::tuple{api_kind::completion, R"({"model":"m","prompt":"x","logprobs":6})", "logprobs"},
        std::tuple{api_kind::completion, R"({"model":"m","prompt":"x","top_logprobs":1})",
                   "top_logprobs"}}) {
    const auto e = refused(kind, body);
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
  }
  const std::vector<serving::token_logprob> lps = {
      {"He", -0.5f, {{7, "He", -0.5f}, {9, "A", -1.5f}}}, {"llo", -0.25f, {{3, "llo", -0.25f}}}};
  const json c = logprobs_json(chat, lps);
  ASSERT_EQ(c["content"].size(), 2u);
  EXPECT_EQ(c["content"][0]["token"], "He");
  EXPECT_EQ(c["content"][0]["bytes"], json({72, 101}));
  EXPECT_EQ(c["content"][0]["top_logprobs"][1]["token"], "A");
  EXPECT_FLOAT_EQ(c["content"][1]["logprob"].get<float>(), -0.25f);
  const json l = logprobs_json(cmpl, lps, 4);
  EXPECT_EQ(l["tokens"], json({"He", "llo"}));
  EXPECT_EQ(l["text_offset"], json({4, 6}));
  EXPECT_FLOAT_EQ(l["top_logprobs"][0]["A"].get<float>(), -1.5f);
  // A reply cut at a stop sequence keeps the logprobs of the tokens that begin inside the text.
  serving::outcome out;
  out.text = "He";
  out.tokens = {7, 3};
  out.logprobs = lps;
  out.stop = "stop_sequence";
  const json rj = reply(chat, out, 1);
  EXPECT_EQ(rj["choices"][0]["logprobs"]["content"].size(), 1u);
}

TEST(OpenAI, GarbageBodiesAreRefusedNotThrown) {
  for (const char* body : {"", "{", "[1,2]", "null", "\"x\"", "{\"model\":", "\xff\xfe"}) {
    const auto e = refused(api_kind::completion, body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(OpenAI, ServingErrorsMapToStatusesAndCodes) {
  EXPECT_EQ(error_of(error{errc::not_found, "x"}).status, 404);
  EXPECT_EQ(error_of(error{errc::not_found, "x"}).code, "model_not_found");
  EXPECT_EQ(error_of(error{errc::invalid_argument, "x"}).status, 400);
  EXPECT_EQ(error_of(error{errc::no_capacity, "x"}).status, 503);
  EXPECT_EQ(error_of(error{errc::overloaded, "x"}).status, 429);
  EXPECT_EQ(error_of(error{errc::timeout, "x"}).status, 504);
  EXPECT_EQ(error_of(error{errc::closed, "x"}).status, 503);
  EXPECT_EQ(error_of(error{errc::closed, "x"}).code, "unavailable");
  EXPECT_EQ(error_of(error{errc::unauthorized, "x"}).type, "authentication_error");
  EXPECT_EQ(error_of(error{errc::unauthorized, "x"}).code, "invalid_api_key");
  EXPECT_EQ(error_of(error{errc::unauthorized, "x"}).status, 401);
  EXPECT_EQ(error_of(error{errc::internal, "x"}).status, 500);
  // A peer's error, as the serving client words it: the API answer carries its code and its
  // message without the peer's id; a prompt too long names the field of the request's kind.
  const error too_long{errc::invalid_argument,
                       serving::format_peer_error("the prompt has 5000 tokens (+0 resumed); model "
                                                  "'tiny' holds 2048 here",
                                                  "context_length_exceeded", "0123abcd")};
  for (auto [kind, param] :
       {std::pair{api_kind::chat, "messages"}, std::pair{api_kind::completion, "prompt"}}) {
    const api_error e = error_of(too_long, kind);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_EQ(e.param, param);
    EXPECT_EQ(e.message, "the prompt has 5000 tokens (+0 resumed); model 'tiny' holds 2048 here");
  }
  const api_error other = error_of(
      error{errc::invalid_argument,
            serving::format_peer_error("field 'top_k' (x) is bad", "invalid_request", "0123abcd")});
  EXPECT_EQ(other.status, 400);
  EXPECT_EQ(other.message, "field 'top_k' (x) is bad");
  const auto parsed = serving::parse_peer_error(
      serving::format_peer_error("a (b, from peer c) d", "overloaded", "00ff"));
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->message, "a (b, from peer c) d");
  EXPECT_EQ(parsed->code, "overloaded");
  EXPECT_EQ(parsed->node, "00ff");
  EXPECT_FALSE(serving::parse_peer_error("no peer here"));
  const json j = error_of(error{errc::not_found, "model 'q' is not served"}).to_json();
  EXPECT_EQ(j["error"]["message"], "model 'q' is not served");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "model");
}

TEST(OpenAI, RepliesAndChunksHaveOpenAIsShape) {
  auto chat = ok(api_kind::chat, R"({"model":"m","messages":[{"role":"user","content":"x"}]})");
  serving::outcome out;
  out.text = "hello";
  out.tokens = {1, 2};
  out.prompt_tokens = 3;
  out.stop = "max_tokens";
  out.nodes = {"aa"};
  json j = reply(chat, out, 100);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  out.stop = "end_of_generation";
  auto cmpl = ok(api_kind::completion, R"({"model":"m","prompt":"x"})");
  j = reply(cmpl, out, 100);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  json first = chunk(chat, "", true, "", 1);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  json mid = chunk(chat, "lo", false, "", 1);
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "lo");
  EXPECT_TRUE(mid["choices"][0]["finish_reason"].is_null());
  json last = chunk(chat, "", false, "stop", 1);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(sse(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_TRUE(usage_chunk(chat, 3, 2, 1)["choices"].empty());
}

TEST(OpenAI, Utf8CutPointsNeverSplitACharacter) {
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  const std::string e_acute = "\xc3\xa9";        // é
  const std::string euro = "\xe2\x82\xac";       // €
  const std::string emoji = "\xf0\x9f\x98\x80";  // 😀
  for (const auto& ch : {e_acute, euro, emoji}) {
    const std::string s = "ab" + ch;
    EXPECT_EQ(utf8_complete_prefix(s), s.size());
    for (std::size_t cut = 1; cut < ch.size(); ++cut)
      EXPECT_EQ(utf8_complete_prefix(s.substr(0, 2 + cut)), 2u) << ch.size() << "/" << cut;
  }
  // Stray continuation bytes are not held back for ever: the JSON dump replaces them.
  EXPECT_EQ(utf8_complete_prefix("a\x80\x80\x80\x80"), 5u);
  EXPECT_NE(dump(json("a\xff")).find("\xef\xbf\xbd"), std::string::npos);  // U+FFFD
}

}  // namespace
}  // namespace tessera::mesh::http
