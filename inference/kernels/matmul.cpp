#include "inference/kernels/matmul.hpp"

#include <algorithm>
#include <cstring>
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
                      "matmul: a {}x{} {} weight cannot be in panels (q8_0, rows a multiple of {}, "
                      "no row stride)",
                      w.rows, w.cols, to_string(w.type), detail::panel_rows);
  }
  if (w.rows > 0 && n_tokens > 0 && (w.data == nullptr || x == nullptr || y == nullptr)) {
    return make_error(errc::invalid_argument, "matmul: null weight, input or output buffer");
  }
  return row_layout{*row, stride};
}

// Panel p's level byte of (row i of the panel, column c) and its scale, in the panel at `panel`.
std::size_t panel_level_offset(std::int64_t i, std::int64_t c) noexcept {
  const std::int64_t b = c / qk8_0, g = (c % qk8_0) / 4, j = c % 4;
  return static_cast<std::size_t>(b * 512 + g * 64 + i * 4 + j);
}

}  // namespace

bool panels_supported(tensor_type type, std::int64_t rows, std::int64_t cols) noexcept {
  return type == tensor_type::q8_0 && rows > 0 && rows % detail::panel_rows == 0 && cols > 0 &&
         cols % qk8_0 == 0;
}

void pack_panels(tensor_type type, void* data, std::int64_t rows, std::int64_t cols) {
  TESSERA_ASSERT(panels_supported(type, rows, cols), "pack_panels: {}x{} {}", rows, cols,
                 to_string(type));
  const std::size_t panel = detail::q8_0_panel_bytes(cols);
  const std::int64_t nb = cols / qk8_0;
  std::vector<std::uint8_t> plain(panel);
  auto* base = static_cast<std::uint8_t*>(data);
  for (std::int64_t p = 0; p < rows / detail::panel_rows; ++p) {
    std::uint8_t* out = base + static_cast<std::size_t>(p) * panel;
    std::memcpy(plain.data(), out, panel);  // 16 rows, one after another
    const auto* blocks = reinterpret_cast<const block_q8_0*>(plain.data());
    auto* scales = reinterpret_cast<std::uint16_t*>(out + nb * 512);
    for (std::int64_t i = 0; i < detail::panel_rows; ++i) {
      for (std::int64_t b = 0; b < nb; ++b) {
        const block_q8_0& blk = blocks[i * nb + b];
        std::memcpy(&scales[b * detail::panel_rows + i], &blk.d, sizeof(blk.d));
        for (int k = 0; k < qk8_0; ++k) {
          out[panel_level_offset(i, b * qk8_0 + k)] =
              static_cast<std::uint8_t>(static_cast<std::uint8_t>(blk.qs[k]) ^ 0x80u);
        }
      }
    }
  }
}

void unpack_panels(tensor_type type, void* data, std::int64_t rows, std::int64_t cols) {
  TESSERA_ASSERT(panels_supported(type, rows, cols), "unpack_panels: {}x{} {}", rows, cols,
                 to_string(type));
  const std::size_t panel = detail::q8_0_panel_bytes(cols);
  const std::int64_t nb = cols / qk8_0;
  std::vector<std::uint8_t> packed(panel);
  auto* base = static_cast<std::uint8_t*>(data);
  for (std::int64_t p = 0; p < rows / detail::panel_rows; ++p) {
    std::uint8_t* out = base + static_cast<std::size_t>(p) * panel;
    std::memcpy(packed.data(), out, panel);
    const auto* scales = reinterpret_cast<const std::uint16_t*>(packed.data() + nb * 512);
    auto* blocks = reinterpret_cast<block_q8_0*>(out);
    for (std::int64_t i = 0; i < detail::panel_rows; ++i) {
      for (std::int64_t b = 0; b < nb; ++b) {
        block_q8_0& blk = blocks[i * nb + b];
        std::memcpy(&blk.d, &scales[b * detail::panel_rows + i], sizeof(blk.d));
        for (int k = 0; k < qk8_0; ++k) {
          blk.qs[k] =
              static_cast<std::int8_t>(packed[panel_level_offset(i, b * qk8_0 + k)] ^ 0x80u);
        }
      }
    }
  }
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
  const detail::gemm_fn gemm = panels ? detail::kernels_for(level).q8_0_panels
                                      : detail::kernels_for(level).gemm[detail::type_slot(w.type)];
  const detail::act_format format =
      panels ? detail::act_format::q8_0_panel : detail::activation_format(w.type);
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
  // the last.
  const std::int64_t unit = panels ? detail::panel_rows : 4;
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
