// Mat-mul kernels: every weight type x every ISA path against the scalar reference (and the
// scalar reference against a double-precision dot product), bit-identical threading and tiling,
// argument validation.
#include "inference/kernels/matmul.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "inference/kernels/cpu.hpp"
#include "inference/kernels/gemm_kernels.hpp"
#include "tests/inference/kernels/kernel_test_util.hpp"

namespace tessera::inference {
namespace {

using test::isa_guard;
using test::random_floats;

constexpr tensor_type all_types[] = {tensor_type::f32,  tensor_type::f16,  tensor_type::bf16,
                                     tensor_type::q8_0, tensor_type::q4_0, tensor_type::q4_k,
                                     tensor_type::q6_k};

struct matrix {
  tensor_type type;
  std::int64_t rows, cols;
  std::vector<std::uint8_t> data;
  std::vector<float> dequantized;  // what the weights really are, row-major
  weight_view view() const { return {type, rows, cols, data.data(), 0}; }
};

matrix make_matrix(tensor_type type, std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  matrix m{type, rows, cols, {}, {}};
  const std::size_t rb = *row_bytes(type, cols);
  m.data.resize(rb * static_cast<std::size_t>(rows));
  m.dequantized.resize(static_cast<std::size_t>(rows * cols));
  const auto src = random_floats(static_cast<std::size_t>(rows * cols), seed);
  for (std::int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(quantize_row(type, src.data() + r * cols, m.data.data() + r * rb, cols));
    EXPECT_TRUE(dequantize_row(type, m.data.data() + r * rb, m.dequantized.data() + r * cols, cols));
  }
  return m;
}

std::vector<float> run_matmul(const matrix& m, const std::vector<float>& x, std::int64_t n_tokens,
                              thread_pool* pool = nullptr) {
  std::vector<float> y(static_cast<std::size_t>(n_tokens * m.rows), -1.0f);
  auto r = matmul(m.view(), x.data(), n_tokens, y.data(), pool);
  EXPECT_TRUE(r) << (r ? "" : r.error().message);
  return y;
}

std::vector<std::int64_t> cols_for(tensor_type type) {
  switch (block_elements(type)) {
    case 1: return {1, 7, 16, 33, 100};
    case 32: return {32, 64, 96, 160};
    default: return {256, 512, 768};
  }
}

TEST(matmul, rejects_bad_arguments_without_writing) {
  const auto m = make_matrix(tensor_type::q8_0, 4, 64, 1);
  std::vector<float> x(256, 1.0f), y(64, 7.0f);
  auto expect_invalid = [&](weight_view w, std::int64_t n_tokens, const char* what) {
    auto r = matmul(w, x.data(), n_tokens, y.data());
    ASSERT_FALSE(r) << what;
    EXPECT_EQ(r.error().code, errc::invalid_argument) << what << ": " << r.error().message;
    for (float v : y) ASSERT_EQ(v, 7.0f) << what;
  };
  weight_view w = m.view();
  w.cols = 48;  // not a multiple of 32
  expect_invalid(w, 1, "cols not a multiple of the block");
  w = m.view();
  w.row_stride_bytes = 60;  // shorter than a 68-byte row
  expect_invalid(w, 1, "short row stride");
  w = m.view();
  w.rows = -1;
  expect_invalid(w, 1, "negative rows");
  w = m.view();
  w.cols = 0;
  expect_invalid(w, 1, "zero cols");
  expect_invalid(m.view(), max_matmul_tokens + 1, "too many tokens");
  w = m.view();
  w.data = nullptr;
  expect_invalid(w, 1, "null weights");
  EXPECT_FALSE(matmul(m.view(), nullptr, 1, y.data()));
  EXPECT_FALSE(matmul(m.view(), x.data(), 1, nullptr));
  w = m.view();
  w.type = static_cast<tensor_type>(3);
  auto r = matmul(w, x.data(), 1, y.data());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::unsupported);
  EXPECT_TRUE(matmul(m.view(), x.data(), 0, y.data()));  // nothing to do is fine
}

TEST(matmul, scalar_reference_matches_double_precision_dot) {
  isa_guard guard;
  ASSERT_TRUE(set_active_isa(isa::scalar));
  for (tensor_type type : all_types) {
    for (std::int64_t cols : cols_for(type)) {
      const std::int64_t rows = 5, n_tokens = 3;
      const auto m = make_matrix(type, rows, cols, static_cast<std::uint32_t>(cols));
      const auto x = random_floats(static_cast<std::size_t>(n_tokens * cols), 99);
      const auto y = run_matmul(m, x, n_tokens);
      // Quantized types also quantize the activations (8-bit): allow that error, relative to
      // the sum of |w x|; float types only differ by f32 rounding.
      const double rel = is_quantized(type) ? 0.02 : 1e-5;
      for (std::int64_t t = 0; t < n_tokens; ++t) {
        for (std::int64_t r = 0; r < rows; ++r) {
          double exact = 0, mag = 0;
          for (std::int64_t c = 0; c < cols; ++c) {
            const double p = double(m.dequantized[r * cols + c]) * x[t * cols + c];
            exact += p;
            mag += std::fabs(p);
          }
          EXPECT_NEAR(y[t * rows + r], exact, rel * mag + 1e-6)
              << to_string(type) << " cols " << cols << " r " << r << " t " << t;
        }
      }
    }
  }
}

TEST(matmul, every_isa_matches_the_scalar_reference) {
  isa_guard guard;
  for (tensor_type type : all_types) {
    for (std::int64_t cols : cols_for(type)) {
      for (std::int64_t rows : {1, 3, 6, 17}) {
        const std::int64_t n_tokens = rows == 6 ? 9 : (rows == 3 ? 5 : 1);
        const auto m = make_matrix(type, rows, cols, static_cast<std::uint32_t>(rows * 1000 + cols));
        const auto x = random_floats(static_cast<std::size_t>(n_tokens * cols), 7);
        ASSERT_TRUE(set_active_isa(isa::scalar));
        const auto ref = run_matmul(m, x, n_tokens);
        for (isa level : supported_isas()) {
          ASSERT_TRUE(set_active_isa(level));
          const auto y = run_matmul(m, x, n_tokens);
          for (std::int64_t t = 0; t < n_tokens; ++t) {
            for (std::int64_t r = 0; r < rows; ++r) {
              double mag = 0;
              for (std::int64_t c = 0; c < cols; ++c) {
                mag += std::fabs(double(m.dequantized[r * cols + c]) * x[t * cols + c]);
              }
              // Same integer block sums on every path; only the f32 summation order differs.
              ASSERT_NEAR(y[t * rows + r], ref[t * rows + r], 2e-5 * mag + 1e-6)
                  << to_string(type) << " " << to_string(level) << " rows " << rows << " cols "
                  << cols << " r " << r << " t " << t;
            }
          }
        }
      }
    }
  }
}

TEST(matmul, every_isa_has_its_own_kernel_for_every_type) {
  // Guards against the linker folding two tiers' kernels into one (see gemm_tiles.hpp): the
  // comparison tests above could not tell, and an AVX-512 kernel in the AVX2 table would crash
  // CPUs without AVX-512.
  const isa levels[] = {isa::scalar, isa::avx2, isa::avx512};
  for (tensor_type type : all_types) {
    const int slot = detail::type_slot(type);
    for (int a = 0; a < 3; ++a) {
      ASSERT_NE(detail::kernels_for(levels[a]).gemm[slot], nullptr);
      for (int b = a + 1; b < 3; ++b) {
        EXPECT_NE(detail::kernels_for(levels[a]).gemm[slot], detail::kernels_for(levels[b]).gemm[slot])
            << to_string(type) << " " << to_string(levels[a]) << " vs " << to_string(levels[b]);
      }
    }
  }
}

TEST(matmul, simd_activation_quantizer_gives_the_reference_bytes) {
  if (!isa_supported(isa::avx2)) GTEST_SKIP() << "no AVX2";
  auto x = random_floats(32 * 40, 21);
  for (int i = 0; i < 32; ++i) x[i] = 0.0f;                         // all-zero block
  for (int i = 32; i < 64; ++i) x[i] = static_cast<float>(i - 48);  // ties at .5 after scaling
  for (int i = 64; i < 96; ++i) x[i] *= 1e-30f;                     // tiny scale
  std::vector<block_q8_0> ref(40), simd(40);
  quantize_row_q8_0(x.data(), ref.data(), 32 * 40);
  detail::quantize_row_q8_0_avx2(x.data(), simd.data(), 32 * 40);
  EXPECT_EQ(std::memcmp(ref.data(), simd.data(), sizeof(block_q8_0) * 40), 0);
}

TEST(matmul, threads_tiles_and_token_batches_give_bit_identical_results) {
  isa_guard guard;
  auto pool2 = thread_pool::create(2);
  auto pool3 = thread_pool::create(3);
  ASSERT_TRUE(pool2 && pool3);
  for (isa level : supported_isas()) {
    ASSERT_TRUE(set_active_isa(level));
    for (tensor_type type : all_types) {
      const std::int64_t cols = block_elements(type) == 256 ? 512 : 96;
      const std::int64_t rows = 37, n_tokens = 7;
      const auto m = make_matrix(type, rows, cols, 5);
      const auto x = random_floats(static_cast<std::size_t>(n_tokens * cols), 11);
      const auto single = run_matmul(m, x, n_tokens);
      EXPECT_EQ(run_matmul(m, x, n_tokens, pool2->get()), single) << to_string(type);
      EXPECT_EQ(run_matmul(m, x, n_tokens, pool3->get()), single) << to_string(type);
      // Decode one token at a time equals the batched prefill.
      for (std::int64_t t = 0; t < n_tokens; ++t) {
        const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
        const auto yt = run_matmul(m, xt, 1, pool2->get());
        for (std::int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(yt[r], single[t * rows + r]) << to_string(type) << " " << to_string(level);
        }
      }
    }
  }
}

// q8_0 on AVX-512 takes three paths — 16 rows from their rows (decode, small batches), packed
// into a panel (prefill), one row at a time (the rows after the last 16) — with one arithmetic.
TEST(matmul, q8_0_prefill_batches_and_decode_agree_bit_for_bit_on_every_path) {
  isa_guard guard;
  auto pool2 = thread_pool::create(2);
  ASSERT_TRUE(pool2);
  const std::int64_t rows = 53, cols = 192, n_tokens = 41;
  const auto m = make_matrix(tensor_type::q8_0, rows, cols, 9);
  const auto x = random_floats(static_cast<std::size_t>(n_tokens * cols), 10);
  for (isa level : supported_isas()) {
    ASSERT_TRUE(set_active_isa(level));
    const auto prefill = run_matmul(m, x, n_tokens);
    EXPECT_EQ(run_matmul(m, x, n_tokens, pool2->get()), prefill) << to_string(level);
    for (std::int64_t t0 = 0; t0 < n_tokens; t0 += 5) {  // batches of 5 (and 1 at the end)
      const std::int64_t n = std::min<std::int64_t>(5, n_tokens - t0);
      const std::vector<float> xb(x.begin() + t0 * cols, x.begin() + (t0 + n) * cols);
      const auto yb = run_matmul(m, xb, n);
      for (std::int64_t i = 0; i < n * rows; ++i)
        ASSERT_EQ(yb[i], prefill[t0 * rows + i]) << to_string(level) << " t0 " << t0 << " i " << i;
    }
  }
}

TEST(matmul, honours_a_row_stride_wider_than_the_row) {
  const auto m = make_matrix(tensor_type::q8_0, 6, 64, 3);
  const std::size_t rb = *row_bytes(tensor_type::q8_0, 64);
  std::vector<std::uint8_t> padded(6 * (rb + 10), 0xAB);
  for (int r = 0; r < 6; ++r) std::memcpy(padded.data() + r * (rb + 10), m.data.data() + r * rb, rb);
  const auto x = random_floats(64, 4);
  std::vector<float> y(6);
  ASSERT_TRUE(matmul({tensor_type::q8_0, 6, 64, padded.data(), rb + 10}, x.data(), 1, y.data()));
  EXPECT_EQ(y, run_matmul(m, x, 1));
}

// ---- panels (issue 35) ---------------------------------------------------------------------

matrix in_panels(const matrix& m) {
  matrix p = m;
  pack_panels(p.type, p.data.data(), p.rows, p.cols);
  return p;
}

std::vector<float> run_panels(const matrix& p, const std::vector<float>& x, std::int64_t n_tokens,
                              thread_pool* pool = nullptr) {
  std::vector<float> y(static_cast<std::size_t>(n_tokens * p.rows), -1.0f);
  weight_view w = p.view();
  w.layout = weight_layout::panels;
  auto r = matmul(w, x.data(), n_tokens, y.data(), pool);
  EXPECT_TRUE(r) << (r ? "" : r.error().message);
  return y;
}

constexpr tensor_type panel_types[] = {tensor_type::q8_0, tensor_type::q4_k, tensor_type::f16};

TEST(matmul_panels, packing_is_a_permutation_unpack_gives_the_rows_back) {
  for (tensor_type type : panel_types) {
    const auto m = make_matrix(type, 48, block_elements(type) == 256 ? 512 : 160, 31);
    if (type == tensor_type::f16) {
      // Column c of the first panel is the first 16 rows' column c.
      const auto p0 = in_panels(m);
      EXPECT_EQ(0, std::memcmp(p0.data.data() + 2 * 16 * 5 + 2 * 3,
                               m.data.data() + 2 * (3 * 160 + 5), 2));
    }
    auto p = in_panels(m);
    EXPECT_NE(p.data, m.data);
    EXPECT_EQ(p.data.size(), m.data.size());  // 16 rows take the same bytes in both layouts
    unpack_panels(p.type, p.data.data(), p.rows, p.cols);
    EXPECT_EQ(p.data, m.data) << to_string(type);
  }
  EXPECT_TRUE(panels_supported(tensor_type::q8_0, 32, 64));
  EXPECT_FALSE(panels_supported(tensor_type::q8_0, 24, 64));  // not whole panels
  EXPECT_TRUE(panels_supported(tensor_type::q4_k, 32, 256));
  EXPECT_FALSE(panels_supported(tensor_type::q6_k, 32, 256));
  EXPECT_TRUE(panels_supported(tensor_type::f16, 32, 7));
  EXPECT_FALSE(panels_supported(tensor_type::f32, 32, 64));
}

std::vector<std::int64_t> panel_cols(tensor_type type) {
  switch (block_elements(type)) {
    case 256:
      return {256, 768, 1024};
    case 32:
      return {32, 64, 96, 1024};
    default:
      return {1, 7, 100, 1024};
  }
}

TEST(matmul_panels, every_isa_gives_the_same_bits_and_the_rows_value_within_rounding) {
  isa_guard guard;
  for (tensor_type type : panel_types) {
    for (std::int64_t cols : panel_cols(type)) {
      for (std::int64_t rows : {16, 48}) {
        for (std::int64_t n_tokens : {1, 3, 8, 13}) {
          const auto m = make_matrix(type, rows, cols, static_cast<std::uint32_t>(rows * 7 + cols));
          const auto p = in_panels(m);
          const auto x = random_floats(static_cast<std::size_t>(n_tokens * cols), 17);
          ASSERT_TRUE(set_active_isa(isa::scalar));
          const auto rows_ref = run_matmul(m, x, n_tokens);
          const auto ref = run_panels(p, x, n_tokens);
          for (isa level : supported_isas()) {
            ASSERT_TRUE(set_active_isa(level));
            // The same integer sums and the same float operations per lane on every ISA.
            ASSERT_EQ(run_panels(p, x, n_tokens), ref)
                << to_string(type) << " " << to_string(level) << " rows " << rows << " cols "
                << cols << " n " << n_tokens;
          }
          // Against the row layout: the same products, summed in another order.
          for (std::int64_t t = 0; t < n_tokens; ++t) {
            for (std::int64_t r = 0; r < rows; ++r) {
              double mag = 0;
              for (std::int64_t c = 0; c < cols; ++c)
                mag += std::fabs(double(m.dequantized[r * cols + c]) * x[t * cols + c]);
              ASSERT_NEAR(ref[t * rows + r], rows_ref[t * rows + r], 2e-5 * mag + 1e-6)
                  << to_string(type) << " rows " << rows << " cols " << cols << " r " << r;
            }
          }
        }
      }
    }
  }
}

// q8_0 from GGUF's rows on AVX2 and AVX-512 (decode 8 rows a step, batches, prefill packed into
// scratch panels, single leftover rows) sums exact blocks with one FMA per block: the bits of the
// scalar panel kernel over the same weights in panels. Checked on every SIMD ISA this CPU has, so
// an AVX2-only CI host still checks its AVX2 kernels against the reference.
TEST(matmul_panels, q8_0_rows_on_simd_isas_give_the_panel_reference_bits) {
  isa_guard guard;
  for (std::int64_t cols : {32, 96, 1024}) {
    for (std::int64_t rows : {16, 53}) {
      // The reference wants whole panels: rows rounded up, the extra rows' outputs ignored.
      const std::int64_t padded = (rows + 15) / 16 * 16;
      const auto m = make_matrix(tensor_type::q8_0, padded, cols, static_cast<std::uint32_t>(cols));
      matrix head = m;
      head.rows = rows;
      head.data.resize(static_cast<std::size_t>(rows) * *row_bytes(tensor_type::q8_0, cols));
      const auto p = in_panels(m);
      for (std::int64_t n_tokens : {1, 2, 3, 7, 30}) {
        const auto x = random_floats(static_cast<std::size_t>(n_tokens * cols), 23);
        ASSERT_TRUE(set_active_isa(isa::scalar));
        const auto ref = run_panels(p, x, n_tokens);
        for (isa level : supported_isas()) {
          if (level == isa::scalar) continue;
          ASSERT_TRUE(set_active_isa(level));
          const auto y = run_matmul(head, x, n_tokens);
          for (std::int64_t t = 0; t < n_tokens; ++t) {
            for (std::int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(y[t * rows + r], ref[t * padded + r])
                  << to_string(level) << " rows " << rows << " cols " << cols << " n " << n_tokens
                  << " t " << t << " r " << r;
            }
          }
        }
      }
    }
  }
}

TEST(matmul_panels, threads_and_decode_equal_the_batch_bit_for_bit) {
  isa_guard guard;
  auto pool2 = thread_pool::create(2);
  auto pool3 = thread_pool::create(3);
  ASSERT_TRUE(pool2 && pool3);
  const std::int64_t rows = 80, cols = 512, n_tokens = 19;
  for (tensor_type type : panel_types) {
    const auto p = in_panels(make_matrix(type, rows, cols, 41));
    const auto x = random_floats(static_cast<std::size_t>(n_tokens * cols), 43);
    for (isa level : supported_isas()) {
      ASSERT_TRUE(set_active_isa(level));
      const auto batch = run_panels(p, x, n_tokens);
      EXPECT_EQ(run_panels(p, x, n_tokens, pool2->get()), batch) << to_string(level);
      EXPECT_EQ(run_panels(p, x, n_tokens, pool3->get()), batch) << to_string(level);
      for (std::int64_t t = 0; t < n_tokens; ++t) {
        const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
        const auto yt = run_panels(p, xt, 1, pool2->get());
        for (std::int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(yt[r], batch[t * rows + r])
              << to_string(type) << " " << to_string(level) << " t " << t << " r " << r;
      }
    }
  }
}

TEST(matmul_panels, weights_that_cannot_be_in_panels_are_refused) {
  const auto m = make_matrix(tensor_type::q8_0, 24, 64, 3);
  std::vector<float> x(64, 1.0f), y(24, 7.0f);
  weight_view w = m.view();
  w.layout = weight_layout::panels;
  auto r = matmul(w, x.data(), 1, y.data());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("panels"), std::string::npos) << r.error().message;
  EXPECT_EQ(y, std::vector<float>(24, 7.0f));
  const auto f = make_matrix(tensor_type::f32, 32, 64, 3);
  w = f.view();
  w.layout = weight_layout::panels;
  EXPECT_FALSE(matmul(w, x.data(), 1, y.data()));
}

TEST(matmul_panels, every_isa_has_its_own_panel_kernel) {
  EXPECT_NE(detail::kernels_for(isa::scalar).q8_0_panels,
            detail::kernels_for(isa::avx2).q8_0_panels);
  EXPECT_NE(detail::kernels_for(isa::avx2).q8_0_panels,
            detail::kernels_for(isa::avx512).q8_0_panels);
  EXPECT_NE(detail::kernels_for(isa::scalar).q8_0_panels, nullptr);
  EXPECT_NE(detail::kernels_for(isa::scalar).q4_k_panels,
            detail::kernels_for(isa::avx2).q4_k_panels);
  EXPECT_NE(detail::kernels_for(isa::avx2).q4_k_panels,
            detail::kernels_for(isa::avx512).q4_k_panels);
  EXPECT_NE(detail::kernels_for(isa::scalar).q4_k_panels, nullptr);
  EXPECT_NE(detail::kernels_for(isa::scalar).f16_panels, detail::kernels_for(isa::avx2).f16_panels);
  EXPECT_NE(detail::kernels_for(isa::avx2).f16_panels, detail::kernels_for(isa::avx512).f16_panels);
}

#if defined(__SANITIZE_ADDRESS__)
// ASan builds: the library's SIMD kernel files are not instrumented and their callers check the
// ranges a kernel touches (detail::check_rows_addressable); this executable links instrumented copies
// of the kernels (tests/inference/kernels/CMakeLists.txt). Each side must catch a short buffer.
std::vector<std::uint8_t> one_byte_short(const matrix& m) {
  // Exactly the size asked for, on the heap: ASan's redzone starts at the missing byte.
  return std::vector<std::uint8_t>(m.data.begin(), m.data.end() - 1);
}

TEST(matmul_asan_death, a_kernel_reading_past_its_weights_is_reported_by_the_kernel_itself) {
  if (!isa_supported(isa::avx2)) GTEST_SKIP() << "no AVX2";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto m = make_matrix(tensor_type::q8_0, 4, 64, 3);
  const auto w = one_byte_short(m);
  std::vector<block_q8_0> xq(2);
  quantize_row_q8_0(random_floats(64, 4).data(), xq.data(), 64);
  std::vector<float> y(4);
  const detail::gemm_args g{w.data(), *row_bytes(tensor_type::q8_0, 64), 4, 64,
                            reinterpret_cast<const std::uint8_t*>(xq.data()),
                            sizeof(block_q8_0) * 2, 1, y.data(), 4};
  // Straight to the AVX2 kernel, past matmul()'s check: only the kernel's own instrumentation
  // can report this (a library copy without it would read the byte and carry on).
  EXPECT_DEATH(detail::avx2_kernels().gemm[detail::type_slot(tensor_type::q8_0)](g),
               "READ of size 32");
}

TEST(matmul_asan_death, matmul_checks_every_range_the_kernels_will_touch) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto m = make_matrix(tensor_type::q8_0, 4, 64, 3);
  const auto w = one_byte_short(m);
  const auto x = random_floats(64, 4);
  std::vector<float> y(4), short_y(3);
  EXPECT_DEATH(static_cast<void>(matmul({tensor_type::q8_0, 4, 64, w.data(), 0}, x.data(), 1,
                                        y.data())),
               "kernel mat-mul weight rows .* reach unaddressable memory");
  EXPECT_DEATH(static_cast<void>(matmul(m.view(), x.data(), 1, short_y.data())),
               "kernel mat-mul outputs .* reach unaddressable memory");
  const std::vector<float> short_x(x.begin(), x.end() - 1);
  EXPECT_DEATH(static_cast<void>(matmul(m.view(), short_x.data(), 1, y.data())),
               "kernel mat-mul input rows .* reach unaddressable memory");
}
#endif

TEST(cpu, isa_selection_errors_and_names) {
  EXPECT_FALSE(parse_isa("sse9"));
  EXPECT_EQ(*parse_isa("avx2"), isa::avx2);
  EXPECT_TRUE(isa_supported(isa::scalar));
  EXPECT_EQ(supported_isas().front(), isa::scalar);
  EXPECT_EQ(supported_isas().back(), best_isa());
  if (!isa_supported(isa::avx512)) {
    auto r = set_active_isa(isa::avx512);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, errc::unsupported);
  }
  EXPECT_FALSE(describe_cpu().empty());
}

}  // namespace
}  // namespace tessera::inference
