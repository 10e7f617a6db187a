// libFuzzer entry for the chat templates' Jinja subset: a template is data from a model file, so
// any bytes must parse to a program or an error, and any program must render to text or an error
// within its bounds — never a crash, a hang or unbounded memory. The seed corpus is the published
// templates (chat_templates/*.jinja).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "inference/tokenizer/jinja.hpp"

using namespace tessera::inference::tokenizer::jinja;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  auto program = template_program::parse(src);
  if (!program) return 0;
  static const object globals = [] {
    object g;
    g.emplace_back("messages",
                   from_json(nlohmann::json::parse(
                       R"([{"role":"system","content":"S"},{"role":"user","content":"U"},
                                       {"role":"assistant","content":"A","tool_calls":[{"function":
                                       {"name":"f","arguments":{"x":1}}}]},{"role":"user","content":"V"}])")));
    g.emplace_back("add_generation_prompt", value(true));
    g.emplace_back("bos_token", value("<s>"));
    g.emplace_back("eos_token", value("</s>"));
    return g;
  }();
  (void)program->render(globals);
  return 0;
}
