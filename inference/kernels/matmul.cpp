#include "inference/kernels/matmul.hpp"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "inference/kernels/gemm_kernels.hpp"

namespace tessera::inference {

namespace {

// A weight matrix's row in bytes, and the distance between rows (row_stride_bytes, or the row).
struct row_layout {
  std::size_t row;
  std::size_t stride;
};

result<row_layout> validate(const weight_view& w, const float* x, std::int64_t n_tokens,
                            const float* y) {
  if (!tensor_type_from_ggml(static_cast<std::uint32_t>(w.type))) {
    return make_error(errc::unsupported, "matmul: weight type id {} is not supported",
                      static_cast<std::uint32_t>(w.type));
  }
  if (w.rows < 0 || w.rows > max_matmul_dim || w.cols <= 0 || w.cols > max_matmul_dim) {
    return make_error(errc::invalid_argument,
                      "matmul: weight shape {}x{} is outside [0, {}] x [1, {}]", w.rows, w.cols,
                      max_matmul_dim, max_matmul_dim);
  }
  if (n_tokens < 0 || n_tokens > max_matmul_tokens) {
    return make_error(errc::invalid_argument, "matmul: {} tokens is outside [0, {}]", n_tokens,
                      max_matmul_tokens);
  }
  auto row = row_bytes(w.type, w.cols);
  if (!row) {
    return make_error(errc::invalid_argument, "matmul: weight {}x{}: {}", w.rows, w.cols,
                      row.error().message);
  }
  const std::size_t stride = w.row_stride_bytes == 0 ? *row : w.row_stride_bytes;
  if (stride < *row) {
    return make_error(errc::invalid_argument,
                      "matmul: row stride {} B is shorter than a row of {} {} elements ({} B)",
                      stride, w.cols, to_string(w.type), *row);
  }
  if (w.layout == weight_layout::panels &&
      (!panels_supported(w.type, w.rows, w.cols) || stride != *row)) {
    return make_error(errc::invalid_argument,
                      "matmul: a {}x{} {} weight cannot be in panels (q8_0, q4_K or f16, "
                      "rows a multiple of {}, no row stride)",
                      w.rows, w.cols, to_string(w.type), detail::panel_rows);
  }
  if (w.rows > 0 && n_tokens > 0 && (w.data == nullptr || x == nullptr || y == nullptr)) {
    return make_error(errc::invalid_argument, "matmul: null weight, input or output buffer");
  }
  return row_layout{*row, stride};
}

// Where panel bytes live (layouts in gemm_kernels.hpp). q8_0: the level byte of (panel row i,
// column c). q4_K: the byte holding the nibble of (row i, column c) within its super-block, and
// whether it is the high nibble.
std::size_t q8_0_level_offset(std::int64_t i, std::int64_t c) noexcept {
  const std::int64_t b = c / qk8_0, g = (c % qk8_0) / 4, j = c % 4;
  return static_cast<std::size_t>(b * 512 + g * 64 + i * 4 + j);
}
std::pair<std::size_t, bool> q4_k_level_offset(std::int64_t i, std::int64_t c) noexcept {
  const std::int64_t k = c / 8, j = c % 4;
  return {static_cast<std::size_t>(k * 64 + i * 4 + j), (c % 8) >= 4};
}
// Storing the level (0..15) of element e of a q4_K block (GGUF's nibble order: element e is in
// qs[32 (e / 64) + e % 32], low nibble when e % 64 < 32).
void q4_k_set(block_q4_k& b, int e, int level) noexcept {
  const int l = e % 64;
  std::uint8_t& byte = b.qs[32 * (e / 64) + l % 32];
  byte = l < 32 ? static_cast<std::uint8_t>((byte & 0xF0) | level)
                : static_cast<std::uint8_t>((byte & 0x0F) | (level << 4));
}

// Converts one panel between 16 plain rows (`rows`) and the panel layout (`panel`), either way.
void convert_panel(tensor_type type, std::uint8_t* rows, std::uint8_t* panel, std::int64_t cols,
                   bool to_panel) {
  const int n = detail::panel_rows;
  if (type == tensor_type::f16) {  // column-major: column c's 16 values at 32 c
    auto* r16 = reinterpret_cast<std::uint16_t*>(rows);
    auto* p16 = reinterpret_cast<std::uint16_t*>(panel);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t c = 0; c < cols; ++c) {
        if (to_panel)
          p16[c * n + i] = r16[i * cols + c];
        else
          r16[i * cols + c] = p16[c * n + i];
      }
    }
    return;
  }
  if (type == tensor_type::q8_0) {
    const std::int64_t nb = cols / qk8_0;
    auto* blocks = reinterpret_cast<block_q8_0*>(rows);
    auto* scales = reinterpret_cast<std::uint16_t*>(panel + nb * 512);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t b = 0; b < nb; ++b) {
        block_q8_0& blk = blocks[i * nb + b];
        std::uint16_t& d = scales[b * n + i];
        if (to_panel)
          std::memcpy(&d, &blk.d, sizeof(d));
        else
          std::memcpy(&blk.d, &d, sizeof(d));
        for (int k = 0; k < qk8_0; ++k) {
          std::uint8_t& level = panel[q8_0_level_offset(i, b * qk8_0 + k)];
          if (to_panel)
            level = static_cast<std::uint8_t>(static_cast<std::uint8_t>(blk.qs[k]) ^ 0x80u);
          else
            blk.qs[k] = static_cast<std::int8_t>(level ^ 0x80u);
        }
      }
    }
    return;
  }
  const std::int64_t nb = cols / qk_k;
  auto* blocks = reinterpret_cast<block_q4_k*>(rows);
  for (std::int64_t b = 0; b < nb; ++b) {
    std::uint8_t* sb = panel + b * detail::q4_k_panel_block;
    auto* d = reinterpret_cast<std::uint16_t*>(sb + 2240);
    auto* dmin = reinterpret_cast<std::uint16_t*>(sb + 2272);
    for (std::int64_t i = 0; i < n; ++i) {
      block_q4_k& blk = blocks[i * nb + b];
      if (to_panel) {
        std::memcpy(&d[i], &blk.d, 2);
        std::memcpy(&dmin[i], &blk.dmin, 2);
        for (int k = 0; k < 12; ++k)
          sb[2048 + k * n + i] = blk.scales[k];
        // Chunk k holds columns 8k..8k+7, all in one half of one 64-column group of GGUF's
        // nibble order (q4_k_set): a straight loop, as loading a q4_K model packs every block.
        for (int k = 0; k < 32; ++k) {
          const std::uint8_t* src = blk.qs + 32 * (k / 8) + 8 * (k % 4);
          const int shift = (k % 8) < 4 ? 0 : 4;
          for (int j = 0; j < 4; ++j) {
            const int lo = (src[j] >> shift) & 0xF, hi = (src[j + 4] >> shift) & 0xF;
            sb[k * 64 + i * 4 + j] = static_cast<std::uint8_t>(lo | (hi << 4));
          }
        }
      } else {
        std::memcpy(&blk.d, &d[i], 2);
        std::memcpy(&blk.dmin, &dmin[i], 2);
        for (int k = 0; k < 12; ++k)
          blk.scales[k] = sb[2048 + k * n + i];
        for (int e = 0; e < qk_k; ++e) {
          const auto [off, high] = q4_k_level_offset(i, e);
          q4_k_set(blk, e, high ? sb[off] >> 4 : sb[off] & 0xF);
        }
      }
    }
  }
}

