// The model library: metadata and tensor errors name what is wrong, the KV cache bound, batch /
// thread / shard invariance of the logits, and generation sessions. Numerical agreement with the
// float64 reference is compare_reference.py's job (ctest inference.model.logits_match_numpy_reference).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "inference/gguf/gguf.hpp"
#include "inference/gguf/synth.hpp"
#include "inference/gguf/writer.hpp"
#include "inference/model/generator.hpp"
#include "inference/model/model.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::inference::model {
namespace {

std::string temp_path(std::string_view tag) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("tessera_model_{}_{}.gguf", tag, ::getpid()))
      .string();
}

gguf::synth_config small(std::string arch = "llama", tensor_type type = tensor_type::f32) {
  gguf::synth_config c;
  c.arch = std::move(arch);
  c.dim = 64;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 128;
  c.vocab = 600;
  c.context = 64;
  c.type = type;
  c.seed = 5;
  return c;
}

// A mixture of experts of the same size: 4 experts of FFN width 32 (128 hidden units in all, as
// small()'s dense FFN), 2 used per token. "qwen3moe", or "llama" (Mixtral's layout).
gguf::synth_config small_moe(std::string arch = "qwen3moe", tensor_type type = tensor_type::f32) {
  gguf::synth_config c = small(std::move(arch), type);
  c.experts = 4;
  c.experts_used = 2;
  c.expert_ffn = 32;
  return c;
}

// A synthetic model file, removed at the end of the test.
struct model_file {
  std::string path;
  explicit model_file(const gguf::synth_config& c, std::string_view tag) : path(temp_path(tag)) {
    auto r = gguf::write_synthetic_model(c, path);
    EXPECT_TRUE(r) << r.error().message;
  }
  ~model_file() { std::filesystem::remove(path); }
};

gguf::file open(const std::string& path, gguf::load_mode mode = gguf::load_mode::headers_only) {
  auto f = gguf::file::open(path, {mode, {}});
  EXPECT_TRUE(f) << f.error().message;
  return std::move(*f);
}

// Copies `src` into a new file with `edit` applied to the metadata and tensors (drop / rename /
// replace), for the error tests.
struct rewrite {
  std::function<bool(const std::string& key, gguf::value& v)> meta;  // false: drop
  std::function<bool(std::string& name)> tensor;                     // false: drop
};
std::string rewritten(const std::string& src, std::string_view tag, const rewrite& rw) {
  auto f = open(src, gguf::load_mode::anonymous);
  gguf::writer w(f.alignment());
  for (auto [k, v] : f.metadata()) {
    if (!rw.meta || rw.meta(k, v)) w.set(k, v);
  }
  for (const auto& t : f.tensors()) {
    std::string name = t.name;
    if (rw.tensor && !rw.tensor(name)) continue;
    auto bytes = f.data(t);
    EXPECT_TRUE(bytes);
    auto r = w.add_tensor(name, t.type, t.dims, *bytes);
    EXPECT_TRUE(r) << r.error().message;
  }
  const std::string out = temp_path(tag);
  auto r = w.write(out);
  EXPECT_TRUE(r) << r.error().message;
  return out;
}

std::string load_error(const std::string& path, const load_options& o = {}) {
  auto f = gguf::file::open(path, {gguf::load_mode::headers_only, {}});
  if (!f) return "open: " + f.error().message;
  auto m = model::load(*f, o);
  return m ? std::string("loaded") : m.error().message;
}

TEST(ModelLoad, HyperParametersFromMetadata) {
  model_file mf(small("qwen3"), "hp");
  auto f = open(mf.path);
  auto m = model::load(f);
  ASSERT_TRUE(m) << m.error().message;
  const hparams& hp = (*m)->params();
  EXPECT_EQ(hp.arch, architecture::qwen3);
  EXPECT_EQ(hp.dim, 64);
  EXPECT_EQ(hp.n_layer, 3);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 2);
  EXPECT_EQ(hp.head_dim, 16);
  EXPECT_EQ(hp.ffn, 128);
  EXPECT_EQ(hp.n_vocab, 600);
  EXPECT_EQ(hp.rope, rope_mode::neox);
  EXPECT_TRUE(hp.qk_norm);
  EXPECT_TRUE((*m)->has_embedding() && (*m)->has_output());
  // Every mat-mul weight once per token (f32): 3 layers x (q, k, v, o, gate, up, down) + output.
  const std::uint64_t per_layer = 4 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128);
  EXPECT_EQ((*m)->bytes_per_token(), 3 * per_layer + 4 * 600 * 64);
}

TEST(ModelLoad, ProgressRisesToTheTotal) {
  model_file mf(small("llama"), "progress");
  auto f = open(mf.path);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> calls;
  load_options o;
  o.on_progress = [&](std::uint64_t done, std::uint64_t total) { calls.emplace_back(done, total); };
  auto m = model::load(f, o);
  ASSERT_TRUE(m) << m.error().message;
  // One call per tensor after the first, then the end: never backwards, never past the total, and
  // the last one is done == total.
  ASSERT_GE(calls.size(), 2u);
  for (std::size_t i = 1; i < calls.size(); ++i) {
    EXPECT_GE(calls[i].first, calls[i - 1].first);
    EXPECT_EQ(calls[i].second, calls[0].second);
    EXPECT_LE(calls[i].first, calls[i].second);
  }
  EXPECT_EQ(calls.back().first, calls.back().second);
  EXPECT_GE(calls.back().second, (*m)->bytes_per_token());
}

TEST(ModelLoad, MissingTensorIsNamed) {
  model_file mf(small(), "missing");
  const std::string p = rewritten(mf.path, "missing2", {nullptr, [](std::string& n) {
                                                          return n != "blk.1.ffn_up.weight";
                                                        }});
  const std::string e = load_error(p);
  std::filesystem::remove(p);
  EXPECT_NE(e.find("blk.1.ffn_up.weight"), std::string::npos) << e;
}

