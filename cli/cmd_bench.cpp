// `tessera bench`: prefill (ppN) and decode (tgN) tokens/s of a GGUF model or of a synthetic
// preset, medians over repetitions, with the decode bandwidth roofline (weight bytes per token
// divided by the measured read bandwidth) printed beside each decode figure and prefill as a
// fraction of the measured compute peak (mat-mul multiply-accumulates per token times tokens/s over
// the probe's int8 or f32 peak). Optionally at a filled context (--depth), with several streams
// decoding in one batch (--batch), and with the weights in GGUF's rows instead of panels
// (--layout).
//
// Weights are copied into the model's anonymous huge-page arena (never reclaimed to the file by
// DAMON, see ../shared/notes/benchmarking.md). Presets are synthesised once into a cache folder.
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "cli/progress.hpp"
#include "inference/gguf/gguf.hpp"
#include "inference/gguf/synth.hpp"
#include "inference/kernels/bandwidth.hpp"
#include "inference/kernels/compute.hpp"
#include "inference/kernels/cpu.hpp"
#include "inference/model/model.hpp"

namespace tessera::cli {

namespace {

namespace inf = tessera::inference;
namespace mdl = tessera::inference::model;
using clock_type = std::chrono::steady_clock;

struct bench_args {
  std::string model;
  std::string preset;
  std::string arch = "llama";
  std::vector<std::string> types{"f16"};
  std::vector<int> threads{1};
  std::int64_t pp = 128;
  std::int64_t tg = 64;
  int reps = 5;
  bool json = false;
  bool profile = false;
  std::string cache_dir;
  std::uint64_t bandwidth_mib = 256;
  std::vector<std::int64_t> depths{0};
  int batch = 1;
  std::vector<std::string> layouts{"panels"};  // rows | panels (q4_K, f16) | all (q8_0 too)
  std::vector<std::string> kv_types{"f16"};    // the KV cache: f16 | q8_0
};

struct stats {
  double median = 0, best = 0;
};

stats summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return {med, v.back()};
}

std::string default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tessera";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tessera";
  return "/tmp/tessera-cache";
}

result<std::string> preset_file(const bench_args& a, const std::string& type_name) {
  auto cfg = inf::gguf::synth_preset(a.preset, a.arch);
  if (!cfg) return std::move(cfg).error();
  auto type = inf::gguf::parse_tensor_type(type_name);
  if (!type) return std::move(type).error();
  cfg->type = *type;
  const std::string dir = a.cache_dir.empty() ? default_cache_dir() : a.cache_dir;
  // mkdir -p (two levels are enough for the defaults; a custom folder must exist or be one level).
  const auto slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) ::mkdir(dir.substr(0, slash).c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  const std::string path = fmt::format("{}/synth-{}-{}-{}-seed{}.gguf", dir, a.preset, a.arch,
                                       type_name, cfg->seed);
  if (auto f = inf::gguf::file::open(path, {inf::gguf::load_mode::headers_only, {}}); f) return path;
  log::say(fmt::format("tessera bench: synthesising {} ...", path));
  auto r = inf::gguf::write_synthetic_model(*cfg, path);
  if (!r) return std::move(r).error();
  return path;
}

// CPU time of the process: on a machine shared with other work, tokens per CPU-second (divided
// by the thread count) is a load-robust proxy for the quiet figure (it still loses the DRAM
// bandwidth others take, so it is pessimistic).
double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct row {
  std::string model, type, layout, kv_type;
  int threads = 1;
  std::int64_t depth = 0;
  double macs_per_token = 0;  // mat-mul multiply-accumulates of one prefill token (no attention)
  stats pp, tg;
  stats pp_cpu, tg_cpu;  // tokens per CPU-second per thread
  double roofline = 0, bandwidth_gb_s = 0;
  std::uint64_t bytes_per_token = 0;
  mdl::stage_times decode_stages;
  std::int64_t decode_tokens = 0;
};

