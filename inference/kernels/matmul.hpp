// Mat-vec and mat-mul of a weight matrix (any supported tensor type) with f32 activations.
//
//   y[t][r] = sum_c W[r][c] * x[t][c]     for r < rows, t < n_tokens
//
// Activations are converted to the form the weight type pairs with (as llama.cpp does): q8_0
// blocks for q8_0/q4_0 weights, q8_K blocks (per-256 scale, per-16 sums) for q4_K/q6_K, f32 for
// f32/f16/bf16. Decode (n_tokens = 1) streams the weights once, several rows at a time; prefill
// (n_tokens > 1) uses register tiles of up to 4 rows x 4 tokens so each weight block loaded is
// used for several tokens. With a thread pool, rows are split into contiguous ranges; the value of
// each y[t][r] does not depend on the split, so any thread count gives bit-identical results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "actors/base/result.hpp"
#include "inference/kernels/quant.hpp"
#include "inference/kernels/thread_pool.hpp"

namespace tessera::inference {

/// How a weight matrix's bytes are arranged.
///  - rows: GGUF's own layout, one row after another.
///  - panels: (q8_0, q4_K, f16) 16 rows interleaved so that one load holds a few columns of 16
///    rows (layouts in gemm_kernels.hpp). A mat-mul then needs no horizontal sums: each int32 lane
///    of a vpdpbusd is one row's exact block sum, and prefill reuses one weight load for 8 tokens
///    where the row tiles paid a conversion and a multiply per 4 products (issue 35). 16 rows take
///    the same bytes in both layouts, so a run of whole panels is the same byte range as its rows.
enum class weight_layout : std::uint8_t { rows, panels };

/// A weight matrix: `rows` rows of `cols` elements of `type`; row r starts at
/// data + r * row_stride_bytes (0 means packed: row_bytes(type, cols)). Not owning.
/// In panels, rows is a multiple of 16 and row_stride_bytes is 0.
struct weight_view {
  tensor_type type = tensor_type::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const void* data = nullptr;
  std::size_t row_stride_bytes = 0;
  weight_layout layout = weight_layout::rows;
};

/// Whether a matrix of this type and shape can be stored in panels.
[[nodiscard]] bool panels_supported(tensor_type type, std::int64_t rows,
                                    std::int64_t cols) noexcept;

/// Rearranges `rows` packed rows at `data` into panels, in place (panels_supported must hold).
/// Values are unchanged: unpack_panels() gives the rows back byte for byte.
void pack_panels(tensor_type type, void* data, std::int64_t rows, std::int64_t cols);
/// The inverse of pack_panels().
void unpack_panels(tensor_type type, void* data, std::int64_t rows, std::int64_t cols);

inline constexpr std::int64_t max_matmul_dim = std::int64_t{1} << 24;     ///< rows, cols
inline constexpr std::int64_t max_matmul_tokens = std::int64_t{1} << 16;  ///< n_tokens

/// y = W x for `n_tokens` activation rows: x is [n_tokens][cols] and y [n_tokens][rows], both
/// f32, packed. Runs on `pool` when given (the caller's thread takes part), else on the caller.
/// Errors (nothing is written): unsupported type, cols not a multiple of the type's block size,
/// rows/cols/n_tokens out of range, a row stride shorter than a row, null pointers, panels of a
/// type or shape panels_supported() refuses.
[[nodiscard]] result<void> matmul(const weight_view& w, const float* x, std::int64_t n_tokens,
                                  float* y, thread_pool* pool = nullptr);

/// Bytes of weights matmul() reads once per call (what decode streams from memory).
[[nodiscard]] std::size_t weight_bytes(const weight_view& w) noexcept;

}  // namespace tessera::inference