// check() finds what load() finds before reading weights, and reads none: a peer validates a model
// at start without holding it (it loads the weights only when the plan gives it a replica).
TEST(ModelLoad, CheckFindsWhatLoadFindsWithoutTheWeights) {
  model_file mf(small("llama", tensor_type::q8_0), "check");
  auto f = open(mf.path);
  auto bytes = model::check(f);
  ASSERT_TRUE(bytes) << bytes.error().message;
  auto m = model::load(f);
  ASSERT_TRUE(m);
  EXPECT_EQ(*bytes, (*m)->weight_bytes_total());
  auto half = model::check(f, {shard_spec::layers(0, 1)});
  ASSERT_TRUE(half);
  EXPECT_LT(*half, *bytes);
  const std::string p = rewritten(mf.path, "check2", {nullptr, [](std::string& n) {
                                                        return n != "blk.2.attn_v.weight";
                                                      }});
  auto broken = open(p);
  auto c = model::check(broken);
  auto l = model::load(broken);
  std::filesystem::remove(p);
  ASSERT_FALSE(c);
  ASSERT_FALSE(l);
  EXPECT_EQ(c.error().message, l.error().message);
  EXPECT_NE(c.error().message.find("blk.2.attn_v.weight"), std::string::npos) << c.error().message;
}

TEST(ModelLoad, WrongShapeIsNamed) {
  model_file mf(small(), "shape");
  // attn_q (64x64) stored under the name attn_k (expected 64x32), and attn_k dropped.
  const std::string p = rewritten(mf.path, "shape2", {nullptr, [](std::string& n) {
                                                        if (n == "blk.0.attn_k.weight") return false;
                                                        if (n == "blk.0.attn_q.weight") n = "blk.0.attn_k.weight";
                                                        return true;
                                                      }});
  const std::string e = load_error(p);
  std::filesystem::remove(p);
  // attn_q is now missing, which is found first; either way the message names the tensor.
  EXPECT_NE(e.find("blk.0.attn_"), std::string::npos) << e;
  EXPECT_NE(e, "loaded");
}

TEST(ModelLoad, MetadataErrorsNameTheKey) {
  model_file mf(small(), "meta");
  struct tcase {
    std::string key;
    std::function<bool(gguf::value&)> edit;
    std::string expect;
  };
  const std::vector<tcase> cases = {
      {"llama.block_count", [](gguf::value&) { return false; }, "llama.block_count is missing"},
      {"llama.feed_forward_length", [](gguf::value&) { return false; }, "llama.feed_forward_length"},
      {"llama.attention.head_count_kv",
       [](gguf::value& v) { v = gguf::value::u32(3); return true; }, "head_count_kv 3"},
      {"general.architecture",
       [](gguf::value& v) { v = gguf::value::str("gpt2"); return true; },
       "architecture 'gpt2' is not supported"},
      {"llama.embedding_length",
       [](gguf::value& v) { v = gguf::value::u32(96); return true; }, "token_embd.weight"},
      {"llama.attention.key_length",
       [](gguf::value& v) { v = gguf::value::u32(17); return true; }, "key_length 17"},
  };
  for (const auto& c : cases) {
    const std::string p = rewritten(mf.path, "meta2", {[&](const std::string& k, gguf::value& v) {
                                                         return k == c.key ? c.edit(v) : true;
                                                       },
                                                       nullptr});
    const std::string e = load_error(p);
    std::filesystem::remove(p);
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.key << ": " << e;
  }
}

// Logits for `tokens` with the given batch size and thread count.
std::vector<float> run_logits(const model& m, const std::vector<token_id>& tokens,
                              std::int64_t batch, int threads,
                              kv_cache_type kv = kv_cache_type::f16) {
  auto pool = thread_pool::create(threads);
  EXPECT_TRUE(pool);
  auto c = context::create(m, {64, batch, pool->get(), {}, kv});
  EXPECT_TRUE(c);
  std::vector<float> logits(tokens.size() * static_cast<std::size_t>(m.params().n_vocab));
  auto r = (*c)->eval(tokens, logits_mode::all, logits);
  EXPECT_TRUE(r) << r.error().message;
  return logits;
}

// A qwen2 model made from a llama one: keys renamed, optional q/k/v biases added.
std::string as_qwen2(const std::string& llama_path, std::string_view tag, float bias) {
  auto f = open(llama_path, gguf::load_mode::anonymous);
  gguf::writer w(f.alignment());
  for (auto [k, v] : f.metadata()) {
    if (k == "general.architecture") v = gguf::value::str("qwen2");
    if (k.rfind("llama.", 0) == 0) k = "qwen2." + k.substr(6);
    w.set(k, v);
  }
  for (const auto& t : f.tensors()) {
    EXPECT_TRUE(w.add_tensor(t.name, t.type, t.dims, *f.data(t)));
    const auto n = t.dims.size() == 2 ? t.dims[1] : 0;
    for (const char* which : {"attn_q", "attn_k", "attn_v"}) {
      if (bias != 0.0f && t.name.find(std::string(which) + ".weight") != std::string::npos) {
        std::vector<float> b(n);
        for (std::size_t i = 0; i < n; ++i) b[i] = bias * static_cast<float>((i % 7)) - bias * 3;
        const std::string name = t.name.substr(0, t.name.size() - 6) + "bias";
        EXPECT_TRUE(w.add_tensor(name, tensor_type::f32, {n},
                                 std::as_bytes(std::span<const float>(b))));
      }
    }
  }
  const std::string out = temp_path(tag);
  EXPECT_TRUE(w.write(out));
  return out;
}

