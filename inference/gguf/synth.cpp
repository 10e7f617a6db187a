#include "inference/gguf/synth.hpp"

#include <sys/stat.h>

#include <cmath>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "inference/gguf/writer.hpp"
#include "inference/kernels/quant.hpp"
#include "inference/tokenizer/chat.hpp"
#include "inference/tokenizer/synth_vocab.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::inference::gguf {

namespace {

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// wyrand: small, fast, good enough statistically for weights.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    s += 0xa0761d6478bd642full;
    __uint128_t t = static_cast<__uint128_t>(s) * (s ^ 0xe7037ed1a0b428dbull);
    return static_cast<std::uint64_t>(t >> 64) ^ static_cast<std::uint64_t>(t);
  }
  // Irwin-Hall with four 16-bit uniforms: mean 0, std 1, range about +-3.46.
  float normal() {
    std::uint64_t r = next();
    std::uint64_t sum = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    return static_cast<float>((static_cast<double>(sum) - 131070.0) * (1.0 / 37837.2));
  }
  float uniform() {  // [-1, 1)
    return static_cast<float>(static_cast<double>(next() >> 11) * 0x1p-52 - 1.0);
  }
};

enum class init { normal, norm_weight };

struct tensor_plan {
  std::string name;
  tensor_type type;
  std::uint64_t cols, rows;  // dims {cols, rows}; rows == 0 for 1-D
  std::uint64_t depth = 0;   // dims {cols, rows, depth} (stacked experts); 0 for 1-D and 2-D
  init how;
  float scale;
};

std::uint32_t file_type_of(tensor_type t) {
  switch (t) {  // llama_ftype numbers
    case tensor_type::f32: return 0;
    case tensor_type::f16: return 1;
    case tensor_type::q4_0: return 2;
    case tensor_type::q8_0: return 7;
    case tensor_type::q4_k: return 15;  // Q4_K_M
    case tensor_type::q6_k: return 18;
    case tensor_type::bf16: return 32;
  }
  return 0;
}

result<void> fill_tensor(const tensor_plan& p, std::uint64_t seed, std::span<std::byte> out) {
  const std::uint64_t rows = (p.rows ? p.rows : 1) * (p.depth ? p.depth : 1);
  const std::uint64_t base = splitmix(seed ^ fnv1a(p.name));
  const std::size_t row_size = out.size() / rows;
  auto work = [&](std::uint64_t r0, std::uint64_t r1, result<void>* status) {
    std::vector<float> row(static_cast<std::size_t>(p.cols));
    for (std::uint64_t r = r0; r < r1; ++r) {
      rng g{splitmix(base + r)};
      if (p.how == init::norm_weight) {
        for (auto& v : row) v = 1.0f + 0.1f * g.uniform();
      } else {
        for (auto& v : row) v = p.scale * g.normal();
      }
      auto q = quantize_row(p.type, row.data(), out.data() + r * row_size,
                            static_cast<std::int64_t>(p.cols));
      if (!q) {
        *status = std::move(q);
        return;
      }
    }
  };
  result<void> s0, s1;
  if (rows >= 64 && rows * p.cols >= (1u << 20)) {
    // Two halves in parallel: rows are independent (seeded per row), so the bytes do not change.
    std::uint64_t mid = rows / 2;
    std::thread t([&] { work(mid, rows, &s1); });
    work(0, mid, &s0);
    t.join();
  } else {
    work(0, rows, &s0);
  }
  if (!s0) return s0;
  return s1;
}

}  // namespace

