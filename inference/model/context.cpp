// The forward pass: a context (one sequence's KV cache and position) and the workspace its passes
// use; eval, eval_hidden and eval_batch (several sequences' tokens through one pass), each layer's
// attention and FFN or mixture of experts. The model's weights and their loading: model.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "inference/kernels/attention.hpp"
#include "inference/kernels/cpu.hpp"
#include "inference/kernels/quant.hpp"
#include "inference/model/model.hpp"

namespace tessera::inference::model {

namespace {

// Rotates n_heads heads of x by the angles whose cos/sin are given (head_dim / 2 of each).
void apply_rope(float* x, std::int64_t n_heads, std::int64_t head_dim, const float* cs,
                const float* sn, rope_mode mode) noexcept {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    if (mode == rope_mode::normal) {
      for (std::int64_t i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * cs[i] - x1 * sn[i];
        v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
      }
    } else {
      for (std::int64_t i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs[i] - x1 * sn[i];
        v[i + half] = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What chunk [done, done + chunk) of an n-token eval writes of its logits, and where: every row
// (`all`, at the chunk's rows), the last token's only in the last chunk (`last`), none (`none`).
std::pair<logits_mode, float*> chunk_logits(logits_mode mode, std::span<float> logits,
                                            std::int64_t n_vocab, std::int64_t done,
                                            std::int64_t chunk, std::int64_t n) {
  if (mode == logits_mode::all) return {mode, logits.data() + done * n_vocab};
  if (mode == logits_mode::last)
    return {done + chunk == n ? logits_mode::last : logits_mode::none, logits.data()};
  return {mode, nullptr};
}

}  // namespace

context::~context() = default;

result<std::unique_ptr<workspace>> workspace::create(const model& m, std::int64_t max_tokens,
                                                     std::int64_t n_ctx, int threads) {
  if (max_tokens < 1 || max_tokens > 4096)
    return make_error(errc::invalid_argument, "workspace: max_tokens {} is outside [1, 4096]",
                      max_tokens);
  if (n_ctx < 1 || n_ctx > (std::int64_t{1} << 20))
    return make_error(errc::invalid_argument, "workspace: n_ctx {} is outside [1, {}]", n_ctx,
                      std::int64_t{1} << 20);
  if (threads < 1 || threads > 1024)
    return make_error(errc::invalid_argument, "workspace: {} threads is outside [1, 1024]", threads);
  const hparams& H = m.local();
  std::unique_ptr<workspace> w(new workspace());
  w->m_ = &m;
  w->max_tokens_ = max_tokens;
  w->n_ctx_ = n_ctx;
  w->threads_ = threads;
  const auto B = static_cast<std::size_t>(max_tokens);
  w->x_.resize(B * static_cast<std::size_t>(H.dim));
  w->h_.resize(B * static_cast<std::size_t>(H.dim));
  w->tmp_.resize(B * static_cast<std::size_t>(H.dim));
  // q, k, v are produced by one fused mat-mul when the types agree: one buffer [B][q + 2 kv].
  w->q_.resize(B * static_cast<std::size_t>(H.q_dim() + 2 * H.kv_dim()));
  w->k_.resize(B * static_cast<std::size_t>(H.kv_dim()));
  w->v_.resize(B * static_cast<std::size_t>(H.kv_dim()));
  w->att_.resize(B * static_cast<std::size_t>(H.q_dim()));
  // An MoE layer runs one expert at a time over the rows routed to it: its FFN width is one
  // expert's.
  const std::int64_t ffn = H.is_moe() ? H.expert_ffn : H.ffn;
  w->gate_.resize(B * static_cast<std::size_t>(2 * ffn));
  w->up_.resize(B * static_cast<std::size_t>(ffn));
  if (H.is_moe()) {
    w->router_.resize(B * static_cast<std::size_t>(m.params().n_expert));  // the whole router
    w->gathered_.resize(B * static_cast<std::size_t>(H.dim));
    w->expert_out_.resize(B * static_cast<std::size_t>(H.dim));
    w->choice_.resize(B * static_cast<std::size_t>(H.n_expert_used));
    w->expert_offset_.resize(static_cast<std::size_t>(m.local().n_expert + 1));
    w->expert_fill_.resize(static_cast<std::size_t>(m.local().n_expert));
    w->expert_rows_.resize(B * static_cast<std::size_t>(H.n_expert_used));
  }
  const std::int64_t half = H.head_dim / 2;
  w->inv_freq_.resize(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    w->inv_freq_[static_cast<std::size_t>(i)] =
        std::pow(static_cast<double>(H.rope_base),
                 -2.0 * static_cast<double>(i) / static_cast<double>(H.head_dim));
  w->rope_cos_.resize(B * static_cast<std::size_t>(half));
  w->rope_sin_.resize(B * static_cast<std::size_t>(half));
  // Per thread: one attention block's scratch (its rows' query heads of one KV head).
  w->scores_.resize(
      static_cast<std::size_t>(threads) *
      attention_scratch_floats(attention_block_rows * m.kv_group(), n_ctx, H.head_dim));
  w->block_first_.resize(B + 1);
  const auto slots = static_cast<std::size_t>(threads * attention_block_rows * m.kv_group());
  w->block_q_.resize(slots);
  w->block_out_.resize(slots);
  w->block_n_att_.resize(slots);
  w->row_ctx_.resize(B);
  w->row_pos_.resize(B);
  return w;
}

result<std::unique_ptr<context>> context::create(const model& m, const context_options& opts) {
  const hparams& H = m.local();
  if (m.is_tensor_parallel() && !opts.reduce)
    return make_error(errc::invalid_argument,
                      "context: a tensor-parallel shard (heads [{}, {}), FFN [{}, {})) needs a "
                      "reduce function",
                      m.shard().head_begin, m.shard().head_end, m.shard().ffn_begin,
                      m.shard().ffn_end);
  if (opts.n_ctx < 1 || opts.n_ctx > (std::int64_t{1} << 20))
    return make_error(errc::invalid_argument, "context: n_ctx {} is outside [1, {}]", opts.n_ctx,
                      std::int64_t{1} << 20);
  if (opts.max_batch < 1 || opts.max_batch > 4096)
    return make_error(errc::invalid_argument, "context: max_batch {} is outside [1, 4096]",
                      opts.max_batch);
  std::unique_ptr<context> c(new context(m));
  c->pool_ = opts.pool;
  if (m.is_tensor_parallel()) c->reduce_ = opts.reduce;
  c->n_ctx_ = opts.n_ctx;
  c->max_batch_ = std::min(opts.max_batch, opts.n_ctx);
  if (!kv_cache_supports(opts.kv_type, H.head_dim))
    return make_error(errc::unsupported,
                      "context: a {} KV cache needs head_dim a multiple of 32 (at most 1024); "
                      "this model's is {} (use the f16 cache)",
                      to_string(opts.kv_type), H.head_dim);
  c->kv_type_ = opts.kv_type;
  const auto cache = static_cast<std::size_t>(m.n_local_layers()) *
                     static_cast<std::size_t>(key_cache_positions(opts.n_ctx)) *
                     static_cast<std::size_t>(H.n_head_kv) *
                     kv_position_bytes(opts.kv_type, H.head_dim);
  auto keys = page_array<std::uint8_t>::create(cache);
  if (!keys) return keys.error();
  auto values = page_array<std::uint8_t>::create(cache);
  if (!values) return values.error();
  c->k_cache_ = std::move(*keys);
  c->v_cache_ = std::move(*values);
  auto ws = workspace::create(m, c->max_batch_, opts.n_ctx, opts.pool ? opts.pool->size() : 1);
  if (!ws) return ws.error();
  c->ws_ = std::move(*ws);
  return c;
}

result<void> context::copy_prefix(const context& from, std::int64_t n) {
  if (from.m_ != m_)
    return make_error(errc::invalid_argument, "context: a prefix from another model's context");
  if (n < 0 || n > from.pos_ || n > n_ctx_)
    return make_error(errc::invalid_argument,
                      "context: a prefix of {} positions from a context at {} into one of {}", n,
                      from.pos_, n_ctx_);
  if (from.kv_type_ != kv_type_)
    return make_error(errc::invalid_argument, "context: a prefix from a {} KV cache into a {} one",
                      to_string(from.kv_type_), to_string(kv_type_));
  // Per layer and KV head: keys in whole panels of 16 positions (the positions past n in the last
  // panel are overwritten before they are read), values position-major. The two contexts' n_ctx
  // may differ: only the per-head stride does.
  const hparams& H = m_->params();
  const std::size_t pb = kv_position_bytes(kv_type_, H.head_dim);
  const std::int64_t heads = m_->n_local_layers() * H.n_head_kv;
  const auto key_bytes = static_cast<std::size_t>((n + 15) / 16 * 16) * pb;
  const auto value_bytes = static_cast<std::size_t>(n) * pb;
  const auto src_stride = static_cast<std::size_t>(key_cache_positions(from.n_ctx_)) * pb;
  const auto dst_stride = static_cast<std::size_t>(key_cache_positions(n_ctx_)) * pb;
  for (std::int64_t h = 0; h < heads; ++h) {
    const auto hs = static_cast<std::size_t>(h);
    std::copy_n(from.k_cache_.data() + hs * src_stride, key_bytes,
                k_cache_.data() + hs * dst_stride);
    std::copy_n(from.v_cache_.data() + hs * src_stride, value_bytes,
                v_cache_.data() + hs * dst_stride);
  }
  pos_ = n;
  return ok();
}

void context::truncate(std::int64_t p) noexcept {
  if (p >= 0 && p < pos_) pos_ = p;
}

result<void> context::check_batch(std::int64_t n, logits_mode mode, std::size_t logits_size,
                                  const char* what) const {
  const hparams& H = m_->params();
  if (n <= 0) return make_error(errc::invalid_argument, "{}: no tokens", what);
  if (mode != logits_mode::none && !m_->has_output())
    return make_error(errc::invalid_argument,
                      "{}: this shard (layers [{}, {})) has no output layer; no logits", what,
                      m_->shard().first_layer, m_->shard().last_layer);
  if (pos_ + n > n_ctx_)
    return make_error(errc::no_capacity,
                      "{}: KV cache full: {} tokens at position {} exceed the context of {} "
                      "positions",
                      what, n, pos_, n_ctx_);
  const std::size_t need = mode == logits_mode::all    ? static_cast<std::size_t>(n * H.n_vocab)
                           : mode == logits_mode::last ? static_cast<std::size_t>(H.n_vocab)
                                                       : 0;
  if (logits_size < need)
    return make_error(errc::invalid_argument, "{}: logits buffer of {} floats, {} needed", what,
                      logits_size, need);
  return ok();
}

namespace {
result<void> check_tokens(std::span<const token_id> tokens, std::int64_t n_vocab,
                          const char* what) {
  for (const token_id t : tokens)
    if (t < 0 || t >= n_vocab)
      return make_error(errc::invalid_argument, "{}: token id {} is outside the vocabulary [0, {})",
                        what, t, n_vocab);
  return ok();
}
}  // namespace

result<void> context::eval(std::span<const token_id> tokens, logits_mode mode,
                           std::span<float> logits, std::span<float> hidden_out) {
  const hparams& H = m_->params();
  const auto n = static_cast<std::int64_t>(tokens.size());
  TESSERA_TRY(check_batch(n, mode, logits.size(), "eval"));
  if (!m_->has_embedding())
    return make_error(errc::invalid_argument,
                      "eval: this shard (layers [{}, {})) has no embedding; use eval_hidden",
                      m_->shard().first_layer, m_->shard().last_layer);
  if (!hidden_out.empty() && hidden_out.size() < static_cast<std::size_t>(n * H.dim))
    return make_error(errc::invalid_argument, "eval: hidden_out of {} floats, {} needed",
                      hidden_out.size(), n * H.dim);
  TESSERA_TRY(check_tokens(tokens, H.n_vocab, "eval"));
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t chunk = std::min(max_batch_, n - done);
    const auto [m, out] = chunk_logits(mode, logits, H.n_vocab, done, chunk, n);
    TESSERA_TRY(forward_chunk(tokens.data() + done, nullptr,
                              hidden_out.empty() ? nullptr : hidden_out.data() + done * H.dim, chunk,
                              m, out));
    done += chunk;
  }
  return ok();
}

result<void> context::eval_hidden(std::span<float> hidden, std::int64_t n, logits_mode mode,
                                  std::span<float> logits) {
  const hparams& H = m_->params();
  TESSERA_TRY(check_batch(n, mode, logits.size(), "eval_hidden"));
  if (hidden.size() < static_cast<std::size_t>(n * H.dim))
    return make_error(errc::invalid_argument, "eval_hidden: {} tokens need {} floats, got {}", n,
                      n * H.dim, hidden.size());
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t chunk = std::min(max_batch_, n - done);
    const auto [m, out] = chunk_logits(mode, logits, H.n_vocab, done, chunk, n);
    float* h = hidden.data() + done * H.dim;
    TESSERA_TRY(forward_chunk(nullptr, h, h, chunk, m, out));
    done += chunk;
  }
  return ok();
}

result<void> context::eval_batch(std::span<const batch_item> items, workspace& ws,
                                 thread_pool* pool, std::span<float> hidden,
                                 const reduce_fn& reduce) {
  if (items.empty()) return make_error(errc::invalid_argument, "eval_batch: no sequences");
  const model* m = items.front().ctx != nullptr ? items.front().ctx->m_ : nullptr;
  if (m == nullptr) return make_error(errc::invalid_argument, "eval_batch: item 0 has no context");
  const hparams& H = m->params();
  if (ws.m_ != m)
    return make_error(errc::invalid_argument, "eval_batch: the workspace belongs to another model");
  if (m->is_tensor_parallel() && !reduce)
    return make_error(errc::invalid_argument,
                      "eval_batch: a tensor-parallel shard (heads [{}, {})) needs its group's "
                      "reduce function",
                      m->shard().head_begin, m->shard().head_end);
  if (pool != nullptr && pool->size() > ws.threads_)
    return make_error(errc::invalid_argument,
                      "eval_batch: the pool has {} threads, the workspace scratch for {}",
                      pool->size(), ws.threads_);
  std::int64_t total = 0, want = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const batch_item& it = items[i];
    if (it.ctx == nullptr)
      return make_error(errc::invalid_argument, "eval_batch: item {} has no context", i);
    if (it.ctx->m_ != m)
      return make_error(errc::invalid_argument,
                        "eval_batch: item {} is a context of another model", i);
    for (std::size_t j = 0; j < i; ++j)
      if (items[j].ctx == it.ctx)
        return make_error(errc::invalid_argument,
                          "eval_batch: items {} and {} are one context (its tokens go in one item)",
                          j, i);
    if (it.ctx->n_ctx_ > ws.n_ctx_)
      return make_error(errc::invalid_argument,
                        "eval_batch: item {} has a context of {} positions, the workspace "
                        "scratch for {}",
                        i, it.ctx->n_ctx_, ws.n_ctx_);
    if (m->has_embedding() && it.tokens.empty())
      return make_error(errc::invalid_argument, "eval_batch: item {} has no tokens", i);
    if (!m->has_embedding() && (!it.tokens.empty() || it.n <= 0))
      return make_error(errc::invalid_argument,
                        "eval_batch: item {}: this shard (layers [{}, {})) has no embedding: it "
                        "takes n > 0 hidden rows, not tokens",
                        i, m->shard().first_layer, m->shard().last_layer);
    const std::int64_t n = it.rows();
    TESSERA_TRY(it.ctx->check_batch(n, it.logits.empty() ? logits_mode::none : logits_mode::last,
                                    it.logits.size(), "eval_batch"));
    TESSERA_TRY(check_tokens(it.tokens, H.n_vocab, "eval_batch"));
    total += n;
    if (!it.logits.empty()) ++want;
  }
  if (total > ws.max_tokens_)
    return make_error(errc::invalid_argument,
                      "eval_batch: {} tokens in all exceed the workspace's {}", total,
                      ws.max_tokens_);
  const std::int64_t dim = H.dim;
  if (!m->has_embedding() || !hidden.empty()) {
    if (hidden.size() < static_cast<std::size_t>(total * dim))
      return make_error(errc::invalid_argument,
                        "eval_batch: {} rows need {} floats of hidden states, got {}", total,
                        total * dim, hidden.size());
  }

  // Rows in item order; each token at its own sequence's next position.
  std::vector<token_id>& tokens = ws.tokens_;
  tokens.clear();
  std::int64_t row = 0;
  for (const batch_item& it : items)
    for (std::int64_t t = 0; t < it.rows(); ++t, ++row) {
      if (!it.tokens.empty()) tokens.push_back(it.tokens[static_cast<std::size_t>(t)]);
      ws.row_ctx_[static_cast<std::size_t>(row)] = it.ctx;
      ws.row_pos_[static_cast<std::size_t>(row)] = it.ctx->pos_ + t;
    }
  TESSERA_TRY(pass(*m, ws, pool, reduce, nullptr, m->has_embedding() ? tokens.data() : nullptr,
                   m->has_embedding() ? nullptr : hidden.data(), total));
  for (const batch_item& it : items)
    it.ctx->pos_ += it.rows();
  if (!hidden.empty())
    std::memcpy(hidden.data(), ws.x_.data(), static_cast<std::size_t>(total * dim) * sizeof(float));

  // The output projection of every row that wants logits, in one mat-mul.
  if (want > 0) {
    std::int64_t k = 0;
    row = 0;
    for (const batch_item& it : items) {
      row += it.rows();
      if (it.logits.empty()) continue;
      rmsnorm(ws.x_.data() + (row - 1) * dim, m->output_norm(), ws.h_.data() + k * dim, dim,
              H.rms_eps);
      ++k;
    }
    ws.logits_.resize(static_cast<std::size_t>(want * H.n_vocab));
    TESSERA_TRY(matmul(m->output(), ws.h_.data(), want, ws.logits_.data(), pool));
    k = 0;
    for (const batch_item& it : items) {
      if (it.logits.empty()) continue;
      std::memcpy(it.logits.data(), ws.logits_.data() + k * H.n_vocab,
                  static_cast<std::size_t>(H.n_vocab) * sizeof(float));
      ++k;
    }
  }
  return ok();
}

result<void> context::forward_chunk(const token_id* tokens, const float* hidden_in,
                                    float* hidden_out, std::int64_t n, logits_mode mode,
                                    float* logits) {
  const hparams& H = m_->params();
  const std::int64_t dim = H.dim;
  workspace& ws = *ws_;
  for (std::int64_t t = 0; t < n; ++t) {
    ws.row_ctx_[static_cast<std::size_t>(t)] = this;
    ws.row_pos_[static_cast<std::size_t>(t)] = pos_ + t;
  }
  TESSERA_TRY(pass(*m_, ws, pool_, reduce_, profile_ ? &times_ : nullptr, tokens, hidden_in, n));
  pos_ += n;

  if (hidden_out != nullptr) {
    std::memcpy(hidden_out, ws.x_.data(), static_cast<std::size_t>(n * dim) * sizeof(float));
  }
  if (mode != logits_mode::none) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t first = mode == logits_mode::last ? n - 1 : 0;
    const std::int64_t count = n - first;
    for (std::int64_t t = 0; t < count; ++t)
      rmsnorm(ws.x_.data() + (first + t) * dim, m_->output_norm(), ws.h_.data() + t * dim, dim,
              H.rms_eps);
    TESSERA_TRY(matmul(m_->output(), ws.h_.data(), count, logits, pool_));
    if (profile_) times_.output_s += seconds_since(t0);
  }
  return ok();
}

namespace {
// Element-wise work of a pass is split by tokens over the pool; for a few tokens the hand-off would
// cost more than the work.
template <class Fn>
void per_token(thread_pool* pool, std::int64_t n, Fn&& fn) {
  if (pool != nullptr && pool->size() > 1 && n >= 8) {
    pool->run([&](int index, int size) {
      const std::int64_t per = (n + size - 1) / size;
      const std::int64_t b = std::min(n, index * per), e = std::min(n, b + per);
      for (std::int64_t t = b; t < e; ++t) fn(t);
    });
  } else {
    for (std::int64_t t = 0; t < n; ++t) fn(t);
  }
}
}  // namespace

result<void> context::pass(const model& m, workspace& ws, thread_pool* pool,
                           const reduce_fn& reduce, stage_times* times, const token_id* tokens,
                           const float* hidden_in, std::int64_t n) {
  const hparams& H = m.params();
  const std::int64_t dim = H.dim;
  const auto t0 = std::chrono::steady_clock::now();
  if (tokens != nullptr) {
    const weight_view& e = m.token_embedding();
    const std::size_t row = *row_bytes(e.type, e.cols);
    for (std::int64_t t = 0; t < n; ++t) {
      const auto* src = static_cast<const std::byte*>(e.data) + static_cast<std::size_t>(tokens[t]) * row;
      TESSERA_TRY(dequantize_row(e.type, src, ws.x_.data() + t * dim, dim));
    }
  } else {
    std::memcpy(ws.x_.data(), hidden_in, static_cast<std::size_t>(n * dim) * sizeof(float));
  }
  const std::int64_t half = H.head_dim / 2;
  for (std::int64_t t = 0; t < n; ++t) {
    const auto p = static_cast<double>(ws.row_pos_[static_cast<std::size_t>(t)]);
    for (std::int64_t i = 0; i < half; ++i) {
      // As ops.hpp's rope(): the angle in double, its cos/sin rounded to float.
      const double theta = p * ws.inv_freq_[static_cast<std::size_t>(i)];
      ws.rope_cos_[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::cos(theta));
      ws.rope_sin_[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::sin(theta));
    }
  }
  if (times != nullptr) times->embed_s += seconds_since(t0);

  for (std::int64_t il = m.shard().first_layer; il < m.shard().last_layer; ++il) {
    TESSERA_TRY(layer_forward(m, ws, pool, reduce, times, il, n));
  }
  return ok();
}

result<void> context::layer_forward(const model& m, workspace& ws, thread_pool* pool,
                                    const reduce_fn& reduce, stage_times* times, std::int64_t il,
                                    std::int64_t n) {
  const hparams& H = m.local();
  const layer_weights& L = m.layer(il);
  const std::int64_t dim = H.dim, qd = H.q_dim(), kvd = H.kv_dim(), hd = H.head_dim;
  float* x = ws.x_.data();
  float* h = ws.h_.data();
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&](double stage_times::*acc) {
    if (times == nullptr) return;
    auto now = std::chrono::steady_clock::now();
    times->*acc += std::chrono::duration<double>(now - t0).count();
    t0 = now;
  };

