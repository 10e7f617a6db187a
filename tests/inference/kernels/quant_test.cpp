// Quantization: layouts, fp16/bf16 conversions, round-trip error bounds, checked entry points.
#include "inference/kernels/quant.hpp"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tests/inference/kernels/kernel_test_util.hpp"

namespace tessera::inference {
namespace {

using test::random_floats;

TEST(quant, rejects_rows_that_are_not_whole_blocks) {
  auto r = row_bytes(tensor_type::q8_0, 33);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  EXPECT_NE(r.error().message.find("q8_0"), std::string::npos);
  EXPECT_FALSE(row_bytes(tensor_type::q4_k, 128));
  EXPECT_FALSE(row_bytes(tensor_type::f32, -1));
  EXPECT_FALSE(row_bytes(static_cast<tensor_type>(3), 32));  // q4_1: not supported
  std::vector<float> x(40);
  std::vector<std::uint8_t> y(100);
  EXPECT_FALSE(quantize_row(tensor_type::q8_0, x.data(), y.data(), 40));
  EXPECT_FALSE(dequantize_row(tensor_type::q6_k, y.data(), x.data(), 40));
  EXPECT_FALSE(quantize_row(tensor_type::q8_0, nullptr, y.data(), 32));
}

TEST(quant, type_table_matches_ggml) {
  EXPECT_EQ(tensor_type_from_ggml(0), tensor_type::f32);
  EXPECT_EQ(tensor_type_from_ggml(30), tensor_type::bf16);
  EXPECT_EQ(tensor_type_from_ggml(14), tensor_type::q6_k);
  EXPECT_FALSE(tensor_type_from_ggml(3));
  EXPECT_FALSE(tensor_type_from_ggml(31));
  EXPECT_EQ(*row_bytes(tensor_type::q8_0, 64), 68u);
  EXPECT_EQ(*row_bytes(tensor_type::q4_0, 64), 36u);
  EXPECT_EQ(*row_bytes(tensor_type::q4_k, 512), 288u);
  EXPECT_EQ(*row_bytes(tensor_type::q6_k, 256), 210u);
  EXPECT_EQ(*row_bytes(tensor_type::bf16, 3), 6u);
  EXPECT_EQ(to_string(tensor_type::q4_k), "q4_K");
}

TEST(quant, fp16_round_trips_every_half_and_rounds_to_nearest_even) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << h;
  }
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);  // tie -> even (down)
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);  // tie between 0 and the smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
}

TEST(quant, fp16_rows_match_scalar_conversion) {
  auto x = random_floats(1003, 7, 100.0f);
  x[5] = 1e-6f;
  x[6] = 7e4f;
  std::vector<std::uint16_t> h(x.size());
  fp32_to_fp16_row(x.data(), h.data(), static_cast<std::int64_t>(x.size()));
  std::vector<float> back(x.size());
  fp16_to_fp32_row(h.data(), back.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], fp32_to_fp16(x[i])) << i;
    ASSERT_EQ(back[i], fp16_to_fp32(h[i])) << i;
  }
}

TEST(quant, bf16_rounds_to_nearest_even) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // tie -> even
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::nanf("")))));
  for (float x : random_floats(1000, 3, 10.0f)) {
    EXPECT_NEAR(bf16_to_fp32(fp32_to_bf16(x)), x, std::fabs(x) * 0x1p-8f);
  }
}