result<synth_config> synth_preset(std::string_view preset, std::string_view arch) {
  synth_config c;
  c.arch = std::string(arch);
  if (preset == "tiny") {
    c.dim = 512, c.layers = 8, c.heads = 8, c.kv_heads = 4, c.ffn = 1408, c.vocab = 32000;
    if (c.arch == "qwen3moe") c.experts = 8, c.experts_used = 2, c.expert_ffn = 512;
  } else if (preset == "large") {
    c.dim = 1024, c.layers = 24, c.heads = 16, c.kv_heads = 4, c.ffn = 2816, c.vocab = 32000;
    if (c.arch == "qwen3moe") c.experts = 8, c.experts_used = 2, c.expert_ffn = 1024;
  } else if (preset == "moe") {
    // Shaped like Qwen3-30B-A3B scaled down (128 experts of 768, 8 used, ~11% active): 48
    // experts of 512, 4 used.
    if (c.arch == "qwen3") c.arch = "qwen3moe";
    c.dim = 1024, c.layers = 16, c.heads = 16, c.kv_heads = 4, c.ffn = 512, c.vocab = 32000;
    c.experts = 48, c.experts_used = 4, c.expert_ffn = 512;
  } else {
    return make_error(errc::invalid_argument, "unknown preset '{}' (tiny, large, moe)", preset);
  }
  return c;
}

result<void> validate(const synth_config& c) {
  if (c.chat_template.size() > (1u << 20))
    return make_error(errc::invalid_argument, "the chat template has {} bytes, more than 1 MiB",
                      c.chat_template.size());
  if (c.arch != "llama" && c.arch != "qwen3" && c.arch != "qwen3moe")
    return make_error(errc::invalid_argument, "unknown architecture '{}' (llama, qwen3, qwen3moe)",
                      c.arch);
  if (c.arch == "qwen3moe" && c.experts == 0)
    return make_error(errc::invalid_argument, "qwen3moe is a mixture of experts: give --experts");
  if (c.arch == "qwen3" && c.experts > 0)
    return make_error(errc::invalid_argument,
                      "qwen3 has a dense FFN; experts need --arch qwen3moe (or llama, Mixtral's "
                      "layout)");
  if (c.experts > 0) {
    if (c.experts > 256)
      return make_error(errc::invalid_argument, "--experts {} is outside [1, 256]", c.experts);
    if (c.experts_used < 1 || c.experts_used > c.experts)
      return make_error(errc::invalid_argument, "--experts-used {} is outside [1, --experts {}]",
                        c.experts_used, c.experts);
    if (c.expert_ffn < 32 || c.expert_ffn > 65536)
      return make_error(errc::invalid_argument, "--expert-ffn {} is outside [32, 65536]",
                        c.expert_ffn);
  }
  auto bound = [](std::string_view what, std::uint64_t v, std::uint64_t lo,
                  std::uint64_t hi) -> result<void> {
    if (v < lo || v > hi)
      return make_error(errc::invalid_argument, "{} {} is outside [{}, {}]", what, v, lo, hi);
    return ok();
  };
  TESSERA_TRY(bound("--dim", c.dim, 32, 16384));
  TESSERA_TRY(bound("--layers", c.layers, 1, 256));
  TESSERA_TRY(bound("--heads", c.heads, 1, 256));
  TESSERA_TRY(bound("--kv-heads", c.kv_heads, 1, 256));
  TESSERA_TRY(bound("--ffn", c.ffn, 32, 65536));
  TESSERA_TRY(bound("--vocab", c.vocab, tokenizer::min_synth_vocab, tokenizer::max_synth_vocab));
  TESSERA_TRY(bound("context length", c.context, 16, 1u << 20));
  if (c.dim % c.heads != 0)
    return make_error(errc::invalid_argument, "--heads {} does not divide --dim {}", c.heads, c.dim);
  if (c.heads % c.kv_heads != 0)
    return make_error(errc::invalid_argument, "--kv-heads {} does not divide --heads {}", c.kv_heads,
                      c.heads);
  if ((c.dim / c.heads) % 2 != 0)
    return make_error(errc::invalid_argument, "head dimension {} is odd (RoPE rotates pairs)",
                      c.dim / c.heads);
  const auto be = static_cast<std::uint32_t>(geometry(c.type).block_elems);
  // K-quant rows that do not fit fall back to q8_0, whose block (32) must still divide them.
  const std::uint32_t need = be == 256 ? 32 : be;
  for (auto [what, v] : {std::pair{"--dim", c.dim}, {"--ffn", c.experts ? c.expert_ffn : c.ffn}}) {
    if (v % need != 0)
      return make_error(errc::invalid_argument, "{} {} is not a multiple of {} ({} blocks)", what, v,
                        need, to_string(c.type));
  }
  if (c.type != tensor_type::f32 && c.type != tensor_type::f16 && c.type != tensor_type::bf16 &&
      c.dim % be != 0)
    return make_error(errc::invalid_argument, "--dim {} is not a multiple of the {} block {}", c.dim,
                      to_string(c.type), be);
  return ok();
}