  per_token(pool, n, [&](std::int64_t t) {
    rmsnorm(x + t * dim, L.attn_norm_f, h + t * dim, dim, H.rms_eps);
  });
  lap(&stage_times::norm_s);

  // q, k, v. The weights sit back to back in the arena; with one type they form one [q+2kv] x dim
  // matrix and one mat-mul (one activation quantization, one thread hand-off).
  float* q = ws.q_.data();
  float* k = ws.k_.data();
  float* v = ws.v_.data();
  const bool fused = L.wq.type == L.wk.type && L.wk.type == L.wv.type &&
                     L.wq.layout == L.wk.layout && L.wk.layout == L.wv.layout &&
                     static_cast<const std::byte*>(L.wk.data) ==
                         static_cast<const std::byte*>(L.wq.data) + inference::weight_bytes(L.wq) &&
                     static_cast<const std::byte*>(L.wv.data) ==
                         static_cast<const std::byte*>(L.wk.data) + inference::weight_bytes(L.wk);
  std::int64_t q_stride = qd, kv_stride = kvd;
  if (fused) {
    weight_view w = L.wq;
    w.rows = qd + 2 * kvd;
    TESSERA_TRY(matmul(w, h, n, q, pool));
    k = q + qd;
    v = q + qd + kvd;
    q_stride = kv_stride = qd + 2 * kvd;
  } else {
    TESSERA_TRY(matmul(L.wq, h, n, q, pool));
    TESSERA_TRY(matmul(L.wk, h, n, k, pool));
    TESSERA_TRY(matmul(L.wv, h, n, v, pool));
  }
  lap(&stage_times::qkv_s);

