// A llama-family transformer loaded from a GGUF file, and the forward pass over it.
//
// Architectures: `llama` (Llama 2/3, Mistral, TinyLlama, SmolLM; "normal" RoPE), `qwen2` (NeoX
// RoPE, biases on q/k/v), `qwen3` (NeoX RoPE, RMSNorm of every q/k head), `qwen3moe` (qwen3's
// attention, a mixture-of-experts FFN in every layer) and `llama` with `llama.expert_count` set
// (Mixtral). The maths is the one in ../shared/notes/llama-numerics.md; the KV cache is F16 (like
// llama.cpp's default).
//
// Mixture of experts (issue 33): the FFN of a layer is a router `ffn_gate_inp` [n_expert x dim] and
// n_expert SwiGLU experts stacked in 3-D tensors (`ffn_gate_exps` / `ffn_up_exps` [n_expert][eff]
// [dim], `ffn_down_exps` [n_expert][dim][eff]). Per token: softmax over the router's logits, the
// n_expert_used most probable experts (ties to the lower index), their probabilities renormalised
// to sum 1, and the FFN output is the weighted sum of those experts' outputs. The experts' hidden
// units, side by side, form one FFN axis of n_expert * eff columns; a shard's FFN range cuts that
// axis on expert boundaries, so expert parallelism is the tensor-parallel layout with experts in
// place of FFN columns: each rank sums its own experts' outputs, and the group's all-reduce adds
// the ranks' partial sums.
//
// Split of responsibilities:
//   model    — hyper-parameters and immutable weights (shareable by several contexts/threads);
//   context  — one sequence: its KV cache, its position and bounded scratch buffers, allocated
//   once.
//
// Sharding (issue 6): a model is built for a `shard_spec` — a range of layers (pipeline
// parallelism) and, reserved for tensor parallelism, a range of attention heads and of FFN columns.
// Only the bytes the shard owns are read from the file (pread of the tensors' byte ranges), so a
// peer that serves layers 8..15 never touches the rest. The first shard owns the embedding, the
// last the output norm and projection; a context of a middle shard takes and returns hidden states
// (`eval_hidden`). A head/FFN-column slice holds the rows of q/k/v/gate/up and the columns of
// attn_output/ffn_down for its heads (a GQA group cut by the slice's ends has its KV head in both
// slices) and FFN columns; its attention and FFN
// outputs are partial sums, added up across the shards by a caller-supplied all-reduce
// (context_options::reduce) before the residual: two synchronisations per layer.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "actors/base/result.hpp"
#include "inference/gguf/gguf.hpp"
#include "inference/kernels/attention.hpp"
#include "inference/kernels/matmul.hpp"
#include "inference/kernels/ops.hpp"
#include "inference/kernels/pages.hpp"
#include "inference/kernels/thread_pool.hpp"

namespace tessera::inference::model {

using token_id = std::int32_t;

enum class architecture { llama, qwen2, qwen3, qwen3moe };
std::string_view to_string(architecture a) noexcept;

/// Hyper-parameters from `<arch>.*` metadata, checked for consistency.
struct hparams {
  architecture arch = architecture::llama;
  std::int64_t n_vocab = 0;
  std::int64_t dim = 0;        ///< embedding_length
  std::int64_t n_layer = 0;    ///< block_count
  std::int64_t n_head = 0;
  std::int64_t n_head_kv = 0;
  std::int64_t head_dim = 0;   ///< attention.key_length (default dim / n_head)
  std::int64_t ffn = 0;        ///< feed_forward_length; MoE: n_expert * expert_ffn (all experts)
  std::int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  rope_mode rope = rope_mode::normal;
  bool qk_norm = false;        ///< qwen3
  bool tied_output = false;    ///< output.weight absent: logits use token_embd
  std::int64_t n_expert = 0;   ///< expert_count; 0: a dense FFN
  std::int64_t n_expert_used = 0;  ///< expert_used_count: experts per token
  std::int64_t expert_ffn = 0;     ///< one expert's hidden width (expert_feed_forward_length)

