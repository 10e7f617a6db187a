// Synthetic models: shape errors, layout and metadata as llama.cpp names them, determinism, weight
// statistics after dequantization, and a tokenizer that loads from the written file.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "inference/gguf/gguf.hpp"
#include "inference/gguf/synth.hpp"
#include "inference/kernels/quant.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::inference::gguf {
namespace {

std::string synth_path(std::string_view tag) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("tessera_synth_{}_{}.gguf", tag, ::getpid()))
      .string();
}

synth_config small(std::string arch, tensor_type type) {
  synth_config c;
  c.arch = std::move(arch);
  c.dim = 256;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 352;  // not a multiple of 256: K-quants fall back to q8_0 for ffn_down
  c.vocab = 600;
  c.type = type;
  return c;
}

TEST(Synth, RejectsBadShapes) {
  auto c = small("llama", tensor_type::f32);
  c.heads = 3;
  auto r = validate(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "--heads 3 does not divide --dim 256");
  c = small("llama", tensor_type::f32);
  c.kv_heads = 3;
  EXPECT_FALSE(validate(c));
  c = small("gpt9", tensor_type::f32);
  EXPECT_NE(validate(c).error().message.find("unknown architecture 'gpt9'"), std::string::npos);
  c = small("llama", tensor_type::q8_0);
  c.ffn = 100;
  EXPECT_NE(validate(c).error().message.find("--ffn 100 is not a multiple of 32"), std::string::npos);
  c = small("llama", tensor_type::f32);
  c.vocab = 10;
  EXPECT_FALSE(validate(c));
  c = small("llama", tensor_type::f32);
  c.layers = 100000;
  EXPECT_FALSE(validate(c));
  EXPECT_FALSE(synth_preset("huge"));
  auto tiny = synth_preset("tiny");
  ASSERT_TRUE(tiny);
  EXPECT_TRUE(validate(*tiny));
  EXPECT_FALSE(write_synthetic_model(small("llama", tensor_type::f32), "/nonexistent/dir/m.gguf"));
}

TEST(Synth, PresetsHaveTheAdvertisedSize) {
  // Parameter counts from the shapes alone (writing the large preset is a benchmark, not a test).
  auto count = [](const synth_config& c) {
    std::uint64_t hd = c.dim / c.heads, layer = 0;
    layer += std::uint64_t{c.dim} * c.dim * 2 + std::uint64_t{c.dim} * c.kv_heads * hd * 2;
    layer += std::uint64_t{c.dim} * c.ffn * 3 + 2 * c.dim;
    return std::uint64_t{c.vocab} * c.dim * 2 + c.layers * layer + c.dim;
  };
  EXPECT_NEAR(static_cast<double>(count(*synth_preset("tiny"))) / 1e6, 56.4, 0.1);
  EXPECT_NEAR(static_cast<double>(count(*synth_preset("large"))) / 1e6, 336.1, 0.1);
}