TEST(ModelLoad, Qwen2UsesNeoxRopeAndOptionalBiases) {
  model_file mf(small("llama"), "q2src");
  const std::string plain = as_qwen2(mf.path, "q2plain", 0.0f);
  const std::string biased = as_qwen2(mf.path, "q2bias", 0.2f);
  const std::vector<token_id> tokens = {1, 5, 9, 300};
  auto logits_of = [&](const std::string& p, architecture arch) {
    auto f = open(p);
    auto m = model::load(f);
    EXPECT_TRUE(m) << m.error().message;
    if (!m) return std::vector<float>{};
    EXPECT_EQ((*m)->params().arch, arch);
    EXPECT_EQ((*m)->params().rope, arch == architecture::llama ? rope_mode::normal : rope_mode::neox);
    EXPECT_FALSE((*m)->params().qk_norm);
    return run_logits(**m, tokens, 64, 1);
  };
  const auto a = logits_of(plain, architecture::qwen2), b = logits_of(biased, architecture::qwen2),
             l = logits_of(mf.path, architecture::llama);
  std::filesystem::remove(plain);
  std::filesystem::remove(biased);
  ASSERT_EQ(a.size(), b.size());
  // Position 0 is not rotated: without biases qwen2 and llama agree there, not later.
  const std::size_t v = 600;
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + v, l.begin()));
  EXPECT_FALSE(std::equal(a.begin() + v, a.end(), l.begin() + v));
  EXPECT_NE(a, b);  // the biases are applied
}

TEST(ModelLoad, ShardSpecsAreChecked) {
  model_file mf(small(), "shards");
  EXPECT_NE(load_error(mf.path, {shard_spec::layers(2, 1)}).find("shard layers [2, 1)"),
            std::string::npos);
  EXPECT_NE(load_error(mf.path, {shard_spec::layers(0, 4)}).find("not inside [0, 3)"),
            std::string::npos);
  shard_spec tp;
  tp.head_begin = 1;
  tp.head_end = 3;  // cuts both GQA groups (4 heads over 2 KV heads): holds both KV heads
  {
    auto f = open(mf.path);
    auto m = model::load(f, {tp});
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ((*m)->local().n_head, 2);
    EXPECT_EQ((*m)->local().n_head_kv, 2);
    EXPECT_EQ((*m)->kv_first(), 0);
    EXPECT_EQ((*m)->kv_group(), 2);
  }
  tp.head_begin = 0;
  tp.head_end = 2;
  EXPECT_EQ(load_error(mf.path, {tp}), "loaded");
  tp.ffn_begin = 16;  // not on a q8_0 block boundary of ffn_down's columns
  tp.ffn_end = 64;
  model_file q8(small("llama", tensor_type::q8_0), "shards_q8");
  EXPECT_NE(load_error(q8.path, {tp}).find("block boundaries"), std::string::npos);
  EXPECT_EQ(load_error(mf.path, {shard_spec::layers(1, 2)}), "loaded");
}

// A mixture of experts: the hyper-parameters, what a token reads (the router and, on average,
// k / n of the experts), expert ranges on expert boundaries only, and the errors that name the
// key or tensor a broken MoE file lacks.
TEST(ModelLoad, MixtureOfExpertsHyperParametersShardsAndErrors) {
  for (const char* arch : {"qwen3moe", "llama"}) {
    SCOPED_TRACE(arch);
    model_file mf(small_moe(arch), "moe");
    auto f = open(mf.path);
    auto m = model::load(f);
    ASSERT_TRUE(m) << m.error().message;
    const hparams& hp = (*m)->params();
    EXPECT_EQ(hp.arch,
              std::string_view(arch) == "llama" ? architecture::llama : architecture::qwen3moe);
    EXPECT_TRUE(hp.is_moe());
    EXPECT_EQ(hp.n_expert, 4);
    EXPECT_EQ(hp.n_expert_used, 2);
    EXPECT_EQ(hp.expert_ffn, 32);
    EXPECT_EQ(hp.ffn, 4 * 32);  // the experts' hidden units side by side
    EXPECT_EQ(hp.qk_norm, std::string_view(arch) == "qwen3moe");
    // f32: per layer q, k, v, o, the router [4 x 64], and 2 of the 4 experts (3 x 32 x 64 each).
    const std::uint64_t per_layer =
        4 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 4 * 64 + 2 * 3 * 32 * 64);
    EXPECT_EQ((*m)->bytes_per_token(), 3 * per_layer + 4 * 600 * 64);
    // A shard of experts 1..2 (FFN columns [32, 96)) holds two experts; a cut inside an expert
    // is refused, naming the width.
    shard_spec s;
    s.ffn_begin = 32;
    s.ffn_end = 96;
    s.head_begin = 0;
    s.head_end = 2;
    auto part = model::load(f, {s});
    ASSERT_TRUE(part) << part.error().message;
    EXPECT_EQ((*part)->local().n_expert, 2);
    EXPECT_EQ((*part)->expert_first(), 1);
    EXPECT_TRUE((*part)->is_tensor_parallel());
    EXPECT_LT((*part)->weight_bytes_total(), (*m)->weight_bytes_total());
    s.ffn_end = 80;
    EXPECT_NE(load_error(mf.path, {s}).find("expert boundaries (each expert is 32 columns)"),
              std::string::npos);
    const std::string key = std::string(arch) + ".expert_used_count";
    struct tcase {
      std::string key;
      std::function<bool(gguf::value&)> edit;
      std::string expect;
    };
    const std::vector<tcase> cases = {
        {key, [](gguf::value&) { return false; }, key + " is missing"},
        {key,
         [](gguf::value& v) {
           v = gguf::value::u32(5);
           return true;
         },
         "expert_used_count 5"},
    };
    for (const auto& c : cases) {
      const std::string p = rewritten(
          mf.path, "moe2",
          {[&](const std::string& k, gguf::value& v) { return k == c.key ? c.edit(v) : true; },
           nullptr});
      const std::string e = load_error(p);
      std::filesystem::remove(p);
      EXPECT_NE(e.find(c.expect), std::string::npos) << c.key << ": " << e;
    }
    const std::string p = rewritten(
        mf.path, "moe3", {nullptr, [](std::string& n) { return n != "blk.1.ffn_up_exps.weight"; }});
    const std::string e = load_error(p);
    std::filesystem::remove(p);
    EXPECT_NE(e.find("blk.1.ffn_up_exps.weight"), std::string::npos) << e;
  }
}

