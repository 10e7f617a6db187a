#include "inference/kernels/gemm_kernels.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace tessera::inference::detail {

int type_slot(tensor_type t) noexcept {
  switch (t) {
    case tensor_type::f32: return 0;
    case tensor_type::f16: return 1;
    case tensor_type::bf16: return 2;
    case tensor_type::q8_0: return 3;
    case tensor_type::q4_0: return 4;
    case tensor_type::q4_k: return 5;
    case tensor_type::q6_k: return 6;
  }
  TESSERA_ASSERT(false, "unknown tensor type {}", static_cast<std::uint32_t>(t));
  return 0;
}

act_format activation_format(tensor_type w) noexcept {
  switch (w) {
    case tensor_type::q8_0:
    case tensor_type::q4_0: return act_format::q8_0;
    case tensor_type::q4_k:
    case tensor_type::q6_k: return act_format::q8_k;
    default: return act_format::f32;
  }
}

std::size_t activation_row_bytes(act_format f, std::int64_t cols) noexcept {
  const auto n = static_cast<std::size_t>(cols);
  switch (f) {
    case act_format::f32: return n * sizeof(float);
    case act_format::q8_0: return n / qk8_0 * sizeof(block_q8_0);
    case act_format::q8_k: return n / qk_k * sizeof(block_q8_k);
    case act_format::q8_0_panel:
      return n / qk8_0 * sizeof(block_q8_0_act);
  }
  return 0;
}

void check_rows_addressable(const void* p, std::int64_t rows, std::size_t stride,
                            std::size_t row_bytes, const char* what) noexcept {
#if defined(__SANITIZE_ADDRESS__)
  if (rows <= 0 || row_bytes == 0) return;
  const std::size_t bytes = static_cast<std::size_t>(rows - 1) * stride + row_bytes;
  const auto* bad =
      static_cast<const volatile char*>(__asan_region_is_poisoned(const_cast<void*>(p), bytes));
  if (bad == nullptr) return;
  std::fprintf(stderr, "tessera: kernel %s [%p, +%zu) reach unaddressable memory at %p\n", what, p,
               bytes, static_cast<const volatile void*>(bad));
  // This file is instrumented: reading the byte makes ASan report it as it would have reported
  // the kernel's own access, and stop.
  static_cast<void>(*bad);
#else
  static_cast<void>(p);
  static_cast<void>(rows);
  static_cast<void>(stride);
  static_cast<void>(row_bytes);
  static_cast<void>(what);
#endif
}

const kernel_table& kernels_for(isa level) noexcept {
  switch (level) {
    case isa::avx512: return avx512_kernels();
    case isa::avx2: return avx2_kernels();
    case isa::scalar: break;
  }
  return scalar_kernels();
}

void quantize_activations(act_format f, const float* x, std::uint8_t* out, std::int64_t cols,
                          isa level) noexcept {
  switch (f) {
    case act_format::f32: std::memcpy(out, x, static_cast<std::size_t>(cols) * sizeof(float)); break;
    case act_format::q8_0:
      if (level != isa::scalar) {
        quantize_row_q8_0_avx2(x, out, cols);
      } else {
        quantize_row_q8_0(x, out, cols);
      }
      break;
    case act_format::q8_k: quantize_row_q8_k(x, out, cols); break;
    case act_format::q8_0_panel: {
      // Quantized as q8_0 (the same levels and scales on every ISA), then widened block by
      // block; 32 blocks at a time through a small buffer on the stack.
      constexpr std::int64_t step = 32;
      block_q8_0 tmp[step];
      auto* dst = reinterpret_cast<block_q8_0_act*>(out);
      for (std::int64_t b0 = 0; b0 < cols / qk8_0; b0 += step) {
        const std::int64_t nb = std::min<std::int64_t>(step, cols / qk8_0 - b0);
        quantize_activations(act_format::q8_0, x + b0 * qk8_0, reinterpret_cast<std::uint8_t*>(tmp),
                             nb * qk8_0, level);
        for (std::int64_t b = 0; b < nb; ++b) {
          block_q8_0_act& a = dst[b0 + b];
          a.d = fp16_to_fp32(tmp[b].d);
          std::int32_t sum = 0;
          for (int i = 0; i < qk8_0; ++i)
            sum += tmp[b].qs[i];
          a.bias = -128 * sum;
          std::memcpy(a.qs, tmp[b].qs, sizeof(a.qs));
        }
      }
      break;
    }
  }
}

}  // namespace tessera::inference::detail