result<synth_summary> write_synthetic_model(const synth_config& c, const std::string& path) {
  TESSERA_TRY(validate(c));
  const bool qwen = c.arch == "qwen3" || c.arch == "qwen3moe";
  const bool moe = c.experts > 0;
  const std::string a = c.arch;
  const std::uint32_t head_dim = c.dim / c.heads;
  const std::uint64_t q_dim = std::uint64_t{c.heads} * head_dim;
  const std::uint64_t kv_dim = std::uint64_t{c.kv_heads} * head_dim;

  auto vocab = qwen ? tokenizer::synth_bpe_vocab(c.vocab) : tokenizer::synth_spm_vocab(c.vocab);
  if (!vocab) return std::move(vocab).error();

  writer w;
  w.set("general.architecture", value::str(a));
  w.set("general.name", value::str(c.name.empty()
                                       ? fmt::format("tessera-synth-{}-d{}-l{}-{}", a, c.dim,
                                                     c.layers, to_string(c.type))
                                       : c.name));
  w.set("general.file_type", value::u32(file_type_of(c.type)));
  w.set("general.quantization_version", value::u32(2));
  w.set("tessera.synth.seed", value::u64(c.seed));
  w.set(a + ".context_length", value::u32(c.context));
  w.set(a + ".embedding_length", value::u32(c.dim));
  w.set(a + ".block_count", value::u32(c.layers));
  w.set(a + ".feed_forward_length", value::u32(moe ? c.expert_ffn : c.ffn));
  if (moe) {
    w.set(a + ".expert_count", value::u32(c.experts));
    w.set(a + ".expert_used_count", value::u32(c.experts_used));
    if (a == "qwen3moe") w.set(a + ".expert_feed_forward_length", value::u32(c.expert_ffn));
  }
  w.set(a + ".attention.head_count", value::u32(c.heads));
  w.set(a + ".attention.head_count_kv", value::u32(c.kv_heads));
  w.set(a + ".attention.layer_norm_rms_epsilon", value::f32(qwen ? 1e-6f : 1e-5f));
  w.set(a + ".rope.freq_base", value::f32(qwen ? 1000000.0f : 10000.0f));
  w.set(a + ".rope.dimension_count", value::u32(head_dim));
  w.set(a + ".attention.key_length", value::u32(head_dim));
  w.set(a + ".attention.value_length", value::u32(head_dim));
  w.set(a + ".vocab_size", value::u32(c.vocab));

  auto& v = *vocab;
  w.set("tokenizer.ggml.model", value::str(qwen ? "gpt2" : "llama"));
  if (qwen) w.set("tokenizer.ggml.pre", value::str("qwen2"));
  w.set("tokenizer.ggml.tokens", value::arr(string_array(v.tokens)));
  if (!v.scores.empty()) w.set("tokenizer.ggml.scores", value::arr(f32_array(v.scores)));
  std::vector<std::int32_t> types;
  types.reserve(v.types.size());
  for (auto t : v.types) types.push_back(static_cast<std::int32_t>(t));
  w.set("tokenizer.ggml.token_type", value::arr(i32_array(std::move(types))));
  if (qwen) w.set("tokenizer.ggml.merges", value::arr(string_array(v.merges)));
  w.set("tokenizer.ggml.bos_token_id", value::u32(static_cast<std::uint32_t>(v.bos)));
  w.set("tokenizer.ggml.eos_token_id", value::u32(static_cast<std::uint32_t>(v.eos)));
  if (v.unk >= 0) w.set("tokenizer.ggml.unknown_token_id", value::u32(static_cast<std::uint32_t>(v.unk)));
  if (v.pad >= 0) w.set("tokenizer.ggml.padding_token_id", value::u32(static_cast<std::uint32_t>(v.pad)));
  w.set("tokenizer.ggml.add_bos_token", value::boolean(v.add_bos));
  w.set("tokenizer.ggml.add_eos_token", value::boolean(false));
  if (!qwen) w.set("tokenizer.ggml.add_space_prefix", value::boolean(true));
  w.set("tokenizer.chat_template",
        value::str(
            !c.chat_template.empty() ? c.chat_template
            : qwen ? "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                     "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                     "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
                   // Mistral's published v0.1 form: alternating turns, no system role (a
                   // system text is folded into the first user turn by the caller).
                   : "{{ bos_token }}{% for message in messages %}{% if (message['role'] == "
                     "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
                     "roles must alternate user/assistant/user/assistant/...') }}{% endif "
                     "%}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
                     "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
                     "message['content'] + eos_token }}{% else %}{{ raise_exception('Only "
                     "user and assistant roles are supported!') }}{% endif %}{% endfor %}"));

  std::vector<tensor_plan> plan;
  auto weight = [&](std::string name, std::uint64_t cols, std::uint64_t rows, float scale) {
    tensor_type t = c.type;
    if (geometry(t).block_elems == 256 && cols % 256 != 0) t = tensor_type::q8_0;
    plan.push_back({std::move(name), t, cols, rows, 0, init::normal, scale});
  };
  auto experts = [&](std::string name, std::uint64_t cols, std::uint64_t rows, float scale) {
    tensor_type t = c.type;
    if (geometry(t).block_elems == 256 && cols % 256 != 0) t = tensor_type::q8_0;
    plan.push_back({std::move(name), t, cols, rows, c.experts, init::normal, scale});
  };
  auto norm = [&](std::string name, std::uint64_t n) {
    plan.push_back({std::move(name), tensor_type::f32, n, 0, 0, init::norm_weight, 1.0f});
  };
  auto inv_sqrt = [](std::uint64_t n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); };
  weight("token_embd.weight", c.dim, c.vocab, 1.0f);
  for (std::uint32_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    norm(p + "attn_norm.weight", c.dim);
    weight(p + "attn_q.weight", c.dim, q_dim, inv_sqrt(c.dim));
    weight(p + "attn_k.weight", c.dim, kv_dim, inv_sqrt(c.dim));
    weight(p + "attn_v.weight", c.dim, kv_dim, inv_sqrt(c.dim));
    weight(p + "attn_output.weight", q_dim, c.dim, inv_sqrt(q_dim));
    if (qwen) {
      norm(p + "attn_q_norm.weight", head_dim);
      norm(p + "attn_k_norm.weight", head_dim);
    }
    norm(p + "ffn_norm.weight", c.dim);
    if (moe) {
      // The router stays F32, as llama.cpp's quantizer leaves ffn_gate_inp: it is small and its
      // rounding would move tokens between experts.
      plan.push_back({p + "ffn_gate_inp.weight", tensor_type::f32, c.dim, c.experts, 0,
                      init::normal, inv_sqrt(c.dim)});
      experts(p + "ffn_gate_exps.weight", c.dim, c.expert_ffn, inv_sqrt(c.dim));
      experts(p + "ffn_up_exps.weight", c.dim, c.expert_ffn, inv_sqrt(c.dim));
      experts(p + "ffn_down_exps.weight", c.expert_ffn, c.dim, inv_sqrt(c.expert_ffn));
    } else {
      weight(p + "ffn_gate.weight", c.dim, c.ffn, inv_sqrt(c.dim));
      weight(p + "ffn_up.weight", c.dim, c.ffn, inv_sqrt(c.dim));
      weight(p + "ffn_down.weight", c.ffn, c.dim, inv_sqrt(c.ffn));
    }
  }
  norm("output_norm.weight", c.dim);
  if (!c.tied_embeddings) weight("output.weight", c.dim, c.vocab, inv_sqrt(c.dim));

  synth_summary s;
  for (const auto& p : plan) {
    std::vector<std::uint64_t> dims = {p.cols};
    if (p.rows) dims.push_back(p.rows);
    if (p.depth) dims.push_back(p.depth);
    s.params += p.cols * (p.rows ? p.rows : 1) * (p.depth ? p.depth : 1);
    const std::uint64_t seed = c.seed;
    tensor_plan copy = p;
    TESSERA_TRY(w.add_tensor(p.name, p.type, std::move(dims),
                             [copy, seed](std::span<std::byte> out) { return fill_tensor(copy, seed, out); }));
  }
  s.tensors = plan.size();
  TESSERA_TRY(w.write(path));
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) s.file_bytes = static_cast<std::uint64_t>(st.st_size);
  return s;
}