  // Each row's KV cache: its own sequence's, at this layer, one KV head after another; keys in
  // panels of 16 positions, values position-major (attention.hpp).
  const std::int64_t local = il - m.shard().first_layer;
  auto head_cache = [&](page_array<std::uint8_t> context::*cache, std::int64_t t,
                        std::int64_t g) {
    context* c = ws.row_ctx_[static_cast<std::size_t>(t)];
    const std::size_t per_head = static_cast<std::size_t>(key_cache_positions(c->n_ctx_)) *
                                 kv_position_bytes(c->kv_type_, hd);
    return (c->*cache).data() + static_cast<std::size_t>(local * H.n_head_kv + g) * per_head;
  };
  auto k_cache = [&](std::int64_t t, std::int64_t g) {
    return head_cache(&context::k_cache_, t, g);
  };
  auto v_cache = [&](std::int64_t t, std::int64_t g) {
    return head_cache(&context::v_cache_, t, g);
  };
  per_token(pool, n, [&](std::int64_t t) {
    float* qt = q + t * q_stride;
    float* kt = k + t * kv_stride;
    float* vt = v + t * kv_stride;
    if (L.bq) add(qt, L.bq, qt, qd);
    if (L.bk) add(kt, L.bk, kt, kvd);
    if (L.bv) add(vt, L.bv, vt, kvd);
    if (L.q_norm) {
      for (std::int64_t hh = 0; hh < H.n_head; ++hh) rmsnorm(qt + hh * hd, L.q_norm, qt + hh * hd, hd, H.rms_eps);
      for (std::int64_t hh = 0; hh < H.n_head_kv; ++hh) rmsnorm(kt + hh * hd, L.k_norm, kt + hh * hd, hd, H.rms_eps);
    }
    const float* cs = ws.rope_cos_.data() + t * (hd / 2);
    const float* sn = ws.rope_sin_.data() + t * (hd / 2);
    apply_rope(qt, H.n_head, hd, cs, sn, H.rope);
    apply_rope(kt, H.n_head_kv, hd, cs, sn, H.rope);
    const std::int64_t p = ws.row_pos_[static_cast<std::size_t>(t)];
    const kv_cache_type kvt = ws.row_ctx_[static_cast<std::size_t>(t)]->kv_type_;
    for (std::int64_t g = 0; g < H.n_head_kv; ++g) {
      store_key(kvt, kt + g * hd, hd, k_cache(t, g), p);
      store_value(kvt, vt + g * hd, hd, v_cache(t, g), p);
    }
  });
  lap(&stage_times::rope_s);

