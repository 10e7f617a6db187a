#include "inference/model/model.hpp"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "inference/kernels/attention.hpp"
#include "inference/kernels/cpu.hpp"
#include "inference/kernels/quant.hpp"

namespace tessera::inference::model {

namespace {

constexpr std::int64_t max_reasonable = std::int64_t{1} << 24;

result<std::int64_t> get_dim(const gguf::file& f, const std::string& key,
                             std::optional<std::int64_t> fallback = std::nullopt) {
  if (f.find_value(key) == nullptr) {
    if (fallback) return *fallback;
    return make_error(errc::not_found, "{}: metadata key {} is missing (required by the model)",
                      f.name(), key);
  }
  auto v = f.get_uint(key);
  if (!v) return std::move(v).error();
  if (*v == 0 || *v > static_cast<std::uint64_t>(max_reasonable))
    return make_error(errc::corrupt, "{}: metadata {} = {} is outside [1, {}]", f.name(), key, *v,
                      max_reasonable);
  return static_cast<std::int64_t>(*v);
}

result<float> get_real(const gguf::file& f, const std::string& key, float fallback) {
  if (f.find_value(key) == nullptr) return fallback;
  auto v = f.get_float(key);
  if (!v) return std::move(v).error();
  if (!std::isfinite(*v) || *v <= 0)
    return make_error(errc::corrupt, "{}: metadata {} = {} must be a positive number", f.name(),
                      key, *v);
  return static_cast<float>(*v);
}

// Where one tensor goes in the arena and how it is stored there.
struct placement {
  const gguf::tensor_info* info = nullptr;
  std::uint64_t first_row = 0;  // row slice (tensor parallelism), or the element slice of a vector
  std::uint64_t rows = 0;
  std::int64_t first_col = 0;   // column slice (tensor parallelism); cols = 0: all
  std::int64_t cols = 0;
  bool as_f32 = false;      // norms/biases: converted to f32
  std::size_t offset = 0;   // in the arena
  std::size_t bytes = 0;    // in the arena
  // Interleaved (an MoE layer's gate and up experts): rows copied `chunk_rows` at a time, chunk k
  // at offset + k * chunk_stride. 0: one block.
  std::uint64_t chunk_rows = 0;
  std::size_t chunk_stride = 0;
};

}  // namespace

std::string_view to_string(architecture a) noexcept {
  switch (a) {
    case architecture::llama: return "llama";
    case architecture::qwen2: return "qwen2";
    case architecture::qwen3: return "qwen3";
    case architecture::qwen3moe:
      return "qwen3moe";
  }
  return "?";
}

result<hparams> read_hparams(const gguf::file& f) {
  hparams hp;
  auto arch_name = f.get_string("general.architecture");
  if (!arch_name) return std::move(arch_name).error();
  const std::string arch(*arch_name);
  if (arch == "llama") {
    hp.arch = architecture::llama;
  } else if (arch == "qwen2") {
    hp.arch = architecture::qwen2;
  } else if (arch == "qwen3") {
    hp.arch = architecture::qwen3;
  } else if (arch == "qwen3moe") {
    hp.arch = architecture::qwen3moe;
  } else {
    return make_error(errc::unsupported,
                      "{}: architecture '{}' is not supported (supported: llama, qwen2, qwen3, "
                      "qwen3moe)",
                      f.name(), arch);
  }
  const std::string p = arch + ".";
  auto dim = get_dim(f, p + "embedding_length");
  if (!dim) return std::move(dim).error();
  auto layers = get_dim(f, p + "block_count");
  if (!layers) return std::move(layers).error();
  auto heads = get_dim(f, p + "attention.head_count");
  if (!heads) return std::move(heads).error();
  auto kv = get_dim(f, p + "attention.head_count_kv", *heads);
  if (!kv) return std::move(kv).error();
  // Mixture of experts: qwen3moe always, llama when expert_count is set (Mixtral).
  const bool moe = hp.arch == architecture::qwen3moe ||
                   (hp.arch == architecture::llama && f.find_value(p + "expert_count") != nullptr);
  std::int64_t n_expert = 0, n_used = 0;
  if (moe) {
    auto e = get_dim(f, p + "expert_count");
    if (!e) return std::move(e).error();
    auto u = get_dim(f, p + "expert_used_count");
    if (!u) return std::move(u).error();
    if (*e > 1024 || *u > *e)
      return make_error(errc::unsupported,
                        "{}: {}expert_count {} / expert_used_count {}: at most 1024 experts, and "
                        "no more used than there are",
                        f.name(), p, *e, *u);
    if (f.find_value(p + "expert_shared_count") != nullptr &&
        f.get_uint(p + "expert_shared_count").value_or(0) != 0)
      return make_error(errc::unsupported,
                        "{}: shared experts ({}expert_shared_count) are not "
                        "supported",
                        f.name(), p);
    // llama.cpp's expert_gating_func: 1 = softmax (the only router this engine runs), 2 = sigmoid.
    if (f.find_value(p + "expert_gating_func") != nullptr &&
        f.get_uint(p + "expert_gating_func").value_or(1) != 1)
      return make_error(errc::unsupported,
                        "{}: {}expert_gating_func {} is not supported (only softmax routing)",
                        f.name(), p, f.get_uint(p + "expert_gating_func").value_or(0));
    n_expert = *e;
    n_used = *u;
  }
  // A qwen3moe file's feed_forward_length is the dense FFN some variants have; its experts' width
  // is expert_feed_forward_length. Mixtral's experts have feed_forward_length. (An MoE file with
  // neither is told the expert key is missing.)
  const bool expert_key = moe && (f.find_value(p + "expert_feed_forward_length") != nullptr ||
                                  f.find_value(p + "feed_forward_length") == nullptr);
  auto ffn = get_dim(f, p + (expert_key ? "expert_feed_forward_length" : "feed_forward_length"));
  if (!ffn) return std::move(ffn).error();
  if (moe && *ffn > max_reasonable / n_expert)
    return make_error(errc::corrupt, "{}: the experts' FFN width {} is outside [1, {}]", f.name(),
                      *ffn, max_reasonable / n_expert);
  auto ctx = get_dim(f, p + "context_length", 2048);
  if (!ctx) return std::move(ctx).error();
  if (*dim % *heads != 0 && f.find_value(p + "attention.key_length") == nullptr)
    return make_error(errc::corrupt,
                      "{}: {}embedding_length {} is not a multiple of attention.head_count {} "
                      "(and attention.key_length is absent)",
                      f.name(), p, *dim, *heads);
  auto head_dim = get_dim(f, p + "attention.key_length", *dim / *heads);
  if (!head_dim) return std::move(head_dim).error();
  auto value_dim = get_dim(f, p + "attention.value_length", *head_dim);
  if (!value_dim) return std::move(value_dim).error();
  if (*value_dim != *head_dim)
    return make_error(errc::unsupported, "{}: attention.value_length {} != key_length {}", f.name(),
                      *value_dim, *head_dim);
  if (*head_dim % 2 != 0 || *head_dim > 1024)
    return make_error(errc::unsupported, "{}: head dimension {} must be even and <= 1024", f.name(),
                      *head_dim);
  if (*kv > *heads || *heads % *kv != 0)
    return make_error(errc::corrupt,
                      "{}: attention.head_count {} is not a multiple of attention.head_count_kv {} "
                      "(grouped-query attention needs whole groups)",
                      f.name(), *heads, *kv);
  auto rope_dims = get_dim(f, p + "rope.dimension_count", *head_dim);
  if (!rope_dims) return std::move(rope_dims).error();
  if (*rope_dims != *head_dim)
    return make_error(errc::unsupported,
                      "{}: partial RoPE (rope.dimension_count {} of head dimension {}) is not "
                      "supported",
                      f.name(), *rope_dims, *head_dim);
  auto eps = get_real(f, p + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (!eps) return std::move(eps).error();
  auto base = get_real(f, p + "rope.freq_base", 10000.0f);
  if (!base) return std::move(base).error();
  auto embd = f.tensor("token_embd.weight");
  if (!embd) return std::move(embd).error();
  if ((*embd)->dims.size() != 2 || static_cast<std::int64_t>((*embd)->dims[0]) != *dim)
    return make_error(errc::corrupt, "{}: tensor token_embd.weight has dims {} but the model dim is {}",
                      f.name(), fmt::join((*embd)->dims, "x"), *dim);
  hp.dim = *dim;
  hp.n_layer = *layers;
  hp.n_head = *heads;
  hp.n_head_kv = *kv;
  hp.head_dim = *head_dim;
  hp.ffn = moe ? *ffn * n_expert : *ffn;
  hp.n_expert = n_expert;
  hp.n_expert_used = n_used;
  hp.expert_ffn = moe ? *ffn : 0;
  hp.n_ctx_train = *ctx;
  hp.rms_eps = *eps;
  hp.rope_base = *base;
  hp.n_vocab = static_cast<std::int64_t>((*embd)->dims[1]);
  hp.rope = hp.arch == architecture::llama ? rope_mode::normal : rope_mode::neox;
  hp.qk_norm = hp.arch == architecture::qwen3 || hp.arch == architecture::qwen3moe;
  hp.tied_output = f.find_tensor("output.weight") == nullptr;
  return hp;
}

model::~model() {
  if (arena_ != nullptr) ::munmap(arena_, arena_size_);
}

std::uint64_t model::bytes_per_token() const noexcept {
  std::uint64_t n = 0;
  for (const auto& l : layers_) {
    for (const weight_view* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (w->data != nullptr) n += inference::weight_bytes(*w);
    if (l.router.data != nullptr) {
      // A token reads n_expert_used of all n_expert experts: on average that share of this
      // shard's.
      const std::uint64_t experts = inference::weight_bytes(l.exp_gate) +
                                    inference::weight_bytes(l.exp_up) +
                                    inference::weight_bytes(l.exp_down);
      n += inference::weight_bytes(l.router) + experts *
                                                   static_cast<std::uint64_t>(hp_.n_expert_used) /
                                                   static_cast<std::uint64_t>(hp_.n_expert);
    }
  }
  if (has_output()) n += inference::weight_bytes(output_);
  return n;
}

std::vector<std::uint64_t> model::expert_load() const {
  std::vector<std::uint64_t> out;
  if (!expert_load_) return out;
  for (std::int64_t e = 0; e < local_.n_expert; ++e)
    out.push_back(expert_load_[static_cast<std::size_t>(e)].load(std::memory_order_relaxed));
  return out;
}

result<std::unique_ptr<model>> model::load(const gguf::file& f, const load_options& opts) {
  return load_or_check(f, opts, false);
}

result<std::uint64_t> model::check(const gguf::file& f, const load_options& opts) {
  auto m = load_or_check(f, opts, true);
  if (!m) return std::move(m).error();
  return (*m)->arena_bytes_;
}

result<std::vector<gguf::byte_range>> model::file_ranges(const gguf::file& f,
                                                        const load_options& opts) {
  std::vector<gguf::byte_range> ranges;
  auto m = load_or_check(f, opts, true, &ranges);
  if (!m) return std::move(m).error();
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<gguf::byte_range> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && merged.back().offset + merged.back().size >= r.offset)
      merged.back().size = std::max(merged.back().size, r.offset + r.size - merged.back().offset);
    else
      merged.push_back(r);
  }
  return merged;
}

result<std::unique_ptr<model>> model::load_or_check(const gguf::file& f, const load_options& opts,
                                                    bool check_only,
                                                    std::vector<gguf::byte_range>* ranges) {
  auto hp = read_hparams(f);
  if (!hp) return std::move(hp).error();
  shard_spec s = opts.shard;
  if (s.last_layer < 0) s.last_layer = hp->n_layer;
  if (s.head_end < 0) s.head_end = hp->n_head;
  if (s.ffn_end < 0) s.ffn_end = hp->ffn;
  if (s.first_layer < 0 || s.first_layer >= s.last_layer || s.last_layer > hp->n_layer)
    return make_error(errc::invalid_argument, "{}: shard layers [{}, {}) are not inside [0, {})",
                      f.name(), s.first_layer, s.last_layer, hp->n_layer);
  if (s.head_begin < 0 || s.head_begin >= s.head_end || s.head_end > hp->n_head || s.ffn_begin < 0 ||
      s.ffn_begin >= s.ffn_end || s.ffn_end > hp->ffn)
    return make_error(errc::invalid_argument,
                      "{}: shard heads [{}, {}) / FFN columns [{}, {}) are not inside [0, {}) / [0, {})",
                      f.name(), s.head_begin, s.head_end, s.ffn_begin, s.ffn_end, hp->n_head, hp->ffn);
  // GQA: query head h reads KV head h / group. A slice of query heads [hb, he) holds the KV heads
  // [hb / group, ceil(he / group)): a group straddling two slices has its KV head (its k/v rows and
  // its cache) in both, each computing it locally (docs/design/010-placement.md, rule 5).
  const std::int64_t group = hp->n_head / hp->n_head_kv;
  std::unique_ptr<model> m(new model());
  m->hp_ = *hp;
  m->shard_ = s;
  m->name_ = f.name();
  const hparams& H = m->hp_;
  m->local_ = H;
  m->local_.n_head = s.head_end - s.head_begin;
  m->kv_group_ = group;
  m->kv_first_ = s.head_begin / group;
  m->local_.n_head_kv = (s.head_end + group - 1) / group - m->kv_first_;
  m->local_.ffn = s.ffn_end - s.ffn_begin;
  const hparams& LH = m->local_;
  const bool tp = LH.n_head != H.n_head || LH.ffn != H.ffn;
  if (H.is_moe()) {
    if (s.ffn_begin % H.expert_ffn != 0 || s.ffn_end % H.expert_ffn != 0)
      return make_error(errc::invalid_argument,
                        "{}: shard FFN range [{}, {}) does not fall on expert boundaries (each "
                        "expert is {} columns)",
                        f.name(), s.ffn_begin, s.ffn_end, H.expert_ffn);
    m->local_.n_expert = LH.ffn / H.expert_ffn;
    m->expert_first_ = s.ffn_begin / H.expert_ffn;
    m->expert_load_ = std::make_unique<std::atomic<std::uint64_t>[]>(
        static_cast<std::size_t>(m->local_.n_expert));
  }
  // Every local query head has its KV head in the slice (local kv_dim follows n_head_kv).
  TESSERA_ASSERT(m->local_.n_head_kv >= 1, "a slice of {} heads holds no KV head", LH.n_head);

  // 1. Find and check every tensor the shard needs, and lay it out in the arena.
  std::vector<placement> plan;
  std::size_t cursor = 0;
  // Rows [row_b, row_b + row_n) and columns [col_b, col_b + col_n) of a [rows][cols] tensor
  // (row_n / col_n = 0: all); for a vector the row range selects elements.
  auto place = [&](const std::string& name, std::int64_t cols, std::int64_t rows, bool as_f32,
                   bool pack = false, std::int64_t row_b = 0, std::int64_t row_n = 0,
                   std::int64_t col_b = 0, std::int64_t col_n = 0) -> result<std::size_t> {
    auto t = f.tensor(name);
    if (!t) return std::move(t).error();
    const gguf::tensor_info& ti = **t;
    const bool is_vector = rows == 1 && ti.dims.size() == 1;
    if (!is_vector && (ti.dims.size() != 2 || static_cast<std::int64_t>(ti.dims[0]) != cols ||
                       static_cast<std::int64_t>(ti.dims[1]) != rows))
      return make_error(errc::corrupt, "{}: tensor {} has dims {} but {}x{} was expected", f.name(),
                        name, fmt::join(ti.dims, "x"), cols, rows);
    if (is_vector && static_cast<std::int64_t>(ti.dims[0]) != cols)
      return make_error(errc::corrupt, "{}: tensor {} has {} elements but {} were expected",
                        f.name(), name, ti.dims[0], cols);
    placement pl;
    pl.info = &ti;
    pl.first_row = static_cast<std::uint64_t>(row_b);
    pl.rows = row_n > 0 ? static_cast<std::uint64_t>(row_n) : ti.rows();
    pl.first_col = col_b;
    pl.cols = col_n;
    pl.as_f32 = as_f32;
    if (as_f32) {
      pl.bytes = static_cast<std::size_t>(is_vector && row_n > 0 ? row_n : static_cast<std::int64_t>(ti.elements)) *
                 sizeof(float);
    } else {
      const std::int64_t blk = block_elements(ti.type);
      if (col_n > 0 && (col_b % blk != 0 || col_n % blk != 0))
        return make_error(errc::unsupported,
                          "{}: tensor {}: columns [{}, {}) of a shard do not fall on {}-element {} "
                          "block boundaries",
                          f.name(), name, col_b, col_b + col_n, blk, to_string(ti.type));
      auto rb = row_bytes(ti.type, col_n > 0 ? col_n : static_cast<std::int64_t>(ti.dims[0]));
      if (!rb) return make_error(errc::corrupt, "{}: tensor {}: {}", f.name(), name, rb.error().message);
      pl.bytes = *rb * static_cast<std::size_t>(pl.rows);
    }
    // `pack`: right after the previous tensor (no alignment gap) so the two can form one matrix.
    if (!pack) cursor = (cursor + 63) / 64 * 64;
    pl.offset = cursor;
    cursor += pl.bytes;
    plan.push_back(pl);
    return plan.size() - 1;
  };
  // Experts [e_b, e_b + e_n) of a stacked [n_expert][rows][cols] tensor: rows [e_b * rows,
  // (e_b + e_n) * rows) of it read as one [n_expert * rows][cols] matrix.
  auto place_experts = [&](const std::string& name, std::int64_t cols, std::int64_t rows,
                           std::int64_t e_b, std::int64_t e_n) -> result<std::size_t> {
    auto t = f.tensor(name);
    if (!t) return std::move(t).error();
    const gguf::tensor_info& ti = **t;
    if (ti.dims.size() != 3 || static_cast<std::int64_t>(ti.dims[0]) != cols ||
        static_cast<std::int64_t>(ti.dims[1]) != rows ||
        static_cast<std::int64_t>(ti.dims[2]) != H.n_expert)
      return make_error(errc::corrupt, "{}: tensor {} has dims {} but {}x{}x{} was expected",
                        f.name(), name, fmt::join(ti.dims, "x"), cols, rows, H.n_expert);
    auto rb = row_bytes(ti.type, cols);
    if (!rb)
      return make_error(errc::corrupt, "{}: tensor {}: {}", f.name(), name, rb.error().message);
    placement pl;
    pl.info = &ti;
    pl.first_row = static_cast<std::uint64_t>(e_b * rows);
    pl.rows = static_cast<std::uint64_t>(e_n * rows);
    pl.bytes = *rb * static_cast<std::size_t>(pl.rows);
    cursor = (cursor + 63) / 64 * 64;
    pl.offset = cursor;
    cursor += pl.bytes;
    plan.push_back(pl);
    return plan.size() - 1;
  };
  // An expert's gate and up rows side by side ([gate rows][up rows] per expert) when both have
  // one type: one mat-mul of 2 * eff rows per expert, one activation quantisation, as the dense
  // FFN's fused gate/up. Else two blocks.
  auto place_gate_up = [&](const std::string& gate, const std::string& up, std::int64_t e_b,
                           std::int64_t e_n) -> result<std::pair<std::size_t, std::size_t>> {
    auto g = place_experts(gate, H.dim, H.expert_ffn, e_b, e_n);
    if (!g) return std::move(g).error();
    auto u = place_experts(up, H.dim, H.expert_ffn, e_b, e_n);
    if (!u) return std::move(u).error();
    placement& pg = plan[*g];
    placement& pu = plan[*u];
    if (pg.info->type == pu.info->type) {
      // Both blocks' bytes, interleaved from gate's start: expert k's gate rows at 2k, its up
      // rows at 2k + 1 (in units of one expert's rows).
      const std::size_t per_expert = pg.bytes / static_cast<std::size_t>(e_n);
      pu.offset = pg.offset + per_expert;
      pg.chunk_rows = pu.chunk_rows = static_cast<std::uint64_t>(H.expert_ffn);
      pg.chunk_stride = pu.chunk_stride = 2 * per_expert;
      cursor = pg.offset + pg.bytes + pu.bytes;
    }
    return std::pair{*g, *u};
  };
  auto optional_place = [&](const std::string& name, std::int64_t n, std::int64_t b,
                            std::int64_t count) -> result<std::optional<std::size_t>> {
    if (f.find_tensor(name) == nullptr) return std::optional<std::size_t>{};
    auto r = place(name, n, 1, true, false, b, count);
    if (!r) return std::move(r).error();
    return std::optional<std::size_t>{*r};
  };

  struct layer_plan {
    std::size_t attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down;
    std::optional<std::size_t> q_norm, k_norm, bq, bk, bv;
    std::optional<std::size_t> router, exp_gate, exp_up, exp_down;  // MoE
  };
  std::vector<layer_plan> lp;
  const bool need_embd = s.first_layer == 0 || (s.last_layer == H.n_layer && H.tied_output);
  std::optional<std::size_t> embd_i, out_i, out_norm_i;
  if (need_embd) {
    auto r = place("token_embd.weight", H.dim, H.n_vocab, false);
    if (!r) return std::move(r).error();
    embd_i = *r;
  }
  for (std::int64_t il = s.first_layer; il < s.last_layer; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    layer_plan l{};
    auto get = [&](const char* suffix, std::int64_t cols, std::int64_t rows, bool f32,
                   std::size_t& out, bool pack = false, std::int64_t row_b = 0,
                   std::int64_t row_n = 0, std::int64_t col_b = 0,
                   std::int64_t col_n = 0) -> result<void> {
      auto r = place(p + suffix, cols, rows, f32, pack, row_b, row_n, col_b, col_n);
      if (!r) return std::move(r).error();
      out = *r;
      return ok();
    };
    TESSERA_TRY(get("attn_norm.weight", H.dim, 1, true, l.attn_norm));
    // q, k, v adjacent (and gate, up adjacent): when their types agree they run as one mat-mul.
    // A tensor-parallel shard takes the rows of its heads / FFN columns of q, k, v, gate, up and
    // the matching columns of attn_output and ffn_down.
    const std::int64_t hd = H.head_dim;
    const std::int64_t kv_b = s.head_begin / group;
    TESSERA_TRY(get("attn_q.weight", H.dim, H.q_dim(), false, l.wq, false, s.head_begin * hd, LH.q_dim()));
    TESSERA_TRY(get("attn_k.weight", H.dim, H.kv_dim(), false, l.wk, true, kv_b * hd, LH.kv_dim()));
    TESSERA_TRY(get("attn_v.weight", H.dim, H.kv_dim(), false, l.wv, true, kv_b * hd, LH.kv_dim()));
    TESSERA_TRY(get("attn_output.weight", H.q_dim(), H.dim, false, l.wo, false, 0, 0,
                    tp ? s.head_begin * hd : 0, tp ? LH.q_dim() : 0));
    TESSERA_TRY(get("ffn_norm.weight", H.dim, 1, true, l.ffn_norm));
    if (H.is_moe()) {
      if (f.find_tensor(p + "ffn_gate.0.weight") != nullptr)
        return make_error(errc::unsupported,
                          "{}: layer {} stores its experts as separate tensors (ffn_gate.0.weight, "
                          "an old GGUF layout); convert it again with a current llama.cpp, which "
                          "stacks them in ffn_gate_exps",
                          f.name(), il);
      TESSERA_TRY(get("ffn_gate_inp.weight", H.dim, H.n_expert, false, l.router.emplace()));
      const std::int64_t eff = H.expert_ffn, e_b = m->expert_first_, e_n = LH.n_expert;
      auto gu = place_gate_up(p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight", e_b, e_n);
      if (!gu) return std::move(gu).error();
      auto d = place_experts(p + "ffn_down_exps.weight", eff, H.dim, e_b, e_n);
      if (!d) return std::move(d).error();
      l.exp_gate = gu->first;
      l.exp_up = gu->second;
      l.exp_down = *d;
    } else {
      TESSERA_TRY(get("ffn_gate.weight", H.dim, H.ffn, false, l.gate, false, s.ffn_begin, LH.ffn));
      TESSERA_TRY(get("ffn_up.weight", H.dim, H.ffn, false, l.up, true, s.ffn_begin, LH.ffn));
      TESSERA_TRY(get("ffn_down.weight", H.ffn, H.dim, false, l.down, false, 0, 0,
                      tp ? s.ffn_begin : 0, tp ? LH.ffn : 0));
    }
    if (H.qk_norm) {
      TESSERA_TRY(get("attn_q_norm.weight", H.head_dim, 1, true, l.q_norm.emplace()));
      TESSERA_TRY(get("attn_k_norm.weight", H.head_dim, 1, true, l.k_norm.emplace()));
    }
    if (H.arch == architecture::qwen2) {
      auto bq = optional_place(p + "attn_q.bias", H.q_dim(), s.head_begin * hd, LH.q_dim());
      if (!bq) return std::move(bq).error();
      auto bk = optional_place(p + "attn_k.bias", H.kv_dim(), kv_b * hd, LH.kv_dim());
      if (!bk) return std::move(bk).error();
      auto bv = optional_place(p + "attn_v.bias", H.kv_dim(), kv_b * hd, LH.kv_dim());
      if (!bv) return std::move(bv).error();
      l.bq = *bq;
      l.bk = *bk;
      l.bv = *bv;
    }
    lp.push_back(l);
  }
  if (s.last_layer == H.n_layer) {
    auto r = place("output_norm.weight", H.dim, 1, true);
    if (!r) return std::move(r).error();
    out_norm_i = *r;
    if (!H.tied_output) {
      auto o = place("output.weight", H.dim, H.n_vocab, false);
      if (!o) return std::move(o).error();
      out_i = *o;
    }
  }
  if (cursor > opts.max_weight_bytes)
    return make_error(errc::no_capacity, "{}: the shard's weights ({}) exceed the limit of {}",
                      f.name(), gguf::human_bytes(cursor), gguf::human_bytes(opts.max_weight_bytes));
  if (ranges != nullptr)
    for (const placement& pl : plan) {
      // The rows step 3 reads (a vector is read whole and sliced after conversion).
      const bool vector_slice = pl.as_f32 && pl.info->dims.size() == 1;
      auto r = f.row_range(*pl.info, vector_slice ? 0 : pl.first_row,
                           vector_slice ? pl.info->rows() : pl.rows);
      if (!r) return std::move(r).error();
      ranges->push_back(*r);
    }
  if (check_only) {
    m->arena_bytes_ = cursor;  // a model without weights, never handed out (check() reads this)
    return m;
  }

  // 2. One anonymous arena, huge pages requested (see the class comment).
  constexpr std::size_t huge = std::size_t{2} << 20;
  m->arena_size_ = std::max<std::size_t>((cursor + huge - 1) / huge * huge, huge);
  void* mem = ::mmap(nullptr, m->arena_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
  if (mem == MAP_FAILED)
    return make_error(errc::io, "{}: cannot allocate {} for the weights", f.name(),
                      gguf::human_bytes(m->arena_size_));
  m->arena_ = static_cast<std::byte*>(mem);
  m->arena_bytes_ = cursor;
#ifdef MADV_HUGEPAGE
  ::madvise(mem, m->arena_size_, MADV_HUGEPAGE);
#endif

  // 3. Fill it: straight from memory when the file is loaded, else pread of each tensor's bytes.
  std::vector<float> vec;
  std::uint64_t loaded = 0;
  for (const placement& pl : plan) {
    if (opts.on_progress && loaded > 0) opts.on_progress(loaded, cursor);
    loaded += pl.bytes;
    std::byte* dst = m->arena_ + pl.offset;
    const gguf::tensor_info& ti = *pl.info;
    const bool vector_slice = pl.as_f32 && ti.dims.size() == 1;
    // The rows to read (a vector is read whole and sliced after conversion).
    const std::uint64_t r0 = vector_slice ? 0 : pl.first_row;
    const std::uint64_t nr = vector_slice ? ti.rows() : pl.rows;
    const std::byte* src = nullptr;
    gguf::tensor_buffer buf;
    if (f.mode() == gguf::load_mode::headers_only) {
      auto r = f.read_rows(ti, r0, nr);
      if (!r) return std::move(r).error();
      buf = std::move(*r);
      src = buf.bytes().data();
    } else {
      auto d = f.data(ti);
      if (!d) return std::move(d).error();
      src = d->data() + r0 * ti.row_size();
    }
    if (pl.as_f32) {
      vec.resize(static_cast<std::size_t>(ti.elements));
      auto r = dequantize_row(ti.type, src, vec.data(), static_cast<std::int64_t>(ti.elements));
      if (!r)
        return make_error(errc::corrupt, "{}: tensor {}: {}", f.name(), ti.name, r.error().message);
      const std::size_t first = vector_slice ? static_cast<std::size_t>(pl.first_row) : 0;
      const std::size_t count = pl.bytes / sizeof(float);
      for (std::size_t i = 0; i < count; ++i) {
        if (!std::isfinite(vec[first + i]))
          return make_error(errc::corrupt, "{}: tensor {} holds a non-finite value at {}", f.name(),
                            ti.name, first + i);
      }
      std::memcpy(dst, vec.data() + first, count * sizeof(float));
    } else if (pl.chunk_rows > 0) {
      const std::size_t chunk = pl.chunk_rows * ti.row_size();
      for (std::uint64_t k = 0; k < nr / pl.chunk_rows; ++k)
        std::memcpy(dst + k * pl.chunk_stride, src + k * chunk, chunk);
    } else if (pl.cols > 0) {
      // Column slice: the same byte range of every row (block aligned, checked when planned).
      const std::size_t in_row = ti.row_size();
      const std::size_t skip = *row_bytes(ti.type, pl.first_col);
      const std::size_t take = *row_bytes(ti.type, pl.cols);
      for (std::uint64_t r = 0; r < nr; ++r) std::memcpy(dst + r * take, src + r * in_row + skip, take);
    } else {
      std::memcpy(dst, src, pl.bytes);
    }
  }

  if (opts.on_progress) opts.on_progress(cursor, cursor);

  // 4. The mat-mul weights that can be, in panels (matmul.hpp: prefill and batches reuse each
  //    weight load for 8 rows of activations; load_options::weight_panels says which types). The
  //    token embedding stays in rows: it is looked up by row. Tensors that run as one mat-mul
  //    (q|k|v, gate|up) are packed all or none.
  std::vector<bool> in_panels(plan.size(), false);
  auto cols_of = [&](const placement& pl) {
    return pl.cols > 0 ? pl.cols : static_cast<std::int64_t>(pl.info->dims[0]);
  };
  auto packable = [&](std::size_t i) {
    const placement& pl = plan[i];
    const auto rows = static_cast<std::int64_t>(pl.chunk_rows > 0 ? pl.chunk_rows : pl.rows);
    const tensor_type t = pl.info->type;
    const bool wanted = opts.weight_panels == load_options::panels::all ||
                        (opts.weight_panels == load_options::panels::faster &&
                         (t == tensor_type::q4_k || t == tensor_type::f16));
    return wanted && !pl.as_f32 && panels_supported(t, rows, cols_of(pl));
  };
  auto pack = [&](std::initializer_list<std::size_t> together) {
    for (std::size_t i : together)
      if (!packable(i)) return;
    for (std::size_t i : together) {
      const placement& pl = plan[i];
      if (pl.chunk_rows > 0) {
        for (std::uint64_t k = 0; k < pl.rows / pl.chunk_rows; ++k)
          pack_panels(pl.info->type, m->arena_ + pl.offset + k * pl.chunk_stride,
                      static_cast<std::int64_t>(pl.chunk_rows), cols_of(pl));
      } else {
        pack_panels(pl.info->type, m->arena_ + pl.offset, static_cast<std::int64_t>(pl.rows),
                    cols_of(pl));
      }
      in_panels[i] = true;
    }
  };
  for (const layer_plan& l : lp) {
    pack({l.wq, l.wk, l.wv});
    pack({l.wo});
    if (l.router) {
      pack({*l.exp_gate, *l.exp_up});
      pack({*l.exp_down});
    } else {
      pack({l.gate, l.up});
      pack({l.down});
    }
  }
  if (out_i) pack({*out_i});

  auto view = [&](std::size_t i) {
    const placement& pl = plan[i];
    weight_view w;
    w.type = pl.info->type;
    w.cols = cols_of(pl);
    w.rows = static_cast<std::int64_t>(pl.rows);
    w.data = m->arena_ + pl.offset;
    w.row_stride_bytes = 0;
    w.layout = in_panels[i] ? weight_layout::panels : weight_layout::rows;
    return w;
  };
  auto floats = [&](std::size_t i) {
    return reinterpret_cast<const float*>(m->arena_ + plan[i].offset);
  };
  auto maybe = [&](const std::optional<std::size_t>& i) -> const float* {
    return i ? floats(*i) : nullptr;
  };
  for (const layer_plan& l : lp) {
    layer_weights w;
    w.attn_norm = view(l.attn_norm);
    w.attn_norm_f = floats(l.attn_norm);
    w.wq = view(l.wq);
    w.wk = view(l.wk);
    w.wv = view(l.wv);
    w.wo = view(l.wo);
    w.ffn_norm = view(l.ffn_norm);
    w.ffn_norm_f = floats(l.ffn_norm);
    if (l.router) {
      w.router = view(*l.router);
      w.exp_gate = view(*l.exp_gate);
      w.exp_up = view(*l.exp_up);
      w.exp_down = view(*l.exp_down);
      w.exp_gate_up = plan[*l.exp_gate].chunk_rows > 0;
    } else {
      w.w_gate = view(l.gate);
      w.w_up = view(l.up);
      w.w_down = view(l.down);
    }
    w.q_norm = maybe(l.q_norm);
    w.k_norm = maybe(l.k_norm);
    w.bq = maybe(l.bq);
    w.bk = maybe(l.bk);
    w.bv = maybe(l.bv);
    for (const weight_view* v : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down,
                                 &w.router, &w.exp_gate, &w.exp_up, &w.exp_down}) {
      if (v->data == nullptr) continue;  // the FFN kind this model does not have
      if (!row_bytes(v->type, v->cols))
        return make_error(errc::corrupt, "{}: layer {}: a {} weight with rows of {} elements",
                          f.name(), m->layers_.size() + static_cast<std::size_t>(s.first_layer),
                          to_string(v->type), v->cols);
    }
    m->layers_.push_back(w);
  }
  if (embd_i) m->tok_embd_ = view(*embd_i);
  if (out_norm_i) m->output_norm_ = floats(*out_norm_i);
  if (out_i) {
    m->output_ = view(*out_i);
  } else if (s.last_layer == H.n_layer) {
    m->output_ = m->tok_embd_;
  }
  return m;
}

}  // namespace tessera::inference::model