void convert_panels(tensor_type type, void* data, std::int64_t rows, std::int64_t cols,
                    bool to_panel) {
  TESSERA_ASSERT(panels_supported(type, rows, cols), "panels: {}x{} {}", rows, cols,
                 to_string(type));
  const std::size_t panel = detail::panel_bytes(type, cols);
  std::vector<std::uint8_t> copy(panel);
  auto* base = static_cast<std::uint8_t*>(data);
  for (std::int64_t p = 0; p < rows / detail::panel_rows; ++p) {
    std::uint8_t* at = base + static_cast<std::size_t>(p) * panel;
    std::memcpy(copy.data(), at, panel);
    if (to_panel)
      convert_panel(type, copy.data(), at, cols, true);
    else
      convert_panel(type, at, copy.data(), cols, false);
  }
}

}  // namespace

bool panels_supported(tensor_type type, std::int64_t rows, std::int64_t cols) noexcept {
  if (rows <= 0 || rows % detail::panel_rows != 0 || cols <= 0) return false;
  return (type == tensor_type::q8_0 && cols % qk8_0 == 0) ||
         (type == tensor_type::q4_k && cols % qk_k == 0) || type == tensor_type::f16;
}

void pack_panels(tensor_type type, void* data, std::int64_t rows, std::int64_t cols) {
  convert_panels(type, data, rows, cols, true);
}

