// Tensor element types, GGML block layouts and the scalar reference (de)quantizers.
//
// The block structs are bit-for-bit the layouts GGUF files use (ggml's ggml-common.h), so a tensor
// read from a file can be cast to an array of blocks. Everything here is scalar, portable and the
// reference that every SIMD path in inference/kernels is tested against. fp16 <-> f32 row
// conversions use F16C when the CPU has it (chosen at run time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "actors/base/result.hpp"

namespace tessera::inference {

/// Element types a tensor may have. The numbers are GGML's type ids as stored in GGUF files.
enum class tensor_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q8_0 = 8,
  q4_k = 12,
  q6_k = 14,
  bf16 = 30,
};

/// The supported type with GGML id `ggml_id`, or nullopt (unknown or unsupported id).
[[nodiscard]] std::optional<tensor_type> tensor_type_from_ggml(std::uint32_t ggml_id) noexcept;
/// GGML's name of the type ("f32", "q8_0", "q4_K", ...).
[[nodiscard]] std::string_view to_string(tensor_type type) noexcept;
/// Elements per block: 1 for f32/f16/bf16, 32 for q8_0/q4_0, 256 for q4_K/q6_K.
[[nodiscard]] std::int64_t block_elements(tensor_type type) noexcept;
/// Bytes per block (4, 2, 2, 34, 18, 144, 210).
[[nodiscard]] std::size_t block_bytes(tensor_type type) noexcept;
/// Bytes of a row of `n` elements; an error when n is negative or not a multiple of the block size.
[[nodiscard]] result<std::size_t> row_bytes(tensor_type type, std::int64_t n);
/// True for the block-quantized types (q8_0, q4_0, q4_K, q6_K).
[[nodiscard]] bool is_quantized(tensor_type type) noexcept;

// ---- half-precision scalars -------------------------------------------------------------------

/// IEEE binary16 -> f32 (exact; subnormals, inf and NaN preserved).
[[nodiscard]] inline float fp16_to_fp32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in f32.
    float v = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

/// f32 -> IEEE binary16, round to nearest even; overflow gives inf, NaN stays a (quiet) NaN.
[[nodiscard]] std::uint16_t fp32_to_fp16(float x) noexcept;

/// bfloat16 -> f32 (exact).
[[nodiscard]] inline float bf16_to_fp32(std::uint16_t h) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

/// f32 -> bfloat16, round to nearest even; NaN stays a quiet NaN.
[[nodiscard]] inline std::uint16_t fp32_to_bf16(float x) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// Row conversions; F16C when the CPU has it (same results as the scalar functions above).
void fp16_to_fp32_row(const std::uint16_t* x, float* y, std::int64_t n) noexcept;
void fp32_to_fp16_row(const float* x, std::uint16_t* y, std::int64_t n) noexcept;
void bf16_to_fp32_row(const std::uint16_t* x, float* y, std::int64_t n) noexcept;
void fp32_to_bf16_row(const float* x, std::uint16_t* y, std::int64_t n) noexcept;
/// Whether the row conversions above use F16C on this CPU.
[[nodiscard]] bool have_f16c() noexcept;

// ---- GGML block layouts ----------------------------------------------------------------------

inline constexpr int qk8_0 = 32;  ///< elements per q8_0 block
inline constexpr int qk4_0 = 32;  ///< elements per q4_0 block
inline constexpr int qk_k = 256;  ///< elements per K-quant super-block

#pragma pack(push, 1)
/// q8_0: x = d * qs[i].
struct block_q8_0 {
  std::uint16_t d;  ///< fp16 scale
  std::int8_t qs[qk8_0];
};
/// q4_0: x[i] = d * ((qs[i] & 15) - 8), x[i + 16] = d * ((qs[i] >> 4) - 8).
struct block_q4_0 {
  std::uint16_t d;  ///< fp16 scale
  std::uint8_t qs[qk4_0 / 2];
};
/// q4_K: 8 sub-blocks of 32; x = d * sc[s] * q - dmin * m[s], sc and m 6-bit packed in `scales`.
/// qs[32 j + l]: low nibble is element 64 j + l, high nibble element 64 j + 32 + l.
struct block_q4_k {
  std::uint16_t d;     ///< fp16 super-block scale of the sub-block scales
  std::uint16_t dmin;  ///< fp16 super-block scale of the sub-block mins
  std::uint8_t scales[12];
  std::uint8_t qs[qk_k / 2];
};
/// q6_K: 16 sub-blocks of 16; x = d * scales[s] * (q - 32), q 6-bit: low 4 bits in ql, high 2 in
/// qh. Within each half h (128 elements), for l < 32: ql[64h + l] holds elements l (low nibble) and
/// l + 64 (high nibble), ql[64h + l + 32] holds l + 32 and l + 96; qh[32h + l] holds the high bits
/// of l, l + 32, l + 64, l + 96 in bit pairs 0, 2, 4, 6.
struct block_q6_k {
  std::uint8_t ql[qk_k / 2];
  std::uint8_t qh[qk_k / 4];
  std::int8_t scales[qk_k / 16];
  std::uint16_t d;  ///< fp16 super-block scale
};
/// q8_K: the activation format paired with K-quant weights; bsums[g] = sum of qs[16 g .. 16 g + 15].
struct block_q8_k {
  float d;
  std::int8_t qs[qk_k];
  std::int16_t bsums[qk_k / 16];
};
#pragma pack(pop)