TEST(ModelContext, KvCacheFullIsAnErrorAndChangesNothing) {
  model_file mf(small(), "kv");
  auto f = open(mf.path);
  auto m = model::load(f);
  ASSERT_TRUE(m);
  auto c = context::create(**m, {4, 4, nullptr});
  ASSERT_TRUE(c);
  std::vector<float> logits(600);
  const std::vector<token_id> three = {1, 2, 3}, two = {4, 5}, one = {6};
  ASSERT_TRUE((*c)->eval(three, logits_mode::last, logits));
  auto r = (*c)->eval(two, logits_mode::last, logits);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::no_capacity);
  EXPECT_NE(r.error().message.find("KV cache full"), std::string::npos) << r.error().message;
  EXPECT_EQ((*c)->pos(), 3);
  ASSERT_TRUE((*c)->eval(one, logits_mode::last, logits));
  EXPECT_FALSE((*c)->eval(one, logits_mode::last, logits));
  (*c)->truncate(2);
  EXPECT_EQ((*c)->pos(), 2);
  EXPECT_TRUE((*c)->eval(two, logits_mode::last, logits));
  // Bad inputs.
  const std::vector<token_id> bad = {600};
  (*c)->reset();
  auto b = (*c)->eval(bad, logits_mode::last, logits);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("token id 600"), std::string::npos);
  std::vector<float> small_buf(10);
  EXPECT_FALSE((*c)->eval(one, logits_mode::last, small_buf));
  EXPECT_FALSE(context::create(**m, {0, 4, nullptr}));
}

// Every weight layout (issue 35's panels and GGUF's rows): the same contract.
TEST(ModelContext, PrefillDecodeThreadsAndShardsGiveIdenticalLogits) {
  using layout = load_options::panels;
  for (auto type : {tensor_type::f16, tensor_type::q8_0}) {
    for (const char* arch : {"llama", "qwen3"}) {
      std::vector<float> in_rows;
      for (layout lay : {layout::rows, layout::faster, layout::all}) {
        SCOPED_TRACE(::testing::Message()
                     << to_string(type) << " layout " << static_cast<int>(lay));
        model_file mf(small(arch, type), "inv");
        auto f = open(mf.path);
        load_options lo;
        lo.weight_panels = lay;
        auto m = model::load(f, lo);
        ASSERT_TRUE(m) << m.error().message;
        const bool panels = type == tensor_type::f16 ? lay != layout::rows : lay == layout::all;
        EXPECT_EQ((*m)->layer(0).w_down.layout,
                  panels ? weight_layout::panels : weight_layout::rows);
        const std::vector<token_id> tokens = {1, 17, 300, 45, 599, 2, 88, 88, 7};
        const auto all = run_logits(**m, tokens, 64, 1);
        for (float v : all)
          ASSERT_TRUE(std::isfinite(v));
        EXPECT_EQ(run_logits(**m, tokens, 1, 1), all) << arch << " decode path";
        EXPECT_EQ(run_logits(**m, tokens, 4, 1), all) << arch << " chunked prefill";
        EXPECT_EQ(run_logits(**m, tokens, 64, 2), all) << arch << " two threads";
        // Another layout: the same products summed in another order.
        if (in_rows.empty()) in_rows = all;
        double num = 0, den = 0;
        for (std::size_t i = 0; i < all.size(); ++i) {
          num += (all[i] - in_rows[i]) * (all[i] - in_rows[i]);
          den += in_rows[i] * in_rows[i];
        }
        EXPECT_LT(std::sqrt(num / den), type == tensor_type::f16 ? 1e-4 : 1e-2) << arch;
        // Two pipeline shards chained by hidden states.
        load_options la = lo, lb = lo;
        la.shard = shard_spec::layers(0, 1);
        lb.shard = shard_spec::layers(1, -1);
        auto a = model::load(f, la);
        auto b = model::load(f, lb);
        ASSERT_TRUE(a && b);
        EXPECT_FALSE((*a)->has_output());
        EXPECT_FALSE((*b)->has_embedding());
        auto ca = context::create(**a, {64, 64, nullptr});
        auto cb = context::create(**b, {64, 64, nullptr});
        ASSERT_TRUE(ca && cb);
        std::vector<float> logits(all.size()), hidden(tokens.size() * 64);
        EXPECT_FALSE((*ca)->eval(tokens, logits_mode::all, logits));  // no output layer
        EXPECT_FALSE((*cb)->eval(tokens, logits_mode::all, logits));  // no embedding
        ASSERT_TRUE((*ca)->eval(tokens, logits_mode::none, {}, hidden));
        ASSERT_TRUE((*cb)->eval_hidden(hidden, static_cast<std::int64_t>(tokens.size()),
                                       logits_mode::all, logits));
        EXPECT_EQ(logits, all) << arch << " layer shards";
        EXPECT_LT((*a)->weight_bytes_total(), (*m)->weight_bytes_total());
      }
    }
  }
}