  [[nodiscard]] bool is_moe() const noexcept { return n_expert > 0; }
  [[nodiscard]] std::int64_t q_dim() const noexcept { return n_head * head_dim; }
  [[nodiscard]] std::int64_t kv_dim() const noexcept { return n_head_kv * head_dim; }
};

/// Reads and checks the hyper-parameters of `f`. Errors name the file and the key: a missing key,
/// an unsupported architecture, head counts that do not divide, an odd head dimension.
result<hparams> read_hparams(const gguf::file& f);

/// What part of the model an instance holds. Ends are exclusive; -1 means "to the end".
struct shard_spec {
  std::int64_t first_layer = 0;
  std::int64_t last_layer = -1;   ///< exclusive; -1 = n_layer
  std::int64_t head_begin = 0;    ///< attention heads [head_begin, head_end) (tensor parallelism)
  std::int64_t head_end = -1;
  /// FFN columns [ffn_begin, ffn_end) (tensor parallelism); of an MoE model, the experts' hidden
  /// units side by side: the range must fall on expert boundaries (expert parallelism).
  std::int64_t ffn_begin = 0;
  std::int64_t ffn_end = -1;

  [[nodiscard]] static shard_spec full() noexcept { return {}; }
  [[nodiscard]] static shard_spec layers(std::int64_t first, std::int64_t last) noexcept {
    return {first, last, 0, -1, 0, -1};
  }
  bool operator==(const shard_spec&) const = default;
};

/// One transformer block's weights (views into the model's weight arena).
struct layer_weights {
  weight_view attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  const float* attn_norm_f = nullptr;  ///< norms as f32 (they are F32 in GGUF; converted if not)
  const float* ffn_norm_f = nullptr;
  const float* q_norm = nullptr;       ///< qwen3: [head_dim]
  const float* k_norm = nullptr;
  const float* bq = nullptr;           ///< qwen2: biases [q_dim], [kv_dim], [kv_dim]
  const float* bk = nullptr;
  const float* bv = nullptr;
  /// MoE: the router (every expert's row, on every shard) and the shard's experts stacked: local
  /// expert j is rows [j * eff, (j + 1) * eff) of exp_gate / exp_up and [j * dim, (j + 1) * dim)
  /// of exp_down. w_gate / w_up / w_down are empty.
  weight_view router, exp_gate, exp_up, exp_down;
  /// exp_gate / exp_up interleaved by expert (expert e's gate rows, then its up rows: one mat-mul
  /// of 2 * eff rows at exp_gate.data + e * 2 * eff rows); exp_gate/exp_up's own rows are then
  /// each expert's half (their byte count is still what a token reads).
  bool exp_gate_up = false;
};

struct load_options {
  shard_spec shard{};
  /// Refuse models whose weights (this shard's) exceed this many bytes.
  std::uint64_t max_weight_bytes = std::uint64_t{64} << 30;
  /// Which mat-mul weights are stored in panels (matmul.hpp's weight_layout) where their shape
  /// allows:
  ///  - rows: none, every weight in GGUF's rows (q4_K and f16 then take the row kernels; q8_0 on
  ///    AVX-512 sums exact blocks from rows either way);
  ///  - faster: q4_K and f16, whose panel kernels beat the row kernels at decode and prefill alike;
  ///  - all: q8_0 too. Its prefill is no faster than from rows (AVX-512 packs q8_0 panels on
  ///    the fly) and its decode from panels is ~25% slower (bench/RESULTS.md, issue 35): for
  ///    comparisons, not a default.
  enum class panels { rows, faster, all };
  panels weight_panels = panels::faster;
  /// Called on the loading thread after each tensor: bytes of weights in place so far, of all
  /// (a progress bar for a model that takes seconds to read). Empty: not called.
  std::function<void(std::uint64_t done_bytes, std::uint64_t total_bytes)> on_progress;
};

/// Weights and hyper-parameters. Weights are read (pread or copied) into one anonymous arena with
/// transparent huge pages requested: never paged out to the file by DAMON/reclaim, and streamed at
/// full DRAM speed (4 KiB pages cost ~15% here). Immutable after load; share it between contexts.
class model {
 public:
  /// Loads the shard `opts.shard` of `f` (any load mode: in headers_only mode only the shard's byte
  /// ranges are read). Errors name the file and the tensor (missing, wrong shape, wrong type).
  static result<std::unique_ptr<model>> load(const gguf::file& f, const load_options& opts = {});
  /// What load() checks before it reads any weight — hyper-parameters, the shard, every tensor the
  /// shard needs present with its shape and a supported type, the size limit — with the same
  /// errors, and no weights read. Returns the bytes the shard's weights would take.
  static result<std::uint64_t> check(const gguf::file& f, const load_options& opts = {});
  /// The byte ranges of the file that load() reads for this shard (sorted, adjacent ones merged),
  /// after the same checks as check(): a peer that fetches a shard from others needs these bytes
  /// and no others (mesh/serving/model_share).
  static result<std::vector<gguf::byte_range>> file_ranges(const gguf::file& f,
                                                           const load_options& opts = {});