  // Attention: work items are (block, KV head) pairs, a block being up to attention_block_rows
  // consecutive rows of one sequence; the query heads of a group and the rows of a block share
  // each key and value load. Every row has been written to its cache above, so a row also sees
  // the rows before it of its own sequence in this pass (causal), and never another sequence's.
  // In a tensor-parallel slice whose ends cut a GQA group, the first and last KV heads serve only
  // the slice's part of their query heads.
  {
    const std::int64_t group = m.kv_group();
    const std::int64_t q_first = m.shard().head_begin, q_end = q_first + H.n_head;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* att = ws.att_.data();
    std::int64_t* block_first = ws.block_first_.data();
    std::int64_t n_blocks = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      if (n_blocks == 0 || t - block_first[n_blocks - 1] == attention_block_rows ||
          ws.row_ctx_[static_cast<std::size_t>(t)] !=
              ws.row_ctx_[static_cast<std::size_t>(block_first[n_blocks - 1])])
        block_first[n_blocks++] = t;
    }
    block_first[n_blocks] = n;
    const std::size_t per_thread = ws.scores_.size() / static_cast<std::size_t>(ws.threads_);
    auto work = [&](int index, int size) {
      float* scratch = ws.scores_.data() + static_cast<std::size_t>(index) * per_thread;
      const std::size_t slots = static_cast<std::size_t>(attention_block_rows * group);
      const float** qs = ws.block_q_.data() + static_cast<std::size_t>(index) * slots;
      float** outs = ws.block_out_.data() + static_cast<std::size_t>(index) * slots;
      std::int64_t* n_att = ws.block_n_att_.data() + static_cast<std::size_t>(index) * slots;
      for (std::int64_t item = index; item < n_blocks * H.n_head_kv; item += size) {
        const std::int64_t b = item / H.n_head_kv, g = item % H.n_head_kv;
        const std::int64_t kv = m.kv_first() + g;  // global KV head
        const std::int64_t h0 = std::max(q_first, kv * group) - q_first;  // local query heads
        const std::int64_t hn = std::min(q_end, (kv + 1) * group) - q_first - h0;
        std::int64_t nq = 0;
        for (std::int64_t t = block_first[b]; t < block_first[b + 1]; ++t) {
          for (std::int64_t i = 0; i < hn; ++i, ++nq) {
            qs[nq] = q + t * q_stride + (h0 + i) * hd;
            outs[nq] = att + t * qd + (h0 + i) * hd;
            n_att[nq] = ws.row_pos_[static_cast<std::size_t>(t)] + 1;
          }
        }
        attention_block a;
        a.q = qs;
        a.out = outs;
        a.n_att = n_att;
        a.n_q = nq;
        a.type = ws.row_ctx_[static_cast<std::size_t>(block_first[b])]->kv_type_;
        a.keys = k_cache(block_first[b], g);
        a.values = v_cache(block_first[b], g);
        a.head_dim = hd;
        a.scale = scale;
        a.scratch = scratch;
        attend(a);
      }
    };
    if (pool != nullptr && (pool->size() > 1 || pool->gated())) {
      pool->run(work);
    } else {
      work(0, 1);
    }
  }
  lap(&stage_times::attention_s);

  TESSERA_TRY(matmul(L.wo, ws.att_.data(), n, ws.tmp_.data(), pool));
  if (reduce) TESSERA_TRY(reduce(std::span<float>(ws.tmp_.data(), static_cast<std::size_t>(n * dim))));
  lap(&stage_times::wo_s);

  per_token(pool, n, [&](std::int64_t t) {
    const float* a = ws.tmp_.data() + t * dim;
    float* xt = x + t * dim;
    add(xt, a, xt, dim);  // the attention output's residual
    rmsnorm(xt, L.ffn_norm_f, h + t * dim, dim, H.rms_eps);
  });
  lap(&stage_times::norm_s);

  if (H.is_moe()) {
    TESSERA_TRY(moe_forward(m, ws, pool, L, n));
    lap(&stage_times::ffn_up_s);
    if (reduce)
      TESSERA_TRY(reduce(std::span<float>(ws.tmp_.data(), static_cast<std::size_t>(n * dim))));
    add(x, ws.tmp_.data(), x, n * dim);
    lap(&stage_times::ffn_down_s);
    return ok();
  }

  const std::int64_t ffn = H.ffn;
  const bool fused_ffn =
      L.w_gate.type == L.w_up.type && L.w_gate.layout == L.w_up.layout &&
      static_cast<const std::byte*>(L.w_up.data) ==
          static_cast<const std::byte*>(L.w_gate.data) + inference::weight_bytes(L.w_gate);
  float* gate = ws.gate_.data();
  float* up = ws.up_.data();
  if (fused_ffn) {
    weight_view w = L.w_gate;
    w.rows = 2 * ffn;
    TESSERA_TRY(matmul(w, h, n, gate, pool));
    // gate_ rows are [gate | up] per token: combine in place into the first ffn floats of each row,
    // then compact so the down projection reads packed [n][ffn].
    per_token(pool, n, [&](std::int64_t t) {
      float* row = gate + t * 2 * ffn;
      swiglu(row, row + ffn, up + t * ffn, ffn);
    });
  } else {
    TESSERA_TRY(matmul(L.w_gate, h, n, gate, pool));
    TESSERA_TRY(matmul(L.w_up, h, n, up, pool));
    swiglu(gate, up, up, n * ffn);
  }
  lap(&stage_times::ffn_up_s);
  TESSERA_TRY(matmul(L.w_down, up, n, ws.tmp_.data(), pool));
  if (reduce) TESSERA_TRY(reduce(std::span<float>(ws.tmp_.data(), static_cast<std::size_t>(n * dim))));
  add(x, ws.tmp_.data(), x, n * dim);
  lap(&stage_times::ffn_down_s);
  return ok();
}