// The q8_0 KV cache (half the bytes): the same logits for prefill, chunked prefill, decode, two
// threads, a batch and a copied prefix, bit for bit, as the f16 cache guarantees; close to the
// f16 cache's logits; refused for a head_dim that is not a multiple of 32, and a prefix is never
// copied between caches of two types.
TEST(ModelContext, AQ8_0KvCacheIsInvariantAndCloseToTheF16Cache) {
  for (const char* arch : {"llama", "qwen3"}) {
    SCOPED_TRACE(arch);
    gguf::synth_config cfg = small(arch, tensor_type::q8_0);
    cfg.dim = 128;  // 4 heads of 32
    model_file mf(cfg, "kvq8");
    auto f = open(mf.path);
    auto m = model::load(f);
    ASSERT_TRUE(m) << m.error().message;
    ASSERT_EQ((*m)->params().head_dim, 32);
    std::vector<token_id> tokens;
    for (token_id t = 0; t < 40; ++t) tokens.push_back((t * 131 + 7) % 600);
    const auto q8 = run_logits(**m, tokens, 64, 1, kv_cache_type::q8_0);
    for (float v : q8) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(run_logits(**m, tokens, 1, 1, kv_cache_type::q8_0), q8) << "decode path";
    EXPECT_EQ(run_logits(**m, tokens, 7, 1, kv_cache_type::q8_0), q8) << "chunked prefill";
    EXPECT_EQ(run_logits(**m, tokens, 64, 2, kv_cache_type::q8_0), q8) << "two threads";
    const auto f16 = run_logits(**m, tokens, 64, 1, kv_cache_type::f16);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < q8.size(); ++i) {
      num += (q8[i] - f16[i]) * (q8[i] - f16[i]);
      den += f16[i] * f16[i];
    }
    EXPECT_LT(std::sqrt(num / den), 2.5e-2) << "relative RMS error against the f16 cache (1.5e-2 here)";
    EXPECT_NE(q8, f16);  // the keys and values really were quantized

    // A batch of two sequences, and a prefix copied from one q8_0 cache into another.
    const auto V = static_cast<std::size_t>((*m)->params().n_vocab);
    const auto last = [&](std::size_t upto) {
      return std::vector<float>(q8.begin() + static_cast<std::ptrdiff_t>((upto - 1) * V),
                                q8.begin() + static_cast<std::ptrdiff_t>(upto * V));
    };
    auto a = context::create(**m, {64, 8, nullptr, {}, kv_cache_type::q8_0});
    auto b = context::create(**m, {48, 8, nullptr, {}, kv_cache_type::q8_0});
    ASSERT_TRUE(a && b);
    auto ws = workspace::create(**m, 64, 64, 1);
    ASSERT_TRUE(ws);
    std::vector<float> la(V), lb(V);
    const std::vector<token_id> first(tokens.begin(), tokens.begin() + 21);
    std::vector<batch_item> items = {{a->get(), tokens, la}, {b->get(), first, lb}};
    ASSERT_TRUE(context::eval_batch(items, **ws, nullptr));
    EXPECT_EQ(la, last(tokens.size()));
    EXPECT_EQ(lb, last(21));
    auto c = context::create(**m, {40, 8, nullptr, {}, kv_cache_type::q8_0});
    ASSERT_TRUE(c);
    ASSERT_TRUE((*c)->copy_prefix(**b, 21));
    std::vector<float> lc(V);
    ASSERT_TRUE((*c)->eval(std::span(tokens).subspan(21, 9), logits_mode::last, lc));
    EXPECT_EQ(lc, last(30));
    auto plain = context::create(**m, {40, 8, nullptr});
    ASSERT_TRUE(plain);
    const auto refused = (*plain)->copy_prefix(**b, 4);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("q8_0"), std::string::npos) << refused.error().message;
    EXPECT_EQ((*plain)->pos(), 0);
  }
  model_file narrow(small("llama", tensor_type::q8_0), "kvq8-narrow");  // head_dim 16
  auto nf = open(narrow.path);
  auto nm = model::load(nf);
  ASSERT_TRUE(nm);
  auto c = context::create(**nm, {32, 8, nullptr, {}, kv_cache_type::q8_0});
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("head_dim"), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find("16"), std::string::npos) << c.error().message;
}

// Continuous batching: three sequences in one forward pass per step — one prefilling a prompt
// while the others decode, then all decoding — get exactly the logits each gets alone (the
// mat-muls are row-independent), on one thread and on two.
TEST(ModelContext, BatchedSequencesGetTheLogitsTheyGetAlone) {
  // An MoE model too: a batch's rows are grouped by expert (one mat-mul per expert over the rows
  // routed to it), and a row's result must not depend on which other rows share its experts.
  for (const auto& cfg :
       {small("qwen3", tensor_type::f16), small("qwen3", tensor_type::q8_0),
        small_moe("qwen3moe", tensor_type::f16), small_moe("qwen3moe", tensor_type::q8_0)}) {
    SCOPED_TRACE(cfg.arch);
    model_file mf(cfg, "batch");
    auto f = open(mf.path);
    auto m = model::load(f);
    ASSERT_TRUE(m) << m.error().message;
    const auto V = static_cast<std::size_t>((*m)->params().n_vocab);
    const std::vector<std::vector<token_id>> prompts = {{1, 17, 300}, {45}, {599, 2, 88, 88, 7, 9}};
    // Each sequence alone: its prompt, then the tokens 10, 11, ... one at a time.
    std::vector<std::vector<std::vector<float>>> alone(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto c = context::create(**m, {32, 8, nullptr});
      ASSERT_TRUE(c);
      std::vector<float> l(V);
      ASSERT_TRUE((*c)->eval(prompts[i], logits_mode::last, l));
      alone[i].push_back(l);
      for (token_id t = 10; t < 14; ++t) {
        const token_id one[1] = {t};
        ASSERT_TRUE((*c)->eval(one, logits_mode::last, l));
        alone[i].push_back(l);
      }
    }
    for (int threads : {1, 2}) {
      auto pool = thread_pool::create(threads);
      ASSERT_TRUE(pool);
      auto ws = workspace::create(**m, 16, 32, threads);
      ASSERT_TRUE(ws);
      std::vector<std::unique_ptr<context>> ctx;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        auto c = context::create(**m, {32, 8, pool->get()});
        ASSERT_TRUE(c);
        ctx.push_back(std::move(*c));
      }
      std::vector<std::vector<float>> l(prompts.size(), std::vector<float>(V));
      // Step 0: sequences 0 and 1 prefill; step 1: 0 and 1 decode while 2 prefills; then all decode.
      std::vector<std::size_t> step_of(prompts.size(), 0);
      for (int round = 0; round < 6; ++round) {
        std::vector<batch_item> items;
        std::vector<std::vector<token_id>> feed(prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i) {
          if (i == 2 && round == 0) continue;
          if (step_of[i] > 4) continue;
          feed[i] = step_of[i] == 0 ? prompts[i]
                                    : std::vector<token_id>{static_cast<token_id>(9 + step_of[i])};
          items.push_back({ctx[i].get(), feed[i], l[i]});
        }
        if (items.empty()) break;
        auto r = context::eval_batch(items, **ws, pool->get());
        ASSERT_TRUE(r) << r.error().message;
        for (std::size_t i = 0; i < prompts.size(); ++i) {
          if (feed[i].empty()) continue;
          EXPECT_EQ(l[i], alone[i][step_of[i]])
              << "sequence " << i << " step " << step_of[i] << ", " << threads << " threads";
          ++step_of[i];
        }
      }
      for (std::size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(step_of[i], 5u) << i;
    }
  }
}