  ~model();
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  [[nodiscard]] const hparams& params() const noexcept { return hp_; }
  /// The shard's own view: n_head, n_head_kv and ffn of its slice (equal to params() unless the
  /// shard is a tensor-parallel slice).
  [[nodiscard]] const hparams& local() const noexcept { return local_; }
  /// True when the shard holds a slice of heads or FFN columns: its attention output and FFN
  /// output are partial sums that the shards must add up (context_options::reduce).
  [[nodiscard]] bool is_tensor_parallel() const noexcept {
    return local_.n_head != hp_.n_head || local_.ffn != hp_.ffn;
  }
  [[nodiscard]] const shard_spec& shard() const noexcept { return shard_; }
  /// Query heads per KV head (GQA), and the first KV head this shard holds: local KV head j is
  /// global KV head kv_first() + j, read by the shard's query heads in [(kv_first()+j)·group,
  /// (kv_first()+j+1)·group) ∩ [head_begin, head_end).
  [[nodiscard]] std::int64_t kv_group() const noexcept { return kv_group_; }
  [[nodiscard]] std::int64_t kv_first() const noexcept { return kv_first_; }
  /// MoE: the first expert this shard holds (local().n_expert of them from there).
  [[nodiscard]] std::int64_t expert_first() const noexcept { return expert_first_; }
  [[nodiscard]] bool has_embedding() const noexcept { return shard_.first_layer == 0; }
  [[nodiscard]] bool has_output() const noexcept { return shard_.last_layer == hp_.n_layer; }
  [[nodiscard]] std::int64_t n_local_layers() const noexcept {
    return shard_.last_layer - shard_.first_layer;
  }
  /// Weights of global layer `il` (first_layer <= il < last_layer).
  [[nodiscard]] const layer_weights& layer(std::int64_t il) const noexcept {
    return layers_[static_cast<std::size_t>(il - shard_.first_layer)];
  }
  [[nodiscard]] const weight_view& token_embedding() const noexcept { return tok_embd_; }
  [[nodiscard]] const weight_view& output() const noexcept { return output_; }
  [[nodiscard]] const float* output_norm() const noexcept { return output_norm_; }
  /// Bytes of weights this shard holds.
  [[nodiscard]] std::uint64_t weight_bytes_total() const noexcept { return arena_bytes_; }
  /// Bytes of weights one decoded token streams: every mat-mul weight once (the embedding row
  /// lookup excluded, the output projection included); of an MoE layer the router and, on
  /// average, n_expert_used / n_expert of the shard's experts (what a token reads when its choices
  /// spread evenly). The numerator of the decode roofline.
  [[nodiscard]] std::uint64_t bytes_per_token() const noexcept;
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// MoE: the rows routed to each of this shard's experts so far, every layer's choices added up
  /// (the observed per-expert load, for status); empty for a dense model. Any thread.
  [[nodiscard]] std::vector<std::uint64_t> expert_load() const;