// ---------------------------------------------------------------------------------------------

result<model_summary> summarize_model(const std::string& path) {
  auto f = file::open(path, {load_mode::headers_only});
  if (!f) return std::move(f).error();
  model_summary s;
  s.file = path;
  s.file_bytes = f->file_size();
  s.version = f->version();
  auto arch = f->get_string("general.architecture");
  if (!arch) return std::move(arch).error();
  s.architecture = std::string(*arch);
  if (auto n = f->get_string("general.name")) s.name = std::string(*n);
  for (const char* key :
       {"context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length", "vocab_size",
        "expert_count", "expert_used_count", "expert_feed_forward_length"}) {
    if (auto v = f->get_uint(s.architecture + "." + key)) s.dims[key] = *v;
  }
  for (const auto& t : f->tensors()) {
    s.params += t.elements;
    auto& e = s.types[std::string(to_string(t.type))];
    e.first += 1;
    e.second += t.size;
  }
  s.tensor_count = f->tensors().size();
  s.tokenizer = "none";
  if (f->find_value("tokenizer.ggml.model")) {
    auto tk = tokenizer::tokenizer::from_gguf(*f);
    if (!tk) return std::move(tk).error();
    s.vocab = tk->size();
    s.tokenizer = std::string(tokenizer::to_string(tk->kind()));
    if (tk->kind() == tokenizer::model_kind::bpe) {
      auto pre = tk->data().pre;
      s.tokenizer += pre == tokenizer::pre_split::llama3  ? " (llama3 split)"
                     : pre == tokenizer::pre_split::qwen2 ? " (qwen2 split)"
                                                          : " (gpt2 split)";
    }
    // "jinja" when the file's own template is used, else the built-in family (and why).
    s.chat_template = tokenizer::chat_template_for(*f, *tk).describe();
  }
  return s;
}