// Batching across pipeline shards: the first shard batches tokens into hidden rows, the second
// takes those rows and gives each sequence the logits the whole model gives it alone.
// Prefix sharing: a context that takes another's first positions (of another n_ctx, so the cache
// strides differ; 21 positions: a partial key panel) and then reads the rest gets bit for bit the
// logits of one that read everything itself. Taking more than the source holds, or from another
// model, is an error that changes nothing.
TEST(ModelContext, ACopiedPrefixGivesTheLogitsOfReadingIt) {
  model_file mf(small("qwen3", tensor_type::q8_0), "prefix");
  auto f = open(mf.path);
  auto m = model::load(f);
  ASSERT_TRUE(m) << m.error().message;
  const auto V = static_cast<std::size_t>((*m)->params().n_vocab);
  std::vector<token_id> prompt;
  for (token_id t = 0; t < 24; ++t)
    prompt.push_back((t * 37 + 5) % 500);
  auto whole = context::create(**m, {64, 8, nullptr});
  ASSERT_TRUE(whole);
  std::vector<float> want(V), got(V);
  ASSERT_TRUE((*whole)->eval(prompt, logits_mode::last, want));
  auto donor = context::create(**m, {48, 8, nullptr});
  ASSERT_TRUE(donor);
  ASSERT_TRUE((*donor)->eval(std::span(prompt).first(21), logits_mode::none, {}));
  auto c = context::create(**m, {40, 8, nullptr});
  ASSERT_TRUE(c);
  EXPECT_FALSE((*c)->copy_prefix(**donor, 22));  // the donor holds 21
  EXPECT_EQ((*c)->pos(), 0);
  ASSERT_TRUE((*c)->copy_prefix(**donor, 21));
  EXPECT_EQ((*c)->pos(), 21);
  ASSERT_TRUE((*c)->eval(std::span(prompt).subspan(21), logits_mode::last, got));
  EXPECT_EQ(got, want);
  model_file other(small("qwen3", tensor_type::q8_0), "prefix-other");
  auto of = open(other.path);
  auto om = model::load(of);
  ASSERT_TRUE(om);
  auto oc = context::create(**om, {40, 8, nullptr});
  ASSERT_TRUE(oc);
  EXPECT_FALSE((*oc)->copy_prefix(**donor, 4));
  EXPECT_EQ((*oc)->pos(), 0);
}

TEST(ModelContext, BatchedPipelineShardsGiveTheWholeModelsLogits) {
  model_file mf(small("llama", tensor_type::q8_0), "batchpp");
  auto f = open(mf.path);
  auto whole = model::load(f);
  auto a = model::load(f, {shard_spec::layers(0, 1)});
  auto b = model::load(f, {shard_spec::layers(1, -1)});
  ASSERT_TRUE(whole && a && b);
  const auto V = static_cast<std::size_t>((*whole)->params().n_vocab);
  const std::vector<std::vector<token_id>> feed = {{1, 17, 300}, {45}, {599, 2}};
  std::vector<std::vector<float>> alone;
  for (const auto& tokens : feed) {
    auto c = context::create(**whole, {16, 8, nullptr});
    ASSERT_TRUE(c);
    std::vector<float> l(V);
    ASSERT_TRUE((*c)->eval(tokens, logits_mode::last, l));
    alone.push_back(l);
  }
  auto wa = workspace::create(**a, 8, 16, 1);
  auto wb = workspace::create(**b, 8, 16, 1);
  ASSERT_TRUE(wa && wb);
  std::vector<std::unique_ptr<context>> ca, cb;
  for (std::size_t i = 0; i < feed.size(); ++i) {
    ca.push_back(std::move(*context::create(**a, {16, 8, nullptr})));
    cb.push_back(std::move(*context::create(**b, {16, 8, nullptr})));
  }
  std::vector<float> hidden(6 * 64);
  std::vector<batch_item> first, second;
  std::vector<std::vector<float>> l(feed.size(), std::vector<float>(V));
  for (std::size_t i = 0; i < feed.size(); ++i) {
    first.push_back({ca[i].get(), feed[i], {}});
    second.push_back({cb[i].get(), {}, l[i], static_cast<std::int64_t>(feed[i].size())});
  }
  auto r1 = context::eval_batch(first, **wa, nullptr, hidden);
  ASSERT_TRUE(r1) << r1.error().message;
  auto r2 = context::eval_batch(second, **wb, nullptr, hidden);
  ASSERT_TRUE(r2) << r2.error().message;
  for (std::size_t i = 0; i < feed.size(); ++i) EXPECT_EQ(l[i], alone[i]) << "sequence " << i;
  // The second shard takes rows, not tokens; it needs the hidden input.
  auto bad = context::eval_batch(std::vector<batch_item>{{cb[0].get(), feed[0], {}}}, **wb, nullptr,
                                 hidden);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("no embedding"), std::string::npos) << bad.error().message;
  auto none = context::eval_batch(std::vector<batch_item>{{cb[0].get(), {}, {}, 2}}, **wb, nullptr);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("hidden states"), std::string::npos) << none.error().message;
}