float block_amax(const float* x, int n) {
  float a = 0;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

// Round trip with the documented per-block bound, and a whole-row relative RMS bound.
void check_round_trip(tensor_type type, std::int64_t n, std::uint32_t seed, float rel_rms_max) {
  auto x = random_floats(static_cast<std::size_t>(n), seed);
  // Blocks with offsets, all-positive, all-negative, all-zero values exercise the corner cases.
  for (std::int64_t i = 0; i < std::min<std::int64_t>(n, 256); ++i) x[i] = std::fabs(x[i]) + 3;
  for (std::int64_t i = 256; i < std::min<std::int64_t>(n, 512); ++i) x[i] = -std::fabs(x[i]);
  for (std::int64_t i = 512; i < std::min<std::int64_t>(n, 768); ++i) x[i] = 0;
  std::vector<std::uint8_t> q(*row_bytes(type, n));
  ASSERT_TRUE(quantize_row(type, x.data(), q.data(), n));
  std::vector<float> y(x.size());
  ASSERT_TRUE(dequantize_row(type, q.data(), y.data(), n));
  double err2 = 0, x2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    err2 += double(x[i] - y[i]) * (x[i] - y[i]);
    x2 += double(x[i]) * x[i];
  }
  EXPECT_LE(std::sqrt(err2 / x2), rel_rms_max) << to_string(type);
  const int bs = static_cast<int>(block_elements(type));
  for (std::int64_t b = 0; b < n / bs; ++b) {
    const float* xb = x.data() + b * bs;
    const float* yb = y.data() + b * bs;
    for (int i = 0; i < bs; ++i) {
      float bound = 0;
      switch (type) {
        case tensor_type::q8_0: bound = block_amax(xb, bs) / 200; break;
        case tensor_type::q4_0: bound = block_amax(xb, bs) / 7.5f; break;
        case tensor_type::q4_k: {
          const auto& blk = reinterpret_cast<const block_q4_k*>(q.data())[b];
          std::uint8_t sc, m;
          q4_k_scale_min(i / 32, blk.scales, sc, m);
          bound = 0.5f * fp16_to_fp32(blk.d) * sc + 1e-6f * block_amax(xb + i / 32 * 32, 32);
          break;
        }
        case tensor_type::q6_k: {
          const auto& blk = reinterpret_cast<const block_q6_k*>(q.data())[b];
          bound = 0.5f * fp16_to_fp32(blk.d) * blk.scales[i / 16] +
                  1e-6f * block_amax(xb + i / 16 * 16, 16);
          break;
        }
        default: bound = std::fabs(xb[i]) * 0x1p-8f; break;
      }
      ASSERT_LE(std::fabs(xb[i] - yb[i]), bound * 1.0001f + 1e-30f)
          << to_string(type) << " block " << b << " element " << i << " x " << xb[i];
    }
  }
}

TEST(quant, round_trips_within_stated_bounds) {
  check_round_trip(tensor_type::f32, 1000, 1, 0.0f);
  check_round_trip(tensor_type::f16, 1000, 2, 0.001f);
  check_round_trip(tensor_type::bf16, 1000, 3, 0.005f);
  check_round_trip(tensor_type::q8_0, 4096, 4, 0.01f);
  check_round_trip(tensor_type::q4_0, 4096, 5, 0.15f);
  check_round_trip(tensor_type::q4_k, 4096, 6, 0.12f);
  check_round_trip(tensor_type::q6_k, 4096, 7, 0.03f);
}

TEST(quant, q4_k_scale_unpacking_agrees_with_the_reference_accessor) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 1000; ++trial) {
    std::uint8_t packed[12];
    for (auto& b : packed) b = static_cast<std::uint8_t>(rng());
    std::uint8_t sc[8], m[8];
    q4_k_unpack_scales(packed, sc, m);
    for (int j = 0; j < 8; ++j) {
      std::uint8_t s1, m1;
      q4_k_scale_min(j, packed, s1, m1);
      ASSERT_EQ(sc[j], s1) << j;
      ASSERT_EQ(m[j], m1) << j;
    }
  }
}

TEST(quant, q8_k_block_sums_match_quants) {
  auto x = random_floats(512, 9);
  std::vector<block_q8_k> q(2);
  quantize_row_q8_k(x.data(), q.data(), 512);
  for (const auto& b : q) {
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += b.qs[16 * g + i];
      EXPECT_EQ(b.bsums[g], s);
    }
  }
  std::vector<float> y(512);
  dequantize_row_q8_k(q.data(), y.data(), 512);
  for (int i = 0; i < 512; ++i) EXPECT_NEAR(y[i], x[i], block_amax(x.data() + i / 256 * 256, 256) / 250);
}

}  // namespace
}  // namespace tessera::inference