std::string to_text(const model_summary& s) {
  std::string out;
  out += fmt::format("file          {} ({}, GGUF v{})\n", s.file, human_bytes(s.file_bytes), s.version);
  out += fmt::format("architecture  {}\n", s.architecture);
  if (!s.name.empty()) out += fmt::format("name          {}\n", s.name);
  for (const auto& [k, v] : s.dims)
    out += fmt::format("{:<28}{}\n", k, v);
  out += fmt::format("parameters    {} ({:.1f}M)\n", s.params, static_cast<double>(s.params) / 1e6);
  out += fmt::format("tensors       {}\n", s.tensor_count);
  for (const auto& [t, e] : s.types)
    out += fmt::format("  {:<6} {:>5} tensors {:>10}\n", t, e.first, human_bytes(e.second));
  out += fmt::format("tokenizer     {}{}\n", s.tokenizer,
                     s.vocab ? fmt::format(", {} tokens", s.vocab) : std::string());
  if (!s.chat_template.empty()) out += fmt::format("chat template {}\n", s.chat_template);
  return out;
}

std::string to_json(const model_summary& s) {
  nlohmann::json j;
  j["file"] = s.file;
  j["file_bytes"] = s.file_bytes;
  j["gguf_version"] = s.version;
  j["architecture"] = s.architecture;
  j["name"] = s.name;
  j["dims"] = s.dims;
  j["params"] = s.params;
  j["tensor_count"] = s.tensor_count;
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [t, e] : s.types) types[t] = {{"tensors", e.first}, {"bytes", e.second}};
  j["types"] = types;
  j["tokenizer"] = s.tokenizer;
  j["vocab"] = s.vocab;
  j["chat_template"] = s.chat_template;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tessera::inference::gguf