TEST(ModelContext, BatchErrorsNameTheItemAndChangeNothing) {
  model_file mf(small(), "batcherr");
  auto f = open(mf.path);
  auto m = model::load(f);
  auto other = model::load(f);
  ASSERT_TRUE(m && other);
  auto ws = workspace::create(**m, 6, 8, 1);
  ASSERT_TRUE(ws);
  auto a = context::create(**m, {8, 4, nullptr});
  auto b = context::create(**m, {4, 4, nullptr});
  auto big = context::create(**m, {16, 4, nullptr});
  auto o = context::create(**other, {8, 4, nullptr});
  ASSERT_TRUE(a && b && big && o);
  std::vector<float> la(600), lb(600);
  const std::vector<token_id> three = {1, 2, 3}, two = {4, 5}, bad = {600};
  ASSERT_TRUE(context::eval_batch(std::vector<batch_item>{{a->get(), two, la}, {b->get(), three, lb}},
                                  **ws, nullptr));
  EXPECT_EQ((*a)->pos(), 2);
  EXPECT_EQ((*b)->pos(), 3);
  auto expect_error = [&](const std::vector<batch_item>& items, std::string_view what) {
    auto r = context::eval_batch(items, **ws, nullptr);
    ASSERT_FALSE(r) << what;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
    EXPECT_EQ((*a)->pos(), 2) << what;  // nothing evaluated
    EXPECT_EQ((*b)->pos(), 3) << what;
  };
  expect_error({{a->get(), two, la}, {b->get(), two, lb}}, "KV cache full");
  expect_error({{a->get(), three, la}, {b->get(), two, {}}}, "KV cache full");
  expect_error({{a->get(), two, la}, {a->get(), two, la}}, "one context");
  expect_error({{a->get(), bad, la}}, "token id 600");
  expect_error({{a->get(), three, la}, {o->get(), two, lb}}, "another model");
  expect_error({{big->get(), two, la}}, "16 positions");
  std::vector<float> small_buf(10);
  expect_error({{a->get(), two, small_buf}}, "logits buffer");
  expect_error({}, "no sequences");
  auto w2 = workspace::create(**other, 4, 8, 1);
  ASSERT_TRUE(w2);
  auto r = context::eval_batch(std::vector<batch_item>{{a->get(), two, la}}, **w2, nullptr);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("another model"), std::string::npos) << r.error().message;
  std::vector<token_id> five = {1, 2, 3, 4, 5};
  auto c = context::create(**m, {8, 8, nullptr});
  ASSERT_TRUE(c);
  auto w4 = workspace::create(**m, 4, 8, 1);
  ASSERT_TRUE(w4);
  r = context::eval_batch(std::vector<batch_item>{{c->get(), five, {}}}, **w4, nullptr);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("5 tokens in all exceed the workspace's 4"), std::string::npos)
      << r.error().message;
  EXPECT_EQ((*c)->pos(), 0);
  EXPECT_FALSE(workspace::create(**m, 0, 8, 1));
}

