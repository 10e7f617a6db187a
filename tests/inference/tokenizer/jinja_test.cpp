// The Jinja subset of chat templates (inference/tokenizer/jinja.hpp): each expectation is what
// Jinja2 renders with Hugging Face's settings (trim_blocks, lstrip_blocks, loop controls).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "inference/tokenizer/chat.hpp"
#include "inference/tokenizer/jinja.hpp"

namespace tessera::inference::tokenizer::jinja {
namespace {

std::string render(std::string_view src, const object& globals = {}) {
  auto t = template_program::parse(src);
  if (!t) return "parse error: " + t.error().message;
  auto r = t->render(globals);
  if (!r) return "render error: " + r.error().message;
  return *r;
}

object messages_context() {
  return {{"messages", from_json(nlohmann::json::parse(
                           R"([{"role":"system","content":" Be brief. "},
                               {"role":"user","content":"Hi"},
                               {"role":"assistant","content":"Hello"},
                               {"role":"user","content":"Bye"}])"))},
          {"add_generation_prompt", value(true)},
          {"bos_token", value("<s>")}};
}

TEST(Jinja, TextOutputAndWhitespaceControl) {
  EXPECT_EQ(render("a {{ 1 + 2 }} b"), "a 3 b");
  EXPECT_EQ(render("a  {{- 'x' -}}  b"), "axb");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indent before it too.
  EXPECT_EQ(render("x\n  {% if true %}\ny\n  {% endif %}\nz"), "x\ny\nz");
  EXPECT_EQ(render("{# note #}\nk"), "k");
  EXPECT_EQ(render("line\n"), "line") << "one trailing newline is dropped";
  EXPECT_EQ(render("a {% if true %}b{% endif %} c"), "a b c") << "no lstrip mid-line";
}

TEST(Jinja, ValuesPrintAsPython) {
  EXPECT_EQ(render("{{ none }} {{ true }} {{ 1.0 }} {{ 2.5 }} {{ [1, 'a'] }} {{ {'k': none} }}"),
            "None True 1.0 2.5 [1, 'a'] {'k': None}");
  EXPECT_EQ(render("{{ undefined_thing }}|{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }}"),
            "|3 -4 2 3.5");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}"), "a1None");
}

TEST(Jinja, LoopsAndNamespaces) {
  const auto ctx = messages_context();
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index0 }}{{ m.role[0] }}{% if not loop.last "
                   "%},{% endif %}{% endfor %}",
                   ctx),
            "0s,1u,2a,3u");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for m in messages if m.role == 'user' %}{% set "
                   "ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
                   ctx),
            "2");
  EXPECT_EQ(
      render("{% set n = 0 %}{% for m in messages %}{% set n = n + 1 %}{% endfor %}{{ n }}", ctx),
      "0")
      << "a set inside a loop does not leak out of it";
  EXPECT_EQ(render("{% for m in messages[::-1] %}{{ m.content|trim }}{% if loop.first %}!{% break "
                   "%}{% endif %}{% endfor %}",
                   ctx),
            "Bye!");
  EXPECT_EQ(
      render(
          "{% for i in range(5) %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}"),
      "024");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
}