 private:
  friend class context;  // its MoE passes count the experts' load
  model() = default;
  static result<std::unique_ptr<model>> load_or_check(
      const gguf::file& f, const load_options& opts, bool check_only,
      std::vector<gguf::byte_range>* ranges = nullptr);

  hparams hp_;
  hparams local_;
  shard_spec shard_;
  std::int64_t kv_group_ = 1, kv_first_ = 0;
  std::int64_t expert_first_ = 0;
  // Written by the forward passes (relaxed: a statistic), read by status; n_expert of local().
  std::unique_ptr<std::atomic<std::uint64_t>[]> expert_load_;
  std::string name_;
  std::byte* arena_ = nullptr;
  std::size_t arena_size_ = 0;
  std::uint64_t arena_bytes_ = 0;
  std::vector<layer_weights> layers_;
  weight_view tok_embd_{};
  weight_view output_{};
  const float* output_norm_ = nullptr;
};

/// Tensor parallelism: adds up, across the shards of a layer, the partial outputs `partial`
/// ([n][dim] floats: this shard's attention projection or FFN down projection) in place — an
/// all-reduce (sum). Called twice per layer, in the same order on every shard.
using reduce_fn = std::function<result<void>(std::span<float> partial)>;

struct context_options {
  std::int64_t n_ctx = 2048;      ///< KV cache positions (bounded; eval beyond is an error)
  std::int64_t max_batch = 256;   ///< tokens per internal forward step (prefill is chunked)
  thread_pool* pool = nullptr;    ///< compute threads (mat-muls, attention across heads)
  reduce_fn reduce;               ///< required for tensor-parallel shards, unused otherwise
  /// How the KV cache stores keys and values (attention.hpp): f16, or q8_0 for half the memory
  /// and half the bytes a long context reads per token (head_dim a multiple of 32).
  kv_cache_type kv_type = kv_cache_type::f16;
};

/// Which logits eval() writes.
enum class logits_mode { none, last, all };

/// Wall time per forward-pass stage, accumulated while `profile` is on (for `tessera bench`).
struct stage_times {
  double embed_s = 0, norm_s = 0, qkv_s = 0, rope_s = 0, attention_s = 0, wo_s = 0, ffn_up_s = 0,
         ffn_down_s = 0, output_s = 0;
  [[nodiscard]] double total() const noexcept {
    return embed_s + norm_s + qkv_s + rope_s + attention_s + wo_s + ffn_up_s + ffn_down_s + output_s;
  }
};

class context;

/// Scratch of a forward pass: activations for up to `max_tokens` tokens, attention scores over up
/// to `n_ctx` positions for each of `threads` threads. A context owns one for its own evals; the
/// serving engine holds one per model for eval_batch(), sized for a whole round of sessions.
class workspace {
 public:
  static result<std::unique_ptr<workspace>> create(const model& m, std::int64_t max_tokens,
                                                   std::int64_t n_ctx, int threads);
  [[nodiscard]] std::int64_t max_tokens() const noexcept { return max_tokens_; }
  [[nodiscard]] std::int64_t n_ctx() const noexcept { return n_ctx_; }
  [[nodiscard]] int threads() const noexcept { return threads_; }