// Multiply-accumulates of the mat-muls one token of prefill runs (every layer's projections; for
// an MoE model the router and the used experts' share), without attention and the output layer
// (prefill computes logits for the last token only).
double prefill_macs_per_token(const mdl::model& m) {
  const auto& hp = m.params();
  double macs = 0;
  for (std::int64_t il = m.shard().first_layer; il < m.shard().last_layer; ++il) {
    const auto& L = m.layer(il);
    for (const inf::weight_view* w :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.router})
      if (w->data != nullptr) macs += static_cast<double>(w->rows) * static_cast<double>(w->cols);
    if (L.exp_down.data != nullptr && hp.n_expert > 0) {
      // exp_gate/exp_up/exp_down views cover every local expert; a token uses n_expert_used.
      const double share = static_cast<double>(hp.n_expert_used) / static_cast<double>(hp.n_expert);
      for (const inf::weight_view* w : {&L.exp_gate, &L.exp_up, &L.exp_down})
        macs += share * static_cast<double>(w->rows) * static_cast<double>(w->cols);
    }
  }
  return macs;
}

result<row> bench_one(const bench_args& a, const std::string& path, int threads,
                      const std::string& layout, std::int64_t depth, const std::string& kv_name) {
  const auto kv = inf::parse_kv_cache_type(kv_name);
  if (!kv)
    return make_error(tessera::errc::invalid_argument, "unknown KV cache type '{}' (f16, q8_0)",
                      kv_name);
  auto f = inf::gguf::file::open(path, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return std::move(f).error();
  mdl::load_options lo;
  lo.weight_panels = layout == "rows"  ? mdl::load_options::panels::rows
                     : layout == "all" ? mdl::load_options::panels::all
                                       : mdl::load_options::panels::faster;
  progress_bar bar(fmt::format("loading {}", std::filesystem::path(path).filename().string()));
  lo.on_progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.update(done, total); };
  auto m = mdl::model::load(*f, lo);
  bar.finish();
  if (!m) return std::move(m).error();
  auto pool = inf::thread_pool::create(threads);
  if (!pool) return std::move(pool).error();
  const auto& hp = (*m)->params();
  const std::int64_t n_ctx = depth + a.pp + a.tg + 1;
  const std::int64_t chunk = std::max<std::int64_t>({a.pp, 1, depth > 0 ? 512 : 1});
  auto ctx = mdl::context::create(**m, {n_ctx, chunk, pool->get(), {}, *kv});
  if (!ctx) return std::move(ctx).error();
  auto& c = **ctx;
  // --batch B: B - 1 more sequences decode in the same passes as c (one eval_batch per token).
  std::vector<std::unique_ptr<mdl::context>> others;
  std::unique_ptr<mdl::workspace> ws;
  if (a.batch > 1) {
    for (int i = 1; i < a.batch; ++i) {
      auto o = mdl::context::create(**m, {n_ctx, chunk, nullptr, {}, *kv});
      if (!o) return std::move(o).error();
      others.push_back(std::move(*o));
    }
    auto w = mdl::workspace::create(**m, a.batch, n_ctx, threads);
    if (!w) return std::move(w).error();
    ws = std::move(*w);
  }

  row r;
  r.model = path;
  r.threads = threads;
  r.layout = layout;
  r.kv_type = kv_name;
  r.depth = depth;
  r.macs_per_token = prefill_macs_per_token(**m);
  std::string types;
  for (const auto& t : f->tensors()) {
    if (t.name == "blk.0.attn_q.weight") types = std::string(inf::to_string(t.type));
  }
  r.type = types;
  std::vector<mdl::token_id> tokens(static_cast<std::size_t>(std::max<std::int64_t>(a.pp, a.tg)));
  std::uint64_t x = 12345;
  for (auto& t : tokens) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<mdl::token_id>((x >> 33) % static_cast<std::uint64_t>(hp.n_vocab));
  }
  std::vector<float> logits(static_cast<std::size_t>(hp.n_vocab) *
                            static_cast<std::size_t>(a.batch));
  // The context filled to `depth` once (prefill in chunks, not timed); each measurement then
  // truncates back to it. Every sequence of a batch holds the same history.
  std::vector<mdl::token_id> history(static_cast<std::size_t>(depth));
  for (auto& t : history) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<mdl::token_id>((x >> 33) % static_cast<std::uint64_t>(hp.n_vocab));
  }
  std::vector<mdl::context*> all{&c};
  for (auto& o : others)
    all.push_back(o.get());
  for (mdl::context* s : all) {
    for (std::int64_t p = 0; p < depth; p += chunk) {
      const auto n = static_cast<std::size_t>(std::min(chunk, depth - p));
      auto e = s->eval(std::span(history).subspan(static_cast<std::size_t>(p), n),
                       mdl::logits_mode::none, {});
      if (!e) return std::move(e).error();
    }
  }
  std::vector<double> pp_v, tg_v, pp_c, tg_c;
  // One warm-up repetition (page faults of the KV cache and scratch, CPU frequency) not counted.
  for (int rep = -1; rep < a.reps; ++rep) {
    if (a.pp > 0) {
      c.truncate(depth);
      const double c0 = process_cpu_s();
      auto t0 = clock_type::now();
      auto e = c.eval(std::span(tokens).first(static_cast<std::size_t>(a.pp)), mdl::logits_mode::last,
                      logits);
      if (!e) return std::move(e).error();
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      const double cs = (process_cpu_s() - c0) / threads;
      if (rep >= 0) pp_v.push_back(static_cast<double>(a.pp) / s);
      if (rep >= 0 && cs > 0) pp_c.push_back(static_cast<double>(a.pp) / cs);
    }
    if (a.tg > 0) {
      for (mdl::context* s : all)
        s->truncate(depth);
      c.set_profile(a.profile && rep >= 0 && a.batch == 1);
      const double c0 = process_cpu_s();
      auto t0 = clock_type::now();
      for (std::int64_t i = 0; i < a.tg; ++i) {
        const auto tok = std::span(tokens).subspan(static_cast<std::size_t>(i), 1);
        if (a.batch == 1) {
          auto e = c.eval(tok, mdl::logits_mode::last, logits);
          if (!e) return std::move(e).error();
          continue;
        }
        std::vector<mdl::batch_item> items;
        for (std::size_t k = 0; k < all.size(); ++k) {
          mdl::batch_item it;
          it.ctx = all[k];
          it.tokens = tok;
          it.logits = std::span(logits).subspan(k * static_cast<std::size_t>(hp.n_vocab),
                                                static_cast<std::size_t>(hp.n_vocab));
          items.push_back(it);
        }
        auto e = mdl::context::eval_batch(items, *ws, pool->get());
        if (!e) return std::move(e).error();
      }
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      const double cs = (process_cpu_s() - c0) / threads;
      c.set_profile(false);
      // Aggregate: tokens of every stream of the batch.
      const double made = static_cast<double>(a.tg) * a.batch;
      if (rep >= 0) tg_v.push_back(made / s);
      if (rep >= 0 && cs > 0) tg_c.push_back(made / cs);
    }
  }
  r.pp = summarize(pp_v);
  r.tg = summarize(tg_v);
  r.pp_cpu = summarize(pp_c);
  r.tg_cpu = summarize(tg_c);
  r.bytes_per_token = (*m)->bytes_per_token();
  auto bw = inf::measure_read_bandwidth(static_cast<std::size_t>(a.bandwidth_mib) << 20, 7,
                                        pool->get());
  if (!bw) return std::move(bw).error();
  r.bandwidth_gb_s = bw->median_gb_per_s;
  r.roofline = inf::roofline_tokens_per_s(r.bytes_per_token, r.bandwidth_gb_s);
  r.decode_stages = c.times();
  r.decode_tokens = a.profile ? a.tg * a.reps : 0;
  return r;
}