result<void> context::moe_forward(const model& m, workspace& ws, thread_pool* pool,
                                  const layer_weights& L, std::int64_t n) {
  const hparams& G = m.params();
  const hparams& H = m.local();
  const std::int64_t dim = H.dim, eff = H.expert_ffn, n_exp = G.n_expert, k = G.n_expert_used;
  const std::int64_t first = m.expert_first(), local = H.n_expert;
  const float* h = ws.h_.data();

  // 1. Route: every shard computes every row's choice from the whole router (the rows' hidden
  //    states are equal on every rank of a group), so the ranks agree without talking.
  TESSERA_TRY(matmul(L.router, h, n, ws.router_.data(), pool));
  for (std::int64_t t = 0; t < n; ++t) {
    float* p = ws.router_.data() + t * n_exp;
    softmax(p, n_exp);
    auto* c = ws.choice_.data() + t * k;
    // Top k by probability, ties to the lower index (a partial selection: k is small).
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < n_exp; ++e) {
        bool taken = false;
        for (std::int64_t i = 0; i < j; ++i)
          taken = taken || c[i].first == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      c[j] = {static_cast<std::int32_t>(best), p[best]};
    }
    float sum = 0;
    for (std::int64_t j = 0; j < k; ++j)
      sum += c[j].second;
    for (std::int64_t j = 0; j < k; ++j)
      c[j].second /= sum;
  }

  // 2. The rows of each local expert, in row order (a counting sort over the choices).
  std::int64_t* off = ws.expert_offset_.data();
  std::fill(off, off + local + 1, 0);
  for (std::int64_t t = 0; t < n * k; ++t) {
    const std::int64_t e = ws.choice_[static_cast<std::size_t>(t)].first - first;
    if (e >= 0 && e < local) ++off[e + 1];
  }
  for (std::int64_t e = 0; e < local; ++e) {
    if (off[e + 1] > 0)
      m.expert_load_[static_cast<std::size_t>(e)].fetch_add(static_cast<std::uint64_t>(off[e + 1]),
                                                            std::memory_order_relaxed);
    off[e + 1] += off[e];
  }
  {
    std::int64_t* fill = ws.expert_fill_.data();
    std::copy(off, off + local, fill);
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t j = 0; j < k; ++j) {
        const auto& [ge, w] = ws.choice_[static_cast<std::size_t>(t * k + j)];
        const std::int64_t e = ge - first;
        if (e >= 0 && e < local) ws.expert_rows_[static_cast<std::size_t>(fill[e]++)] = {t, w};
      }
  }

  // 3. Each expert with rows, in expert order: one mat-mul per projection over all its rows (a
  //    prefill chunk's tokens grouped, not one per token), only its own weight rows read. Every
  //    row's sum takes its experts in ascending order, whatever else is in the batch.
  float* out = ws.tmp_.data();
  std::fill(out, out + n * dim, 0.0f);
  const std::size_t gate_row = *row_bytes(L.exp_gate.type, dim);
  const std::size_t up_row = *row_bytes(L.exp_up.type, dim);
  // Interleaved: expert e's gate rows then its up rows, 2 * eff rows per expert.
  const std::size_t expert_stride = L.exp_gate_up ? 2 : 1;
  const std::size_t down_row = *row_bytes(L.exp_down.type, eff);
  float* gate = ws.gate_.data();
  float* up = ws.up_.data();
  for (std::int64_t e = 0; e < local; ++e) {
    const std::int64_t rows = off[e + 1] - off[e];
    if (rows == 0) continue;
    const auto* routed = ws.expert_rows_.data() + off[e];
    // The rows in one block: h itself when the expert takes every row in order (decode of one
    // sequence), else gathered.
    const float* xe = h;
    if (rows != n) {
      for (std::int64_t i = 0; i < rows; ++i)
        std::memcpy(ws.gathered_.data() + i * dim, h + routed[i].first * dim,
                    static_cast<std::size_t>(dim) * sizeof(float));
      xe = ws.gathered_.data();
    }
    weight_view wg = L.exp_gate, wu = L.exp_up, wd = L.exp_down;
    wg.rows = wu.rows = eff;
    wd.rows = dim;
    wg.data = static_cast<const std::byte*>(L.exp_gate.data) +
              static_cast<std::size_t>(e * eff) * expert_stride * gate_row;
    wu.data = static_cast<const std::byte*>(L.exp_up.data) +
              static_cast<std::size_t>(e * eff) * expert_stride * up_row;
    wd.data = static_cast<const std::byte*>(L.exp_down.data) +
              static_cast<std::size_t>(e * dim) * down_row;
    if (L.exp_gate_up) {
      // One mat-mul: rows of [gate | up] per token, combined into packed [rows][eff].
      wg.rows = 2 * eff;
      TESSERA_TRY(matmul(wg, xe, rows, gate, pool));
      for (std::int64_t i = 0; i < rows; ++i) {
        const float* row = gate + i * 2 * eff;
        swiglu(row, row + eff, up + i * eff, eff);
      }
    } else {
      TESSERA_TRY(matmul(wg, xe, rows, gate, pool));
      TESSERA_TRY(matmul(wu, xe, rows, up, pool));
      swiglu(gate, up, up, rows * eff);
    }
    TESSERA_TRY(matmul(wd, up, rows, ws.expert_out_.data(), pool));
    for (std::int64_t i = 0; i < rows; ++i) {
      const float w = routed[i].second;
      const float* y = ws.expert_out_.data() + i * dim;
      float* o = out + routed[i].first * dim;
      for (std::int64_t d = 0; d < dim; ++d)
        o[d] += w * y[d];
    }
  }
  return ok();
}

}  // namespace tessera::inference::model