TEST(Jinja, FiltersTestsAndMethods) {
  const auto ctx = messages_context();
  EXPECT_EQ(
      render(
          "{{ messages|length }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
          ctx),
      "4 2");
  EXPECT_EQ(render("{{ messages|map(attribute='role')|join(',') }}", ctx),
            "system,user,assistant,user");
  EXPECT_EQ(render("{{ ['a','b','c']|reject('equalto', 'b')|join(', ') }}"), "a, c");
  EXPECT_EQ(render("{{ {'b': [1, 2.5], 'a': 'x\"y'}|tojson }}"), R"({"b": [1, 2.5], "a": "x\"y"})");
  EXPECT_EQ(render("{{ {'a': [1]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ 'é'|tojson }}"), "\"é\"") << "ensure_ascii off";
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'x</think>y'.split('</think>')[-1] }}|{{ "
                   "'\\n\\nz'.lstrip('\\n') }}"),
            "a b|y|z");
  EXPECT_EQ(
      render("{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('bc') }} {{ 'ab' in 'cab' }}"),
      "True True True");
  EXPECT_EQ(render("{{ x is defined }} {{ x is not defined }} {{ none is none }} {{ 'a' is string "
                   "}} {{ 3 is divisibleby 3 }}"),
            "False True True True True");
  EXPECT_EQ(render("{{ x|default('d') }} {{ ''|default('d', true) }} {{ 'hello world'|title }}"),
            "d d Hello World");
  EXPECT_EQ(render("{{ 'a' if false }}|{{ 'a' if false else 'b' }}"), "|b");
  EXPECT_EQ(render("{% set l = [] %}{% set _ = l.append(3) %}{{ l }}"), "[3]");
  EXPECT_EQ(render("{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}{{ greet('Ann') "
                   "}}/{{ greet('Bo', p='Yo') }}"),
            "Hi Ann/Yo Bo");
  EXPECT_EQ(render("{% set block %}in{{ 1 }}{% endset %}[{{ block }}]"), "[in1]");
}

TEST(Jinja, ErrorsNameTheProblem) {
  EXPECT_EQ(render("{{ raise_exception('roles must alternate') }}"),
            "render error: roles must alternate");
  EXPECT_NE(render("a\n{% include 'x' %}").find("line 2: unknown or unsupported tag 'include'"),
            std::string::npos);
  EXPECT_NE(render("{% if x %}").find("'endif' expected"), std::string::npos);
  EXPECT_NE(render("{{ 1 + }}").find("unexpected"), std::string::npos);
  EXPECT_NE(render("{{ 'a").find("never closed"), std::string::npos);
  EXPECT_NE(render("{{ x|nosuchfilter }}").find("unknown filter 'nosuchfilter'"),
            std::string::npos);
  EXPECT_NE(render("{% for i in range(2000000) %}{% endfor %}").find("more than"),
            std::string::npos);
  EXPECT_NE(render("{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}")
                .find("too deeply"),
            std::string::npos);
  // What a hostile model file could try: recursion, self-holding lists, doubling strings.
  EXPECT_NE(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("more than 64 deep"),
            std::string::npos);
  EXPECT_EQ(render("{% set l = [] %}{% set _ = l.append(l) %}"),
            "render error: append(): a list cannot hold itself");
  EXPECT_EQ(render("{% set ns = namespace(a=[]) %}{% set ns.b = [ns] %}"),
            "render error: chat template line 1: 'ns.b' would hold 'ns' itself");
  EXPECT_EQ(render("{% set l = [1] %}{% set m = [l, l] %}{{ m }} {{ m[0] == m[1] }}"),
            "[[1], [1]] True")
      << "sharing without a cycle is fine";
  EXPECT_NE(render("{{ 9223372036854775807 + 1 }}").find("integer overflow in '+'"),
            std::string::npos);
  EXPECT_NE(render("{{ 2 ** 70 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 5)|list }} "
                   "{{ 6 is divisibleby(-1) }}"),
            "[9223372036854775806] True");
  EXPECT_NE(render("{{ [1]|tojson(indent=100000000) }}").find("indent must be"), std::string::npos);
  EXPECT_NE(render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ "
                   "ns.s %}{% endfor %}")
                .find("a string of more than"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::inference::tokenizer::jinja

namespace tessera::inference::tokenizer::jinja {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The published templates of Llama 3 / 3.1 / 3.2, Qwen 2.5 / 3, Mistral v0.3 and Gemma 2 against
// what Jinja2 renders for each conversation of conversations.json (make_expected.py wrote the
// .expected.json files with Hugging Face's settings): the same text byte for byte, or the same
// raise_exception message.
TEST(Jinja, PublishedTemplatesRenderAsJinja2Does) {
  const std::filesystem::path dir = TESSERA_CHAT_TEMPLATES;
  const auto conversations = nlohmann::ordered_json::parse(read_file(dir / "conversations.json"));
  int templates = 0, checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    ++templates;
    auto program = template_program::parse(read_file(entry.path()));
    ASSERT_TRUE(program.has_value()) << entry.path().filename() << ": " << program.error().message;
    auto expected_path = entry.path();
    expected_path.replace_extension(".expected.json");
    const auto expected = nlohmann::json::parse(read_file(expected_path));
    for (const auto& [name, conv] : conversations.items()) {
      object globals{{"bos_token", value("<s>")},
                     {"eos_token", value("</s>")},
                     {"strftime_now", value(function([](const call_args&) -> result<value> {
                        return value("29 Nov 2026");
                      }))}};
      for (const auto& [k, v] : conv.items())
        globals.emplace_back(k, from_json(v));
      auto r = program->render(globals);
      const auto& want = expected.at(name);
      const std::string where = entry.path().filename().string() + " / " + name;
      if (want.contains("error")) {
        ASSERT_FALSE(r.has_value()) << where << ": rendered, Jinja2 raised " << want["error"];
        EXPECT_EQ(r.error().message, want["error"].get<std::string>()) << where;
      } else {
        ASSERT_TRUE(r.has_value()) << where << ": " << r.error().message;
        EXPECT_EQ(*r, want["text"].get<std::string>()) << where;
      }
      ++checked;
    }
  }
  EXPECT_GE(templates, 7);
  EXPECT_EQ(checked, templates * static_cast<int>(conversations.size()));
}

}  // namespace
}  // namespace tessera::inference::tokenizer::jinja

