// `tessera run MODEL.gguf -p "..."`: load a GGUF model, stream the generated text to stdout, print
// a timing summary to stderr. Errors (bad file, bad flags, context overflow) go to stderr with a
// non-zero exit.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "cli/progress.hpp"
#include "inference/gguf/gguf.hpp"
#include "inference/kernels/cpu.hpp"
#include "inference/model/generator.hpp"
#include "inference/model/model.hpp"
#include "inference/tokenizer/chat.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::cli {

namespace {

struct run_args {
  std::string model;
  std::string prompt;
  std::int64_t n_predict = 128;
  float temp = 0.8f;
  std::int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  std::int32_t repeat_window = 64;
  std::uint64_t seed = 0;
  int threads = 1;
  std::int64_t ctx = 0;
  bool chat = false;
  bool json = false;
  std::string load = "anonymous";
  std::string kv_cache = "f16";
};

int run(const run_args& a) {
  namespace inf = tessera::inference;
  namespace mdl = tessera::inference::model;
  using clock = std::chrono::steady_clock;
  if (a.n_predict < 0 || a.n_predict > (1 << 20)) return fail("run", "-n must be in [0, 1048576]");
  mdl::sampler_options so;
  so.temperature = a.temp;
  so.top_k = a.top_k;
  so.top_p = a.top_p;
  so.min_p = a.min_p;
  so.repeat_penalty = a.repeat_penalty;
  so.repeat_window = a.repeat_window;
  so.seed = a.seed;
  if (auto v = mdl::validate(so); !v) return fail("run", v.error().message);

  auto t_load = clock::now();
  // The model copies the tensors it needs into its own (huge-page) arena: the file is only parsed.
  auto f = inf::gguf::file::open(a.model, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return fail("run", f.error().message);
  auto tok = inf::tokenizer::tokenizer::from_gguf(*f);
  if (!tok) return fail("run", tok.error().message);
  mdl::load_options lo;
  progress_bar bar(fmt::format("loading {}", std::filesystem::path(a.model).filename().string()));
  lo.on_progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.update(done, total); };
  auto m = mdl::model::load(*f, lo);
  bar.finish();
  if (!m) return fail("run", m.error().message);
  const double load_s = std::chrono::duration<double>(clock::now() - t_load).count();

  std::vector<inf::tokenizer::token_id> prompt;
  if (a.chat) {
    const auto chat = inf::tokenizer::chat_template_for(*f, *tok);
    auto p = inf::tokenizer::apply_chat_template(chat, {{"user", a.prompt}}, true);
    if (!p) return fail("run", p.error().message);
    prompt = tok->encode(p->text, {p->add_bos, true});
  } else {
    prompt = tok->encode(a.prompt, {true, false});
  }
  if (prompt.empty()) return fail("run", "the prompt encodes to no tokens (give -p TEXT)");

  const auto& hp = (*m)->params();
  std::int64_t n_ctx = a.ctx;
  if (n_ctx == 0)
    n_ctx = std::min<std::int64_t>(hp.n_ctx_train,
                                   static_cast<std::int64_t>(prompt.size()) + a.n_predict);
  if (n_ctx < static_cast<std::int64_t>(prompt.size()))
    return fail("run", fmt::format("the prompt has {} tokens but the context holds {} (--ctx)",
                                   prompt.size(), n_ctx));
  auto pool = inf::thread_pool::create(a.threads);
  if (!pool) return fail("run", pool.error().message);
  const auto kv = inf::parse_kv_cache_type(a.kv_cache);
  if (!kv) return fail("run", fmt::format("unknown --kv-cache '{}' (f16, q8_0)", a.kv_cache));
  auto ctx = mdl::context::create(**m, {n_ctx, 256, pool->get(), {}, *kv});
  if (!ctx) return fail("run", ctx.error().message);

  mdl::generator gen(**m, **ctx, &*tok, so);
  std::string text;
  auto on_text = [&](std::string_view piece) {
    if (a.json) {
      text.append(piece);
    } else {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  auto st = gen.generate(prompt, a.n_predict, on_text);
  if (!st) return fail("run", st.error().message);
  const auto& hist = gen.history();
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["text"] = text;
    j["prompt_tokens"] = st->prompt_tokens;
    j["generated_tokens"] = st->generated_tokens;
    j["tokens"] = std::vector<std::int32_t>(hist.begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                                           hist.end());
    j["stop"] = std::string(to_string(st->stop));
    j["prefill_tok_per_s"] = st->prefill_tok_per_s();
    j["decode_tok_per_s"] = st->decode_tok_per_s();
    j["threads"] = a.threads;
    j["load_s"] = load_s;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
  }
  // The data first, whole: with stdout and stderr on one file (a test's capture, `2>&1`), a JSON
  // line longer than stdio's buffer was otherwise cut by the summary below.
  std::fflush(stdout);
  log::sayf(
      false,
      "tessera run: %s (%s, %s), %d thread(s), load %.2f s\n"
      "  prefill: %lld tokens in %.3f s = %.1f tok/s\n"
      "  decode:  %lld tokens (%lld timed after the first) in %.3f s = %.1f tok/s (stop: %s)\n",
      a.model.c_str(), std::string(mdl::to_string(hp.arch)).c_str(), inf::describe_cpu().c_str(),
      a.threads, load_s, static_cast<long long>(st->prompt_tokens), st->prefill_s,
      st->prefill_tok_per_s(), static_cast<long long>(st->generated_tokens),
      static_cast<long long>(std::max<std::int64_t>(st->generated_tokens - 1, 0)), st->decode_s,
      st->decode_tok_per_s(), std::string(to_string(st->stop)).c_str());
  return 0;
}

}  // namespace

void register_run(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("run", "run a GGUF model locally and stream generated text");
  auto a = std::make_shared<run_args>();
  cmd->add_option("model", a->model, "GGUF model file")->required();
  cmd->add_option("-p,--prompt", a->prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate (default 128)");
  cmd->add_option("--temp", a->temp, "temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", a->top_k, "keep the k most likely tokens; 0 = off (default 40)");
  cmd->add_option("--top-p", a->top_p, "nucleus threshold; 1 = off (default 0.95)");
  cmd->add_option("--min-p", a->min_p, "drop tokens below min-p x p(top); 0 = off (default 0.05)");
  cmd->add_option("--repeat-penalty", a->repeat_penalty, "penalty for recent tokens; 1 = off");
  cmd->add_option("--repeat-window", a->repeat_window, "how many recent tokens (default 64)");
  cmd->add_option("--seed", a->seed, "random seed (same seed, same text)");
  cmd->add_option("-t,--threads", a->threads, "compute threads (default 1)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--kv-cache", a->kv_cache,
                  "KV cache: f16 (default) or q8_0 (half the memory and the bytes read per token)")
      ->check(CLI::IsMember({"f16", "q8_0"}));
  cmd->add_option("--ctx", a->ctx, "KV cache positions (default: prompt + n, at most the model's)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_flag("--chat", a->chat, "wrap the prompt in the model's chat template");
  cmd->add_flag("--json", a->json, "print one JSON object (text, tokens, timings) at the end");
  cmd->callback([&exit_code, a] { exit_code = run(*a); });
}

}  // namespace tessera::cli