static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_k) == 144);
static_assert(sizeof(block_q6_k) == 210);
static_assert(sizeof(block_q8_k) == 292);

/// The 6-bit scale and min of sub-block `j` (0..7) of a q4_K block's packed `scales`.
inline void q4_k_scale_min(int j, const std::uint8_t* scales, std::uint8_t& sc,
                           std::uint8_t& m) noexcept {
  if (j < 4) {
    sc = scales[j] & 63;
    m = scales[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

/// All eight 6-bit scales and mins of a q4_K block at once, branch-free on 32-bit words (the same
/// values as q4_k_scale_min() for j = 0..7).
inline void q4_k_unpack_scales(const std::uint8_t* scales, std::uint8_t* sc,
                               std::uint8_t* m) noexcept {
  std::uint32_t a[3];
  std::memcpy(a, scales, 12);
  const std::uint32_t s_lo = a[0] & 0x3f3f3f3fu;
  const std::uint32_t m_lo = a[1] & 0x3f3f3f3fu;
  const std::uint32_t s_hi = (a[2] & 0x0f0f0f0fu) | (((a[0] >> 6) & 0x03030303u) << 4);
  const std::uint32_t m_hi = ((a[2] >> 4) & 0x0f0f0f0fu) | (((a[1] >> 6) & 0x03030303u) << 4);
  std::memcpy(sc, &s_lo, 4);
  std::memcpy(sc + 4, &s_hi, 4);
  std::memcpy(m, &m_lo, 4);
  std::memcpy(m + 4, &m_hi, 4);
}

// ---- scalar reference quantizers -------------------------------------------------------------
//
// Preconditions (asserted): n >= 0 and n a multiple of the type's block size. Use the checked
// quantize_row()/dequantize_row() for input that has not been validated.
//
// Round-trip error bounds (tested in tests/inference/kernels/quant_test.cpp), per element x of a
// block with amax = max |x| over the block (sub-block for K-quants):
//   q8_0: |x - x'| <= amax / 200      q4_0: |x - x'| <= amax / 7.5
//   q4_K: |x - x'| <= 0.5 * d * sc + 1e-6 * amax   (sc the sub-block's 6-bit scale; step ~ range/15)
//   q6_K: |x - x'| <= 0.5 * d * sc + 1e-6 * amax   (step ~ amax/31)
//   f16: relative 2^-11 (normal range), bf16: relative 2^-8.

void quantize_row_f32(const float* x, void* y, std::int64_t n) noexcept;
void quantize_row_f16(const float* x, void* y, std::int64_t n) noexcept;
void quantize_row_bf16(const float* x, void* y, std::int64_t n) noexcept;
void quantize_row_q8_0(const float* x, void* y, std::int64_t n) noexcept;
void quantize_row_q4_0(const float* x, void* y, std::int64_t n) noexcept;
void quantize_row_q4_k(const float* x, void* y, std::int64_t n) noexcept;
void quantize_row_q6_k(const float* x, void* y, std::int64_t n) noexcept;
/// Activations for K-quant dot products (n a multiple of 256).
void quantize_row_q8_k(const float* x, void* y, std::int64_t n) noexcept;

void dequantize_row_f32(const void* x, float* y, std::int64_t n) noexcept;
void dequantize_row_f16(const void* x, float* y, std::int64_t n) noexcept;
void dequantize_row_bf16(const void* x, float* y, std::int64_t n) noexcept;
void dequantize_row_q8_0(const void* x, float* y, std::int64_t n) noexcept;
void dequantize_row_q4_0(const void* x, float* y, std::int64_t n) noexcept;
void dequantize_row_q4_k(const void* x, float* y, std::int64_t n) noexcept;
void dequantize_row_q6_k(const void* x, float* y, std::int64_t n) noexcept;
void dequantize_row_q8_k(const void* x, float* y, std::int64_t n) noexcept;

/// Quantizes `n` floats into `y` (row_bytes(type, n) bytes). Error when n is not a multiple of
/// the block size or negative, or when a pointer is null.
[[nodiscard]] result<void> quantize_row(tensor_type type, const float* x, void* y, std::int64_t n);
/// Dequantizes `n` elements of `type` at `x` into `y`. Same errors as quantize_row().
[[nodiscard]] result<void> dequantize_row(tensor_type type, const void* x, float* y,
                                          std::int64_t n);

}  // namespace tessera::inference
