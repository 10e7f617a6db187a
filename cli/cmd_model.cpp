// `tessera model synth` (synthetic llama/qwen3 GGUF with a working tokenizer) and
// `tessera model info` (summary of any GGUF file) and `tessera model tokenize` (token ids of a
// text). Errors go to stderr with a non-zero exit.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "inference/gguf/synth.hpp"
#include "inference/tokenizer/chat.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::cli {

namespace {

struct synth_args {
  std::string arch = "llama";
  std::string preset = "tiny";
  std::optional<std::uint32_t> dim, layers, heads, kv_heads, ffn, vocab, context;
  std::optional<std::uint32_t> experts, experts_used, expert_ffn;
  std::string type = "f16";
  std::uint64_t seed = 1;
  bool tied = false;
  std::string chat_template;  // a Jinja file
  std::string output;
};

int run_synth(const synth_args& a) {
  using namespace tessera::inference::gguf;
  auto cfg = synth_preset(a.preset, a.arch);
  if (!cfg) {
    log::say(fmt::format("tessera model synth: {}", cfg.error().message), true);
    return 1;
  }
  if (a.dim) cfg->dim = *a.dim;
  if (a.layers) cfg->layers = *a.layers;
  if (a.heads) cfg->heads = *a.heads;
  if (a.kv_heads) cfg->kv_heads = *a.kv_heads;
  if (a.ffn) cfg->ffn = *a.ffn;
  if (a.experts) cfg->experts = *a.experts;
  if (a.experts_used) cfg->experts_used = *a.experts_used;
  if (a.expert_ffn) cfg->expert_ffn = *a.expert_ffn;
  if (cfg->experts > 0 && cfg->experts_used == 0) cfg->experts_used = std::min(2u, cfg->experts);
  if (cfg->experts > 0 && cfg->expert_ffn == 0) cfg->expert_ffn = cfg->ffn;
  if (a.vocab) cfg->vocab = *a.vocab;
  if (a.context) cfg->context = *a.context;
  cfg->seed = a.seed;
  cfg->tied_embeddings = a.tied;
  if (!a.chat_template.empty()) {
    std::ifstream in(a.chat_template, std::ios::binary);
    if (!in) {
      log::say(fmt::format("tessera model synth: --chat-template: cannot read {}", a.chat_template),
               true);
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    cfg->chat_template = ss.str();
  }
  auto type = parse_tensor_type(a.type);
  if (!type) {
    log::say(fmt::format("tessera model synth: --type: {}", type.error().message), true);
    return 1;
  }
  cfg->type = *type;
  auto t0 = std::chrono::steady_clock::now();
  auto r = write_synthetic_model(*cfg, a.output);
  if (!r) {
    log::say(fmt::format("tessera model synth: {}", r.error().message), true);
    return 1;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %s %s, %.1fM params, %llu tensors, %s, written in %.2f s\n", a.output.c_str(),
              cfg->arch.c_str(), std::string(to_string(cfg->type)).c_str(),
              static_cast<double>(r->params) / 1e6, static_cast<unsigned long long>(r->tensors),
              human_bytes(r->file_bytes).c_str(), s);
  return 0;
}

int run_info(const std::string& path, bool json) {
  using namespace tessera::inference::gguf;
  auto s = summarize_model(path);
  if (!s) {
    log::say(fmt::format("tessera model info: {}", s.error().message), true);
    return 1;
  }
  std::string out = json ? to_json(*s) + "\n" : to_text(*s);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

struct tokenize_args {
  std::string model;
  std::string text;
  std::string file;
  bool no_special = false;
  bool json = false;
  bool chat = false;
  std::string tools;  // with --chat: the tools array (JSON), as the HTTP API takes it
};

/// Bound on text read from a file: tokenizing is linear, but a typo must not read a disk image.
constexpr std::uintmax_t kMaxTokenizeBytes = 256u << 20;

int run_tokenize(const tokenize_args& a) {
  namespace inf = tessera::inference;
  const auto fail = [](const std::string& why) {
    log::say(fmt::format("tessera model tokenize: {}", why), true);
    return 1;
  };
  if (a.text.empty() == a.file.empty()) return fail("give the text or --file, not both");
  std::string text = a.text;
  if (!a.file.empty()) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(a.file, ec);
    if (ec) return fail(a.file + ": " + ec.message());
    if (size > kMaxTokenizeBytes)
      return fail(fmt::format("{}: {} bytes, more than the {} MiB this command reads", a.file,
                              size, kMaxTokenizeBytes >> 20));
    std::ifstream in(a.file, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto f = inf::gguf::file::open(a.model, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return fail(f.error().message);
  auto tok = inf::tokenizer::tokenizer::from_gguf(*f);
  if (!tok) return fail(tok.error().message);
  std::vector<inf::tokenizer::token_id> ids;
  nlohmann::json chat_json;
  if (a.chat) {
    // The text is a conversation as the HTTP API takes it: [{"role": ..., "content": ...}, ...].
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_array())
      return fail("--chat: the text must be a JSON array of {\"role\", \"content\"} messages");
    std::vector<inf::tokenizer::chat_message> msgs;
    for (const auto& m : j) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()))
        return fail(fmt::format("--chat: message {} needs a string role and content", msgs.size()));
      inf::tokenizer::chat_message c;
      c.role = m["role"].get<std::string>();
      if (m.contains("content") && m["content"].is_string())
        c.content = m["content"].get<std::string>();
      if (m.contains("tool_calls") && m["tool_calls"].is_array())
        c.tool_calls_json = m["tool_calls"].dump();
      if (m.contains("tool_call_id") && m["tool_call_id"].is_string())
        c.tool_call_id = m["tool_call_id"].get<std::string>();
      if (m.contains("name") && m["name"].is_string()) c.name = m["name"].get<std::string>();
      msgs.push_back(std::move(c));
    }
    std::string tools;
    if (!a.tools.empty()) {
      const auto t = nlohmann::ordered_json::parse(a.tools, nullptr, false);
      if (!t.is_array()) return fail("--tools: a JSON array of {\"type\": \"function\", ...}");
      tools = t.dump();
    }
    const auto chat = inf::tokenizer::chat_template_for(*f, *tok);
    auto p = inf::tokenizer::apply_chat_template(chat, msgs, true, tools);
    if (!p) return fail(p.error().message);
    // As the engine encodes a chat prompt: special-token texts matched, BOS as the vocabulary asks.
    ids = tok->encode(p->text, {.add_special = p->add_bos && !a.no_special, .parse_special = true});
    chat_json = {{"template", chat.describe()}, {"prompt", p->text}};
  } else {
    ids = tok->encode(text, {.add_special = !a.no_special, .parse_special = false});
  }
  std::string out;
  if (a.chat && a.json) {
    chat_json["ids"] = ids;
    out = chat_json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  } else {
    out.reserve(ids.size() * 6 + 2);
    out += a.json ? "[" : "";
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += a.json ? "," : " ";
      out += std::to_string(ids[i]);
    }
    out += a.json ? "]\n" : "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

void register_model(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("model", "synthesise a model or inspect a GGUF file");
  cmd->require_subcommand(1);

  auto args = std::make_shared<synth_args>();
  auto* synth = cmd->add_subcommand(
      "synth", "write a synthetic llama/qwen3/qwen3moe model with random weights");
  synth->add_option("--arch", args->arch, "llama, qwen3 or qwen3moe (mixture of experts)")
      ->check(CLI::IsMember({"llama", "qwen3", "qwen3moe"}));
  synth
      ->add_option("--preset", args->preset,
                   "tiny (56M params), large (336M) or moe (1.3B, 48 experts, 4 used per token)")
      ->check(CLI::IsMember({"tiny", "large", "moe"}));
  synth->add_option("--dim", args->dim, "embedding width");
  synth->add_option("--layers", args->layers, "transformer blocks");
  synth->add_option("--heads", args->heads, "attention heads");
  synth->add_option("--kv-heads", args->kv_heads, "key/value heads (GQA)");
  synth->add_option("--ffn", args->ffn, "feed-forward width");
  synth->add_option("--experts", args->experts,
                    "experts per layer (a mixture of experts; llama then has Mixtral's layout)");
  synth->add_option("--experts-used", args->experts_used, "experts per token (default 2)");
  synth->add_option("--expert-ffn", args->expert_ffn, "one expert's FFN width (default --ffn)");
  synth->add_option("--vocab", args->vocab, "vocabulary size");
  synth->add_option("--context", args->context, "context length written to the metadata");
  synth->add_option("--type", args->type, "f32|f16|bf16|q8_0|q4_0|q4_k|q6_k (default f16)");
  synth->add_option("--seed", args->seed, "weight seed (same seed, same bytes)");
  synth->add_flag("--tied", args->tied, "no output.weight: the embedding is reused");
  synth->add_option("--chat-template", args->chat_template,
                    "a Jinja chat template file to write as tokenizer.chat_template (default: "
                    "ChatML for qwen3, Mistral's for llama)");
  synth->add_option("-o,--output", args->output, "output GGUF file")->required();
  synth->callback([&exit_code, args] { exit_code = run_synth(*args); });

  auto info_path = std::make_shared<std::string>();
  auto info_json = std::make_shared<bool>(false);
  auto* info = cmd->add_subcommand("info", "summarise a GGUF file");
  info->add_option("file", *info_path, "GGUF file")->required();
  info->add_flag("--json", *info_json, "machine-readable output");
  info->callback([&exit_code, info_path, info_json] { exit_code = run_info(*info_path, *info_json); });

  auto tk = std::make_shared<tokenize_args>();
  auto* tokenize = cmd->add_subcommand("tokenize", "print the token ids a model's tokenizer makes of a text");
  tokenize->add_option("file", tk->model, "GGUF file")->required();
  tokenize->add_option("text", tk->text, "the text (or --file)");
  tokenize->add_option("-f,--file", tk->file, "read the text from this file (at most 256 MiB)");
  tokenize->add_flag("--no-special", tk->no_special, "no BOS/EOS around the text");
  tokenize->add_flag("--json", tk->json,
                     "a JSON array instead of space-separated ids (with --chat: an object with "
                     "the template used, the rendered prompt and the ids)");
  tokenize->add_flag("--chat", tk->chat,
                     "the text is a conversation, a JSON array of {\"role\", \"content\"} "
                     "messages: render it with the model's chat template (its own Jinja "
                     "template, else a built-in family), as the HTTP API does, then tokenize");
  tokenize->add_option("--tools", tk->tools,
                       "with --chat: the tools the model may call, a JSON array as the HTTP API "
                       "takes it");
  tokenize->callback([&exit_code, tk] { exit_code = run_tokenize(*tk); });
}

}  // namespace tessera::cli
