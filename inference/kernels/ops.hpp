// The small element-wise operations of a llama-family forward pass (attention: attention.hpp).
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

}  // namespace tessera::inference