int run(const bench_args& a) {
  if (a.model.empty() == a.preset.empty())
    return fail("bench", "give a MODEL.gguf or --preset tiny|large|moe");
  if (a.pp < 0 || a.pp > 4096 || a.tg < 0 || a.tg > 4096 || (a.pp == 0 && a.tg == 0))
    return fail("bench", "--pp and --tg must be in [0, 4096], not both 0");
  if (a.reps < 1 || a.reps > 1000) return fail("bench", "--reps must be in [1, 1000]");
  if (a.bandwidth_mib < 1 || a.bandwidth_mib > 8192)
    return fail("bench", "--bandwidth-mib must be in [1, 8192]");
  std::vector<std::string> files;
  if (!a.model.empty()) {
    files.push_back(a.model);
  } else {
    for (const auto& t : a.types) {
      auto p = preset_file(a, t);
      if (!p) return fail("bench", p.error().message);
      files.push_back(*p);
    }
  }
  // The compute peak of one thread with the kernels' own tier: prefill's ceiling.
  auto peak = inf::measure_compute(inf::active_isa());
  if (!peak) return fail("bench", peak.error().message);
  std::vector<row> rows;
  if (!a.json) {
    std::printf("# %s; weights in an anonymous huge-page arena; medians of %d reps (best)\n",
                inf::describe_cpu().c_str(), a.reps);
    std::printf("# compute peak: %s\n", inf::describe(*peak).c_str());
    std::printf(
        "%-44s %-5s %-6s %-4s %5s %3s %18s %18s %10s %7s %7s\n", "model", "type", "layout", "kv", "depth",
        "thr", fmt::format("pp{} tok/s", a.pp).c_str(),
        fmt::format("tg{} tok/s{}", a.tg, a.batch > 1 ? fmt::format(" x{}", a.batch) : "").c_str(),
        "roofline", "% roof", "% peak");
  }
  // The peak a type's mat-muls run against: int8 for the quantized types (their activations are
  // quantized to 8 bits), f32 FMA for float weights (bf16 is not used for them); one thread's
  // peak times the row's threads.
  auto peak_gmacs = [&](const row& r) {
    const bool int8 = r.type != "f32" && r.type != "f16" && r.type != "bf16";
    return (int8 ? peak->int8_gmacs : peak->f32_gmacs) * r.threads;
  };
  auto pp_peak_fraction = [&](const row& r) {
    const double gmacs = peak_gmacs(r);
    return gmacs > 0 ? r.pp.median * r.macs_per_token / (gmacs * 1e9) : 0.0;
  };
  for (const auto& path : files) {
    for (const auto& layout : a.layouts) {
      for (const auto& kv : a.kv_types) {
        for (std::int64_t depth : a.depths) {
          for (int th : a.threads) {
            if (th < 1 || th > 256) return fail("bench", "--threads values must be in [1, 256]");
            auto r = bench_one(a, path, th, layout, depth, kv);
            if (!r) return fail("bench", r.error().message);
            if (!a.json) {
              const std::string base =
                  path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
              // The roofline is one stream's; a batch's aggregate is compared with it as is.
              std::printf(
                  "%-44s %-5s %-6s %-4s %5lld %3d %9.1f (%6.1f) %9.1f (%6.1f) %10.1f %6.0f%% %6.0f%%\n",
                  base.c_str(), r->type.c_str(), layout.c_str(), kv.c_str(),
                  static_cast<long long>(depth), th,
                  r->pp.median, r->pp.best, r->tg.median, r->tg.best, r->roofline,
                  r->roofline > 0 ? 100.0 * r->tg.median / r->roofline : 0.0,
                  100.0 * pp_peak_fraction(*r));
              std::printf(
                  "    %s per token, read bandwidth %.1f GB/s (%d thread%s); per CPU-second: "
                  "pp %.1f tg %.1f tok/s; prefill %.1f G MAC/s\n",
                  inf::gguf::human_bytes(r->bytes_per_token).c_str(), r->bandwidth_gb_s, th,
                  th == 1 ? "" : "s", r->pp_cpu.median, r->tg_cpu.median,
                  r->pp.median * r->macs_per_token / 1e9);
              if (a.batch > 1) {
                // A batch's decode is compute-bound too: its mat-mul MACs against the same peak.
                const double gmacs = r->tg.median * r->macs_per_token / 1e9;
                const double peak_g = peak_gmacs(*r);
                std::printf(
                    "    batched decode: %d streams, %.1f G MAC/s, %.0f%% of the compute peak\n",
                    a.batch, gmacs, peak_g > 0 ? 100.0 * gmacs / peak_g : 0.0);
              }
              if (a.profile && r->decode_tokens > 0) {
                const auto& s = r->decode_stages;
                const double us = 1e6 / static_cast<double>(r->decode_tokens);
                std::printf(
                    "    decode us/token: embed %.1f norm %.1f qkv %.1f rope+kv %.1f attention %.1f "
                    "wo %.1f "
                    "ffn_gate_up %.1f ffn_down %.1f output %.1f (sum %.1f)\n",
                    s.embed_s * us, s.norm_s * us, s.qkv_s * us, s.rope_s * us, s.attention_s * us,
                    s.wo_s * us, s.ffn_up_s * us, s.ffn_down_s * us, s.output_s * us, s.total() * us);
              }
              std::fflush(stdout);
            }
            rows.push_back(*r);
          }
        }
      }
    }
  }
  if (a.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : rows) {
      out.push_back({{"model", r.model},
                     {"type", r.type},
                     {"threads", r.threads},
                     {"pp", a.pp},
                     {"tg", a.tg},
                     {"reps", a.reps},
                     {"pp_tok_per_s_median", r.pp.median},
                     {"pp_tok_per_s_best", r.pp.best},
                     {"tg_tok_per_s_median", r.tg.median},
                     {"tg_tok_per_s_best", r.tg.best},
                     {"pp_tok_per_cpu_s_median", r.pp_cpu.median},
                     {"tg_tok_per_cpu_s_median", r.tg_cpu.median},
                     {"bytes_per_token", r.bytes_per_token},
                     {"read_bandwidth_gb_per_s", r.bandwidth_gb_s},
                     {"roofline_tok_per_s", r.roofline},
                     {"roofline_fraction", r.roofline > 0 ? r.tg.median / r.roofline : 0.0},
                     {"layout", r.layout},
                     {"kv_type", r.kv_type},
                     {"depth", r.depth},
                     {"batch", a.batch},
                     {"prefill_macs_per_token", r.macs_per_token},
                     {"peak_int8_gmacs", peak->int8_gmacs},
                     {"peak_f32_gmacs", peak->f32_gmacs},
                     {"peak_bf16_gmacs", peak->bf16_gmacs},
                     {"pp_peak_fraction", pp_peak_fraction(r)},
                     {"tg_gmacs", r.tg.median * r.macs_per_token / 1e9}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("bench", "measure decode and prefill speed");
  auto a = std::make_shared<bench_args>();
  cmd->add_option("model", a->model, "GGUF model file (or --preset)");
  cmd->add_option("--preset", a->preset,
                  "synthetic model: tiny, large or moe (48 experts, 4 used per token)")
      ->check(CLI::IsMember({"tiny", "large", "moe"}));
  cmd->add_option("--arch", a->arch,
                  "preset architecture: llama, qwen3 or qwen3moe (moe with llama: Mixtral's "
                  "layout, with qwen3: qwen3moe)")
      ->check(CLI::IsMember({"llama", "qwen3", "qwen3moe"}));
  cmd->add_option("--type", a->types, "preset weight types, e.g. f16,q8_0")->delimiter(',');
  cmd->add_option("-t,--threads", a->threads, "thread counts, e.g. 1,2")->delimiter(',');
  cmd->add_option("--pp", a->pp, "prompt tokens for the prefill figure (default 128)");
  cmd->add_option("--tg", a->tg, "generated tokens for the decode figure (default 64)");
  cmd->add_option("--reps", a->reps, "repetitions (median and best reported; default 5)");
  cmd->add_option("--cache-dir", a->cache_dir, "where presets are synthesised (default ~/.cache/tessera)");
  cmd->add_option("--bandwidth-mib", a->bandwidth_mib, "bandwidth probe buffer (default 256)");
  cmd->add_option("--depth", a->depths,
                  "context already filled before each figure, e.g. 0,1024,4096 (default 0)")
      ->delimiter(',')
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{131072}));
  cmd->add_option("--batch", a->batch,
                  "streams decoding together in one batch; tg is their aggregate (default 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--layout", a->layouts,
                  "weight layout: panels (default: q4_K and f16 in panels), all (q8_0 too: slower "
                  "decode, for comparison) or rows (no panels); e.g. rows,panels,all")
      ->delimiter(',')
      ->check(CLI::IsMember({"rows", "panels", "all"}));
  cmd->add_option("--kv-cache", a->kv_types,
                  "KV cache: f16 (default) or q8_0 (half the memory and the bytes read per token "
                  "at depth); e.g. f16,q8_0")
      ->delimiter(',')
      ->check(CLI::IsMember({"f16", "q8_0"}));
  cmd->add_flag("--profile", a->profile, "time each forward-pass stage of decode");
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([&exit_code, a] { exit_code = run(*a); });
}

}  // namespace tessera::cli
