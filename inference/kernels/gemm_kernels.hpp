// Internal: the per-ISA mat-mul kernels behind matmul(). Not part of the public API.
//
// A kernel computes y[t * y_stride + r] = dot(weight row r, activation row t) for every r < rows,
// t < n_tokens, with the activation rows already in the format its weight type pairs with
// (activation_format()). Contract every kernel keeps: the value computed for one (r, t) does not
// depend on rows, n_tokens or where the caller split them, so a threaded mat-mul equals the
// single-threaded one bit for bit and prefill equals decode for the same token.
#pragma once

#include <cstddef>
#include <cstdint>

#include "inference/kernels/cpu.hpp"
#include "inference/kernels/quant.hpp"

namespace tessera::inference::detail {

/// How activations are stored for a weight type: f32 rows for float weights, q8_0 blocks for
/// q8_0/q4_0, q8_K blocks for the K-quants, q8_0 blocks with their scale widened and their sum
/// taken (block_q8_0_act) for q8_0 weights in panels.
enum class act_format { f32, q8_0, q8_k, q8_0_panel };

/// The activation block of a q8_0 panel mat-mul: the same integer levels and fp16-rounded scale as
/// a block_q8_0, with the scale already in f32 (broadcast straight from memory) and
/// bias = -128 * sum(qs), which takes off what the VNNI kernel's unsigned weights (w + 128) add.
struct block_q8_0_act {
  float d;
  std::int32_t bias;
  std::int8_t qs[qk8_0];
};
static_assert(sizeof(block_q8_0_act) == 40);

/// q8_0 weights in panels (weight_layout::panels, matmul.hpp): 16 rows side by side. For panel p,
/// block b (32 columns), the 512 level bytes sit at p * panel + b * 512, 64 per group of 4 columns
/// g: byte 4 i + j is row 16 p + i, column 32 b + 4 g + j, stored as level + 128 (unsigned, the
/// form vpdpbusd multiplies); the 16 fp16 scales sit after all the panel's levels, at
/// p * panel + nb * 512 + 32 b. A panel is as large as its 16 rows were (16 * nb * 34 bytes).
///
/// q4_K weights in panels: per super-block b (256 columns) of panel p, 2304 bytes at
/// p * panel + b * 2304:
///   [0, 2048)     levels: 64-byte chunk k (k < 32), byte 4 i + j: low nibble = row i, column
///                 256 b + 8 k + j; high nibble = column 256 b + 8 k + 4 + j (levels 0..15, the
///                 unsigned operand of vpdpbusd as they are);
///   [2048, 2240)  the 12 packed scale bytes, byte k of all 16 rows together (k * 16 + i), so
///                 16 rows' 6-bit scales and mins unpack with a few vector shifts;
///   [2240, 2272)  d of the 16 rows (fp16); [2272, 2304) dmin.
inline constexpr int panel_rows = 16;
inline constexpr std::size_t q4_k_panel_block = 2304;
static_assert(q4_k_panel_block == panel_rows * sizeof(block_q4_k));
[[nodiscard]] inline std::size_t q8_0_panel_bytes(std::int64_t cols) noexcept {
  return static_cast<std::size_t>(cols / qk8_0) * panel_rows * sizeof(block_q8_0);
}
///
/// f16 weights in panels: column-major, column c's 16 values (fp16) at p * panel + 32 c.
///
/// Bytes of one panel (16 rows) of a type panels support.
[[nodiscard]] inline std::size_t panel_bytes(tensor_type t, std::int64_t cols) noexcept {
  switch (t) {
    case tensor_type::q8_0:
      return q8_0_panel_bytes(cols);
    case tensor_type::q4_k:
      return static_cast<std::size_t>(cols / qk_k) * q4_k_panel_block;
    default:
      return static_cast<std::size_t>(cols) * panel_rows * sizeof(std::uint16_t);
  }
}

[[nodiscard]] act_format activation_format(tensor_type w) noexcept;
/// Bytes of one activation row of `cols` elements (cols a multiple of the weight block size).
[[nodiscard]] std::size_t activation_row_bytes(act_format f, std::int64_t cols) noexcept;

struct gemm_args {
  const std::uint8_t* w = nullptr;  ///< row r starts at w + r * w_stride
  std::size_t w_stride = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const std::uint8_t* x = nullptr;  ///< activation row t starts at x + t * x_stride
  std::size_t x_stride = 0;
  std::int64_t n_tokens = 0;
  float* y = nullptr;
  std::int64_t y_stride = 0;
};

using gemm_fn = void (*)(const gemm_args&) noexcept;

/// One kernel per weight type, in the order of type_slot(), and the panel kernels (the args' rows
/// a multiple of panel_rows, w the first panel, w_stride unused).
struct kernel_table {
  gemm_fn gemm[7];
  gemm_fn q8_0_panels;  ///< q8_0 weights, act_format::q8_0_panel activations
  gemm_fn q4_k_panels;  ///< q4_K weights, act_format::q8_k activations
  gemm_fn f16_panels;   ///< f16 weights, f32 activations
};

[[nodiscard]] int type_slot(tensor_type t) noexcept;

[[nodiscard]] const kernel_table& scalar_kernels() noexcept;
[[nodiscard]] const kernel_table& avx2_kernels() noexcept;
[[nodiscard]] const kernel_table& avx512_kernels() noexcept;
[[nodiscard]] const kernel_table& kernels_for(isa level) noexcept;

/// Activation quantizers per ISA (identical results: the integer levels and scales are the
/// same on every path, so only the float summation order of the dot products differs).
void quantize_activations(act_format f, const float* x, std::uint8_t* out, std::int64_t cols,
                          isa level) noexcept;
void quantize_row_q8_0_avx2(const float* x, void* y, std::int64_t n) noexcept;

/// In AddressSanitizer builds the per-ISA kernel files (gemm_avx2.cpp, gemm_avx512.cpp) are not
/// instrumented (inference/kernels/CMakeLists.txt), so their callers check here, once a call,
/// every range a kernel will read or write: `rows` rows of `row_bytes` bytes, `stride` bytes apart,
/// from `p`. When a byte of them is not addressable this reports as ASan does (the stack, the
/// buffer's allocation) and stops; `what` names the range. A no-op in other builds.
void check_rows_addressable(const void* p, std::int64_t rows, std::size_t stride,
                            std::size_t row_bytes, const char* what) noexcept;

}  // namespace tessera::inference::detail