namespace tessera::inference::tokenizer {
namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The API's path for tools: messages as the HTTP API carries them (a call's arguments as JSON
// text, the tools as JSON text) through apply_chat_template give the text Jinja2 renders for the
// same conversation (the expected files), the leading BOS text left to the tokenizer.
TEST(ChatTemplate, ToolsToolCallsAndResultsRenderAsJinja2Does) {
  const std::filesystem::path dir = TESSERA_CHAT_TEMPLATES;
  const auto conv = nlohmann::ordered_json::parse(read_text(dir / "conversations.json"))["tools"];
  std::vector<chat_message> msgs;
  for (const auto& m : conv["messages"]) {
    chat_message c{m["role"].get<std::string>(), m.value("content", std::string())};
    if (m.contains("tool_calls")) {
      auto calls = m["tool_calls"];
      for (auto& call : calls)  // as OpenAI clients send them: arguments as JSON text
        call["function"]["arguments"] = call["function"]["arguments"].dump();
      c.tool_calls_json = calls.dump();
    }
    if (m.contains("tool_call_id")) c.tool_call_id = m["tool_call_id"].get<std::string>();
    if (m.contains("name")) c.name = m["name"].get<std::string>();
    msgs.push_back(std::move(c));
  }
  for (const char* name : {"qwen2.5-7b-instruct", "qwen3-8b", "llama-3.1-8b-instruct"}) {
    auto program = jinja::template_program::parse(read_text(dir / (std::string(name) + ".jinja")));
    ASSERT_TRUE(program.has_value()) << name;
    chat_template t;
    t.jinja = std::make_shared<const jinja::template_program>(std::move(*program));
    t.bos_token = "<s>";
    t.eos_token = "</s>";
    auto p = apply_chat_template(t, msgs, true, conv["tools"].dump());
    ASSERT_TRUE(p.has_value()) << name << ": " << p.error().message;
    std::string want = nlohmann::json::parse(
        read_text(dir / (std::string(name) + ".expected.json")))["tools"]["text"];
    if (want.starts_with("<s>")) want.erase(0, 3);
    EXPECT_EQ(p->text, want) << name;
  }
  // A built-in family cannot render tools: an error that says why.
  chat_template family;
  family.family = chat_family::chatml;
  auto e = apply_chat_template(family, msgs, true, conv["tools"].dump());
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("tools need the model's own chat template"), std::string::npos);
}

}  // namespace
}  // namespace tessera::inference::tokenizer
