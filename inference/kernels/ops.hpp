// The small element-wise and attention operations of a llama-family forward pass.
//
// The KV cache is F16 (as llama.cpp's default): it halves the bytes attention streams per token
// and matches the reference numerics; keys and values are rounded once when stored
// (fp32_to_fp16_row) and every product is accumulated in f32.
#pragma once

#include <cstdint>

namespace tessera::inference {

/// y = x / sqrt(mean(x^2) + eps) * weight; `weight` may be null (no scaling); y may equal x.
void rmsnorm(const float* x, const float* weight, float* y, std::int64_t n, float eps) noexcept;

/// How RoPE pairs the elements of a head: llama rotates (x[2i], x[2i+1]); NeoX (qwen2/3) rotates
/// (x[i], x[i + head_dim/2]).
enum class rope_mode { normal, neox };

/// Rotates `n_heads` consecutive heads of `head_dim` (even) elements in place for position `pos`:
/// pair i turns by pos * freq_base^(-2i / head_dim).
void rope(float* x, std::int64_t n_heads, std::int64_t head_dim, std::int64_t pos,
          float freq_base, rope_mode mode) noexcept;

/// In-place softmax over n > 0 elements (max subtracted first; -inf entries get 0).
void softmax(float* x, std::int64_t n) noexcept;

/// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); out may alias either input.
void swiglu(const float* gate, const float* up, float* out, std::int64_t n) noexcept;

/// out = a + b; out may alias either input.
void add(const float* a, const float* b, float* out, std::int64_t n) noexcept;

/// Attention scores of `n_q` query heads that share one KV head against `n_ctx` cached keys:
/// scores[i * n_ctx + j] = scale * dot(q + i * q_stride, k + j * k_stride) over head_dim elements
/// (q f32, k F16; strides in elements). Uses the active ISA's F16 mat-mul kernel.
void attention_scores_f16(const float* q, std::int64_t n_q, std::int64_t q_stride,
                          const std::uint16_t* k, std::int64_t k_stride, std::int64_t n_ctx,
                          std::int64_t head_dim, float scale, float* scores) noexcept;

/// out[d] = sum_j p[j] * v[j * v_stride + d] for d < head_dim (v F16; weighted sum of values).
void attention_values_f16(const float* p, std::int64_t n_ctx, const std::uint16_t* v,
                          std::int64_t v_stride, std::int64_t head_dim, float* out) noexcept;

}  // namespace tessera::inference