void unpack_panels(tensor_type type, void* data, std::int64_t rows, std::int64_t cols) {
  convert_panels(type, data, rows, cols, false);
}

std::size_t weight_bytes(const weight_view& w) noexcept {
  auto row = row_bytes(w.type, w.cols);
  return row ? *row * static_cast<std::size_t>(std::max<std::int64_t>(w.rows, 0)) : 0;
}

result<void> matmul(const weight_view& w, const float* x, std::int64_t n_tokens, float* y,
                    thread_pool* pool) {
  auto layout = validate(w, x, n_tokens, y);
  if (!layout) return std::move(layout).error();
  const std::size_t stride = layout->stride;
  if (w.rows == 0 || n_tokens == 0) return ok();

  // What the kernels (and the AVX2 quantizer) will touch; checked here in ASan builds, where
  // they are not instrumented.
  const auto x_row = static_cast<std::size_t>(w.cols) * sizeof(float);
  const auto y_row = static_cast<std::size_t>(w.rows) * sizeof(float);
  detail::check_rows_addressable(w.data, w.rows, stride, layout->row, "mat-mul weight rows");
  detail::check_rows_addressable(x, n_tokens, x_row, x_row, "mat-mul input rows");
  detail::check_rows_addressable(y, n_tokens, y_row, y_row, "mat-mul outputs");

  const isa level = active_isa();
  const bool panels = w.layout == weight_layout::panels;
  const auto& table = detail::kernels_for(level);
  const detail::gemm_fn gemm = !panels                       ? table.gemm[detail::type_slot(w.type)]
                               : w.type == tensor_type::q8_0 ? table.q8_0_panels
                               : w.type == tensor_type::q4_k ? table.q4_k_panels
                                                             : table.f16_panels;
  // q8_0 on AVX2 and AVX-512 sums exact blocks from rows too (gemm_avx2.cpp, gemm_avx512.cpp): the
  // panel activations.
  const detail::act_format format = w.type == tensor_type::q8_0 && (panels || level != isa::scalar)
                                        ? detail::act_format::q8_0_panel
                                        : detail::activation_format(w.type);
  const std::size_t x_stride = detail::activation_row_bytes(format, w.cols);
  const int n_threads = pool ? pool->size() : 1;

  // Activations in the form the weights pair with; f32 weights read x in place.
  const std::uint8_t* xq = reinterpret_cast<const std::uint8_t*>(x);
  thread_local std::vector<std::uint8_t> scratch;
  if (format != detail::act_format::f32) {
    scratch.resize(x_stride * static_cast<std::size_t>(n_tokens));
    // A plain pointer: inside the pool's threads `scratch` would name their own thread_local.
    std::uint8_t* buffer = scratch.data();
    auto quantize = [&](int index, int size) {
      for (std::int64_t t = index; t < n_tokens; t += size) {
        detail::quantize_activations(format, x + t * w.cols, buffer + t * x_stride, w.cols,
                                     level);
      }
    };
    if (n_threads > 1 && n_tokens > 1) {
      pool->run(quantize);
    } else {
      quantize(0, 1);
    }
    xq = buffer;
  }

  const detail::gemm_args all{static_cast<const std::uint8_t*>(w.data), stride, w.rows, w.cols,
                              xq, x_stride, n_tokens, y, w.rows};
  if (n_threads == 1 && !(pool != nullptr && pool->gated())) {
    gemm(all);
    return ok();
  }
  // Contiguous row ranges, multiples of 4 rows (the widest row tile) or of whole panels, except
  // the last. q8_0 from rows on AVX2/AVX-512 (the panel activations) also works in groups of 16
  // rows: a range of 4k rows would leave its last rows to the one-row path.
  const std::int64_t unit =
      panels || format == detail::act_format::q8_0_panel ? detail::panel_rows : 4;
  const std::int64_t chunk = (w.rows + n_threads - 1) / n_threads;
  const std::int64_t aligned = (chunk + unit - 1) / unit * unit;
  pool->run([&](int index, int) {
    const std::int64_t begin = std::min(w.rows, index * aligned);
    const std::int64_t end = std::min(w.rows, begin + aligned);
    if (begin >= end) return;
    detail::gemm_args part = all;
    part.w += static_cast<std::size_t>(begin) * stride;
    part.rows = end - begin;
    part.y += begin;
    gemm(part);
  });
  return ok();
}

}  // namespace tessera::inference