 private:
  friend class context;
  workspace() = default;
  const model* m_ = nullptr;
  std::int64_t max_tokens_ = 0, n_ctx_ = 0;
  int threads_ = 1;
  std::vector<float> x_, h_, q_, k_, v_, att_, tmp_, gate_, up_;
  // MoE: router logits [B][n_expert], each row's choices [B][n_expert_used] (expert, weight), the
  // rows routed to one expert gathered [B][dim] and its output [B][dim], and the rows of each local
  // expert (a counting sort: offsets [n_local + 1], rows in expert order).
  std::vector<float> router_, gathered_, expert_out_;
  std::vector<std::pair<std::int32_t, float>> choice_;
  std::vector<std::int64_t> expert_offset_, expert_fill_;
  std::vector<std::pair<std::int64_t, float>> expert_rows_;
  // Attention (attention.hpp): per thread, one block's scratch and its queries' pointers and
  // lengths; the first row of each block of the pass.
  std::vector<float> scores_;
  std::vector<const float*> block_q_;
  std::vector<float*> block_out_;
  std::vector<std::int64_t> block_n_att_;
  std::vector<std::int64_t> block_first_;
  // RoPE cos/sin for the positions of the current pass, [n][head_dim / 2] each: computed once per
  // pass rather than once per layer and per q/k.
  std::vector<double> inv_freq_;
  std::vector<float> rope_cos_, rope_sin_;
  // Row t of a pass belongs to sequence row_ctx_[t] at position row_pos_[t]: one pass may hold the
  // tokens of several sequences (continuous batching), each attending over its own KV cache.
  std::vector<context*> row_ctx_;
  std::vector<std::int64_t> row_pos_;
  std::vector<float> logits_;     // eval_batch: the rows that want logits, [k][n_vocab]
  std::vector<token_id> tokens_;  // eval_batch: every item's tokens, in row order
};

/// Attention runs on blocks of up to this many consecutive rows of one sequence (a prefill chunk's
/// tokens): their query heads share every key and value load (attention.hpp).
inline constexpr std::int64_t attention_block_rows = 8;

/// One sequence's share of a batched forward pass (eval_batch).
struct batch_item {
  context* ctx = nullptr;
  /// Fed at positions [ctx->pos(), ctx->pos() + n) by a shard with the embedding; a shard without
  /// it takes `n` rows of hidden states instead (tokens empty).
  std::span<const token_id> tokens;
  std::span<float> logits;  ///< empty: none; else n_vocab floats (its last token's)
  std::int64_t n = 0;       ///< rows of hidden input (shards without the embedding only)
  [[nodiscard]] std::int64_t rows() const noexcept {
    return tokens.empty() ? n : static_cast<std::int64_t>(tokens.size());
  }
};

/// One sequence's state: KV cache (F16, n_ctx positions) and scratch, allocated at creation.
class context {
 public:
  static result<std::unique_ptr<context>> create(const model& m, const context_options& opts = {});

  /// Feeds `tokens` at positions [pos(), pos() + n). With logits_mode::last, `logits` receives
  /// n_vocab floats (the last token's); with all, n * n_vocab. A shard that does not end the model
  /// passes logits_mode::none and gets its output hidden states (n * dim floats) in `hidden_out`.
  /// Errors (nothing is changed): the KV cache would overflow (errc::no_capacity), a token id out of
  /// range, logits asked of a shard without the output layer, a shard without the embedding.
  result<void> eval(std::span<const token_id> tokens, logits_mode mode, std::span<float> logits,
                    std::span<float> hidden_out = {});

  /// For shards after the first: `hidden` holds n * dim floats entering the shard's first layer
  /// and is overwritten with the hidden states leaving its last layer (before the final norm).
  /// A shard that ends the model may also produce logits (as eval()).
  result<void> eval_hidden(std::span<float> hidden, std::int64_t n,
                           logits_mode mode = logits_mode::none, std::span<float> logits = {});