// Two tensor-parallel shards (half the heads and half the FFN columns each) on two threads, their
// partial outputs added by a small in-process all-reduce, give the full model's logits (up to the
// order of the f32 additions, and for q8_0 the activation rounding that order can flip).
//
// Of an MoE model the FFN range [0, 64) / [64, 128) is experts [0, 2) / [2, 4): expert
// parallelism, each shard summing its own experts' weighted outputs.
TEST(ModelContext, TensorParallelShardsMatchTheFullModel) {
  for (auto type : {tensor_type::f32, tensor_type::q8_0}) {
    for (const char* arch : {"llama", "qwen3", "qwen3moe", "mixtral"}) {
      const bool moe = std::string_view(arch) == "qwen3moe" || std::string_view(arch) == "mixtral";
      model_file mf(moe ? small_moe(std::string_view(arch) == "mixtral" ? "llama" : arch, type)
                        : small(arch, type),
                    "tp");
      auto f = open(mf.path);
      auto full = model::load(f);
      ASSERT_TRUE(full);
      const std::vector<token_id> tokens = {1, 17, 300, 45, 599, 2, 88};
      const auto want = run_logits(**full, tokens, 64, 1);
      // Heads split on the GQA boundary (2 + 2), and across it (3 + 1: the second KV head is in
      // both slices, each computing it). The latter for f32 only: this model's 16-wide heads put
      // an odd head boundary inside a 32-element q8_0 block of attn_output's columns (real models'
      // heads are >= 64 wide).
      for (const std::int64_t cut : {2, 3}) {
      if (cut == 3 && type == tensor_type::q8_0) continue;
      SCOPED_TRACE(::testing::Message() << "heads split at " << cut);
      std::unique_ptr<model> shards[2];
      for (int i = 0; i < 2; ++i) {
        shard_spec s;
        s.head_begin = i == 0 ? 0 : cut;
        s.head_end = i == 0 ? cut : 4;
        s.ffn_begin = 64 * i;
        s.ffn_end = 64 * i + 64;
        auto m = model::load(f, {s});
        ASSERT_TRUE(m) << m.error().message;
        EXPECT_TRUE((*m)->is_tensor_parallel());
        EXPECT_EQ((*m)->local().n_head, s.head_end - s.head_begin);
        EXPECT_EQ((*m)->local().ffn, 64);
        if (moe) {
          EXPECT_EQ((*m)->local().n_expert, 2);
          EXPECT_EQ((*m)->expert_first(), 2 * i);
        }
        shards[i] = std::move(*m);
      }
      EXPECT_FALSE(context::create(*shards[0], {64, 64, nullptr}));  // no reduce function
      // A two-party all-reduce: both post their partials, both read the sum.
      std::mutex mu;
      std::condition_variable cv;
      std::span<float> posted[2];
      int arrived = 0, left = 0;
      std::uint64_t round = 0;
      auto reducer = [&](int me) {
        return [&, me](std::span<float> part) -> result<void> {
          std::unique_lock lk(mu);
          cv.wait(lk, [&] { return left == 0; });  // the previous round is fully read
          const std::uint64_t my_round = round;
          posted[me] = part;
          if (++arrived == 2) {
            std::vector<float> sum(part.size());
            for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = posted[0][i] + posted[1][i];
            std::copy(sum.begin(), sum.end(), posted[0].begin());
            std::copy(sum.begin(), sum.end(), posted[1].begin());
            arrived = 0;
            left = 2;
            ++round;
            cv.notify_all();
          } else {
            cv.wait(lk, [&] { return round != my_round; });
          }
          if (--left == 0) cv.notify_all();
          return ok();
        };
      };
      std::vector<float> got[2];
      std::thread threads[2];
      for (int i = 0; i < 2; ++i) {
        threads[i] = std::thread([&, i] {
          auto c = context::create(*shards[i], {64, 64, nullptr, reducer(i)});
          ASSERT_TRUE(c);
          got[i].resize(want.size());
          auto r = (*c)->eval(tokens, logits_mode::all, got[i]);
          EXPECT_TRUE(r) << r.error().message;
        });
      }
      for (auto& t : threads) t.join();
      EXPECT_EQ(got[0], got[1]);
      double num = 0, den = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        num += (got[0][i] - want[i]) * (got[0][i] - want[i]);
        den += want[i] * want[i];
      }
      // f32: only the order of additions differs; this random model's 16-wide heads, normed per
      // head (qwen3's q/k norms), amplify those last bits at a few positions (qwen3moe split at
      // head 3: 1.3e-5 with the blocked attention of issue 35, the rest <= 2e-6); a real error is
      // orders of magnitude larger. q8_0: those last-bit differences can flip the rounding of a
      // quantized activation (one int8 level of a block), so the bound is that of activation
      // quantization (compare_reference.py measures ~1e-2 against float64).
      EXPECT_LT(std::sqrt(num / den), type == tensor_type::f32 ? 5e-5 : 1e-2)
          << arch << " " << to_string(type);
      EXPECT_LT(shards[0]->weight_bytes_total(), (*full)->weight_bytes_total());
      }
    }
  }
}

TEST(ModelGenerator, StopsAtMaxTokensContextAndCallback) {
  model_file mf(small(), "gen");
  auto f = open(mf.path);
  auto tok = tokenizer::tokenizer::from_gguf(f);
  ASSERT_TRUE(tok) << tok.error().message;
  auto m = model::load(f);
  ASSERT_TRUE(m);
  const std::vector<token_id> prompt = {1, 50, 60};
  {
    auto c = context::create(**m, {64, 16, nullptr});
    generator g(**m, **c, &*tok, sampler_options::greedy());
    std::string text;
    auto st = g.generate(prompt, 5, [&](std::string_view p) { text += p; return true; });
    ASSERT_TRUE(st) << st.error().message;
    if (st->stop == stop_reason::max_tokens) {
      EXPECT_EQ(st->generated_tokens, 5);
    } else {
      EXPECT_EQ(st->stop, stop_reason::end_of_generation);
    }
    EXPECT_EQ(g.history().size(), prompt.size() + static_cast<std::size_t>(st->generated_tokens));
    // The last sampled token is not fed: the context holds prompt + generated - 1.
    EXPECT_EQ((*c)->pos(), static_cast<std::int64_t>(prompt.size()) + st->generated_tokens - 1);
  }
  {
    auto c = context::create(**m, {5, 16, nullptr});
    generator g(**m, **c, nullptr, sampler_options::greedy());
    auto st = g.generate(prompt, 100, {});
    ASSERT_TRUE(st);
    EXPECT_EQ(st->stop, stop_reason::context_full);
    EXPECT_EQ(st->generated_tokens, 3);
  }
  {
    auto c = context::create(**m, {64, 16, nullptr});
    generator g(**m, **c, &*tok, sampler_options::greedy());
    int pieces = 0;
    auto st = g.generate(prompt, 50, [&](std::string_view) { return ++pieces < 2; });
    ASSERT_TRUE(st);
    if (st->stop != stop_reason::end_of_generation) {
      EXPECT_EQ(st->stop, stop_reason::cancelled);
    }
  }
  {
    auto c = context::create(**m, {64, 16, nullptr});
    generator g(**m, **c, nullptr, sampler_options::greedy());
    EXPECT_FALSE(g.step());  // nothing prefilled
  }
}

TEST(ModelGenerator, SeededSamplingIsDeterministic) {
  model_file mf(small(), "seed");
  auto f = open(mf.path);
  auto m = model::load(f);
  ASSERT_TRUE(m);
  auto run = [&](std::uint64_t seed) {
    sampler_options o;
    o.temperature = 1.5f;
    o.top_k = 0;
    o.top_p = 1.0f;
    o.min_p = 0.0f;
    o.seed = seed;
    auto c = context::create(**m, {64, 16, nullptr});
    generator g(**m, **c, nullptr, o);
    EXPECT_TRUE(g.generate(std::vector<token_id>{1, 2, 3}, 24, {}));
    return g.history();
  };
  const auto a = run(7);
  EXPECT_EQ(run(7), a);
  EXPECT_NE(run(8), a);
}

}  // namespace
}  // namespace tessera::inference::model