TEST(Synth, LlamaLayoutMetadataAndTokenizer) {
  auto path = synth_path("llama");
  auto c = small("llama", tensor_type::q4_k);
  auto s = write_synthetic_model(c, path);
  ASSERT_TRUE(s) << s.error().message;
  auto f = file::open(path);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  EXPECT_EQ(*f->get_uint("llama.embedding_length"), 256u);
  EXPECT_EQ(*f->get_uint("llama.block_count"), 2u);
  EXPECT_EQ(*f->get_uint("llama.feed_forward_length"), 352u);
  EXPECT_EQ(*f->get_uint("llama.attention.head_count"), 4u);
  EXPECT_EQ(*f->get_uint("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(*f->get_uint("llama.context_length"), 2048u);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(*f->get_float("llama.rope.freq_base"), 10000.0);
  auto t = [&](const char* name) { return f->find_tensor(name); };
  ASSERT_NE(t("token_embd.weight"), nullptr);
  EXPECT_EQ(t("token_embd.weight")->dims, (std::vector<std::uint64_t>{256, 600}));
  EXPECT_EQ(t("blk.1.attn_q.weight")->dims, (std::vector<std::uint64_t>{256, 256}));
  EXPECT_EQ(t("blk.1.attn_k.weight")->dims, (std::vector<std::uint64_t>{256, 128}));
  EXPECT_EQ(t("blk.1.attn_v.weight")->dims, (std::vector<std::uint64_t>{256, 128}));
  EXPECT_EQ(t("blk.1.attn_output.weight")->dims, (std::vector<std::uint64_t>{256, 256}));
  EXPECT_EQ(t("blk.0.ffn_gate.weight")->dims, (std::vector<std::uint64_t>{256, 352}));
  EXPECT_EQ(t("blk.0.ffn_down.weight")->dims, (std::vector<std::uint64_t>{352, 256}));
  EXPECT_EQ(t("blk.0.ffn_down.weight")->type, tensor_type::q8_0);  // 352 % 256 != 0
  EXPECT_EQ(t("blk.0.ffn_up.weight")->type, tensor_type::q4_k);
  EXPECT_EQ(t("blk.0.attn_norm.weight")->type, tensor_type::f32);
  EXPECT_EQ(t("output_norm.weight")->type, tensor_type::f32);
  ASSERT_NE(t("output.weight"), nullptr);
  EXPECT_EQ(t("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_EQ(f->tensors().size(), 1u + 2 * 9 + 2);
  auto tk = tokenizer::tokenizer::from_gguf(*f);
  ASSERT_TRUE(tk) << tk.error().message;
  EXPECT_EQ(tk->size(), 600u);
  EXPECT_EQ(tk->kind(), tokenizer::model_kind::spm);
  EXPECT_EQ(tk->decode(tk->encode("Once upon a time, 42 cats.")), "Once upon a time, 42 cats.");
  auto info = summarize_model(path);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->params, s->params);
  EXPECT_EQ(info->types.at("q8_0").first, 2u);
  EXPECT_EQ(info->chat_template, "jinja");  // the file's own template, rendered
  EXPECT_NE(to_json(*info).find("\"architecture\": \"llama\""), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Synth, Qwen3HasQkNormsTiedOutputAndBpe) {
  auto path = synth_path("qwen");
  auto c = small("qwen3", tensor_type::bf16);
  c.tied_embeddings = true;
  ASSERT_TRUE(write_synthetic_model(c, path));
  auto f = file::open(path, {load_mode::anonymous});
  ASSERT_TRUE(f);
  EXPECT_EQ(*f->get_uint("qwen3.attention.key_length"), 64u);
  EXPECT_EQ(*f->get_float("qwen3.rope.freq_base"), 1000000.0);
  ASSERT_NE(f->find_tensor("blk.1.attn_q_norm.weight"), nullptr);
  EXPECT_EQ(f->find_tensor("blk.1.attn_k_norm.weight")->dims, (std::vector<std::uint64_t>{64}));
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  auto tk = tokenizer::tokenizer::from_gguf(*f);
  ASSERT_TRUE(tk) << tk.error().message;
  EXPECT_EQ(tk->kind(), tokenizer::model_kind::bpe);
  EXPECT_EQ(tk->decode(tk->encode("Hello, wörld 123!")), "Hello, wörld 123!");
  std::filesystem::remove(path);
}

std::vector<float> dequant(const file& f, const tensor_info& t) {
  auto d = f.data(t);
  std::vector<float> out(static_cast<std::size_t>(t.elements));
  EXPECT_TRUE(dequantize_row(t.type, d->data(), out.data(), static_cast<std::int64_t>(t.elements)));
  return out;
}

TEST(Synth, DeterministicAndScaled) {
  auto p1 = synth_path("d1"), p2 = synth_path("d2"), p3 = synth_path("d3");
  auto c = small("llama", tensor_type::f32);
  ASSERT_TRUE(write_synthetic_model(c, p1));
  ASSERT_TRUE(write_synthetic_model(c, p2));
  c.seed = 2;
  ASSERT_TRUE(write_synthetic_model(c, p3));
  auto f1 = file::open(p1), f2 = file::open(p2), f3 = file::open(p3);
  ASSERT_TRUE(f1 && f2 && f3);
  for (const auto& t : f1->tensors()) {
    auto a = *f1->data(t);
    auto b = *f2->data(*f2->find_tensor(t.name));
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << t.name;
  }
  const auto* q1 = f1->find_tensor("blk.0.attn_q.weight");
  auto a = *f1->data(*q1);
  auto b = *f3->data(*f3->find_tensor("blk.0.attn_q.weight"));
  EXPECT_FALSE(std::equal(a.begin(), a.end(), b.begin()));
  // Weight std ~ 1/sqrt(fan_in), mean ~ 0; norm weights ~ 1.
  for (const char* name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"}) {
    const auto* t = f1->find_tensor(name);
    auto v = dequant(*f1, *t);
    double sum = 0, sq = 0;
    for (float x : v) {
      sum += x;
      sq += static_cast<double>(x) * x;
    }
    double mean = sum / static_cast<double>(v.size());
    double sd = std::sqrt(sq / static_cast<double>(v.size()) - mean * mean);
    double want = std::string(name) == "token_embd.weight" ? 1.0 : 1.0 / std::sqrt(static_cast<double>(t->dims[0]));
    EXPECT_NEAR(sd / want, 1.0, 0.03) << name;
    EXPECT_NEAR(mean / want, 0.0, 0.03) << name;
  }
  auto n = dequant(*f1, *f1->find_tensor("output_norm.weight"));
  for (float x : n) {
    EXPECT_GE(x, 0.9f);
    EXPECT_LE(x, 1.1f);
  }
  for (auto& p : {p1, p2, p3}) std::filesystem::remove(p);
}

TEST(Synth, EveryTypeWritesAndDequantizesNearF32) {
  auto pf = synth_path("ref");
  auto c = small("llama", tensor_type::f32);
  ASSERT_TRUE(write_synthetic_model(c, pf));
  auto ref = file::open(pf);
  ASSERT_TRUE(ref);
  const auto* rq = ref->find_tensor("blk.0.attn_v.weight");
  auto rv = dequant(*ref, *rq);
  for (auto type : {tensor_type::f16, tensor_type::bf16, tensor_type::q8_0, tensor_type::q4_0,
                    tensor_type::q4_k, tensor_type::q6_k}) {
    auto p = synth_path(std::string(to_string(type)));
    c.type = type;
    ASSERT_TRUE(write_synthetic_model(c, p)) << to_string(type);
    auto f = file::open(p);
    ASSERT_TRUE(f);
    const auto* t = f->find_tensor("blk.0.attn_v.weight");
    EXPECT_EQ(t->type, type);
    auto v = dequant(*f, *t);
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      err += (v[i] - rv[i]) * (v[i] - rv[i]);
      norm += rv[i] * rv[i];
    }
    double rel = std::sqrt(err / norm);
    // Relative RMS error of each format on Gaussian weights (4-bit formats ~10%).
    EXPECT_LT(rel, type == tensor_type::q4_0 || type == tensor_type::q4_k ? 0.15 : 0.03)
        << to_string(type);
    EXPECT_GT(rel, 0.0) << to_string(type);
    std::filesystem::remove(p);
  }
  std::filesystem::remove(pf);
}

}  // namespace
}  // namespace tessera::inference::gguf