  /// Continuous batching: feeds several sequences of one model (or shard) in ONE forward pass —
  /// every weight is streamed once for all their tokens instead of once per sequence, which is
  /// what bounds decoding — each token attending over its own sequence's cache. Every item's
  /// result equals its own eval() / eval_hidden() (the mat-muls are row-independent). Rows are in
  /// item order. `hidden` (total rows x dim floats): a shard with the embedding writes its output
  /// hidden states there when it is not empty; a shard without the embedding reads its input rows
  /// from it and overwrites them with its output (as eval_hidden). Logits only from a shard with
  /// the output layer. A tensor-parallel slice needs `reduce` (its group's all-reduce, called
  /// twice per layer over all rows: every rank of the group must batch the same items in the same
  /// order). All rows together fit `ws` (max_tokens; every context's n_ctx <= ws.n_ctx(); pool
  /// threads <= ws.threads()). Errors (nothing is changed): as eval(), naming the item; two items
  /// of one context; contexts of different models.
  static result<void> eval_batch(std::span<const batch_item> items, workspace& ws,
                                 thread_pool* pool, std::span<float> hidden = {},
                                 const reduce_fn& reduce = {});

  [[nodiscard]] std::int64_t pos() const noexcept { return pos_; }
  [[nodiscard]] std::int64_t n_ctx() const noexcept { return n_ctx_; }
  [[nodiscard]] kv_cache_type kv_type() const noexcept { return kv_type_; }
  /// Prefix sharing: takes the first `n` positions of `from`'s KV cache (a context of the same
  /// model or shard) as its own, and pos() becomes n — as if it had evaluated those tokens, which
  /// the caller knows are the same (the cache of a token is bit for bit the same whichever pass
  /// computed it: attention.hpp). Errors (nothing is changed): another model, n > from.pos(), n >
  /// n_ctx().
  result<void> copy_prefix(const context& from, std::int64_t n);
  /// Forgets positions >= p (p <= pos()): the next eval starts at p.
  void truncate(std::int64_t p) noexcept;
  void reset() noexcept { truncate(0); }

  void set_profile(bool on) noexcept { profile_ = on; }
  [[nodiscard]] const stage_times& times() const noexcept { return times_; }
  void clear_times() noexcept { times_ = {}; }

  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

 private:
  explicit context(const model& m) : m_(&m) {}
  result<void> check_batch(std::int64_t n, logits_mode mode, std::size_t logits_size,
                           const char* what) const;
  result<void> forward_chunk(const token_id* tokens, const float* hidden_in, float* hidden_out,
                             std::int64_t n, logits_mode mode, float* logits);
  /// The layers over ws's first n rows (row_ctx_/row_pos_ set): embedding or hidden input in,
  /// the last layer's hidden states left in ws.x_.
  static result<void> pass(const model& m, workspace& ws, thread_pool* pool,
                           const reduce_fn& reduce, stage_times* times, const token_id* tokens,
                           const float* hidden_in, std::int64_t n);
  static result<void> layer_forward(const model& m, workspace& ws, thread_pool* pool,
                                    const reduce_fn& reduce, stage_times* times, std::int64_t il,
                                    std::int64_t n);
  /// The MoE FFN of layer `L` over ws.h_'s n rows: this shard's experts' weighted outputs summed
  /// into ws.tmp_ (the whole FFN output on a shard with every expert, else a partial sum).
  static result<void> moe_forward(const model& m, workspace& ws, thread_pool* pool,
                                  const layer_weights& L, std::int64_t n);

  const model* m_;
  thread_pool* pool_ = nullptr;
  reduce_fn reduce_;
  std::int64_t n_ctx_ = 0;
  std::int64_t max_batch_ = 0;
  std::int64_t pos_ = 0;
  bool profile_ = false;
  stage_times times_;
  // KV cache of kv_type_: per local layer and KV head, keys in panels of 16 positions and values
  // position-major (attention.hpp); on huge pages, committed as positions are written (pages.hpp).
  kv_cache_type kv_type_ = kv_cache_type::f16;
  page_array<std::uint8_t> k_cache_, v_cache_;
  std::unique_ptr<workspace> ws_;
};

}  // namespace tessera::inference::model
