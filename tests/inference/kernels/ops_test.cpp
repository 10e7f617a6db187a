// Forward-pass ops against straightforward double-precision references, on every ISA path;
// bandwidth probe argument checks.
#include "inference/kernels/ops.hpp"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "inference/kernels/bandwidth.hpp"
#include "inference/kernels/cpu.hpp"
#include "inference/kernels/quant.hpp"
#include "tests/inference/kernels/kernel_test_util.hpp"

namespace tessera::inference {
namespace {

using test::isa_guard;
using test::random_floats;

TEST(ops, rmsnorm_matches_reference_in_place_too) {
  auto x = random_floats(1000, 1);
  const auto w = random_floats(1000, 2);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / 1000 + 1e-5);
  std::vector<float> y(1000);
  rmsnorm(x.data(), w.data(), y.data(), 1000, 1e-5f);
  for (int i = 0; i < 1000; ++i) EXPECT_NEAR(y[i], x[i] * inv * w[i], 1e-5 * std::fabs(x[i] * inv * w[i]) + 1e-6);
  rmsnorm(x.data(), nullptr, x.data(), 1000, 1e-5f);
  for (int i = 0; i < 1000; ++i) EXPECT_NEAR(x[i], y[i] / w[i], 1e-4 * std::fabs(x[i]) + 1e-5);
}

TEST(ops, rope_rotates_the_right_pairs) {
  const int heads = 2, dim = 8, pos = 3;
  const float base = 10000.0f;
  const auto x = random_floats(heads * dim, 3);
  for (rope_mode mode : {rope_mode::normal, rope_mode::neox}) {
    auto y = x;
    rope(y.data(), heads, dim, pos, base, mode);
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < dim / 2; ++i) {
        const double theta = pos * std::pow(double(base), -2.0 * i / dim);
        const int a = h * dim + (mode == rope_mode::normal ? 2 * i : i);
        const int b = h * dim + (mode == rope_mode::normal ? 2 * i + 1 : i + dim / 2);
        EXPECT_NEAR(y[a], x[a] * std::cos(theta) - x[b] * std::sin(theta), 1e-5);
        EXPECT_NEAR(y[b], x[a] * std::sin(theta) + x[b] * std::cos(theta), 1e-5);
      }
    }
  }
  auto y = x;
  rope(y.data(), heads, dim, 0, base, rope_mode::normal);
  EXPECT_EQ(y, x);  // position 0 is the identity
}

TEST(ops, softmax_swiglu_add) {
  std::vector<float> s = {1.0f, 2.0f, 3.0f, -INFINITY};
  softmax(s.data(), 4);
  const double e = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(s[0], std::exp(1.0) / e, 1e-6);
  EXPECT_NEAR(s[2], std::exp(3.0) / e, 1e-6);
  EXPECT_EQ(s[3], 0.0f);
  std::vector<float> big = {1000.0f, 1000.0f};  // no overflow: the max is subtracted
  softmax(big.data(), 2);
  EXPECT_FLOAT_EQ(big[0], 0.5f);
  const std::vector<float> g = {-2.0f, 0.0f, 3.0f}, u = {1.0f, 5.0f, 2.0f};
  std::vector<float> out(3);
  swiglu(g.data(), u.data(), out.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
  add(g.data(), u.data(), out.data(), 3);
  EXPECT_EQ(out, (std::vector<float>{-1.0f, 5.0f, 5.0f}));
}

TEST(ops, attention_over_an_f16_cache_on_every_isa) {
  isa_guard guard;
  const int n_ctx = 13, head_dim = 40, n_q = 3, stride = 2 * head_dim;  // two KV heads interleaved
  const auto kf = random_floats(n_ctx * stride, 4), vf = random_floats(n_ctx * stride, 5);
  std::vector<std::uint16_t> k(kf.size()), v(vf.size());
  fp32_to_fp16_row(kf.data(), k.data(), static_cast<std::int64_t>(k.size()));
  fp32_to_fp16_row(vf.data(), v.data(), static_cast<std::int64_t>(v.size()));
  const auto q = random_floats(n_q * head_dim, 6);
  const auto p = random_floats(n_ctx, 7);
  for (isa level : supported_isas()) {
    ASSERT_TRUE(set_active_isa(level));
    std::vector<float> scores(n_q * n_ctx);
    attention_scores_f16(q.data(), n_q, head_dim, k.data() + head_dim, stride, n_ctx, head_dim,
                         0.5f, scores.data());
    for (int i = 0; i < n_q; ++i) {
      for (int j = 0; j < n_ctx; ++j) {
        double ref = 0;
        for (int d = 0; d < head_dim; ++d) {
          ref += double(q[i * head_dim + d]) * fp16_to_fp32(k[j * stride + head_dim + d]);
        }
        EXPECT_NEAR(scores[i * n_ctx + j], 0.5 * ref, 1e-4) << to_string(level);
      }
    }
    std::vector<float> out(head_dim);
    attention_values_f16(p.data(), n_ctx, v.data(), stride, head_dim, out.data());
    for (int d = 0; d < head_dim; ++d) {
      double ref = 0;
      for (int j = 0; j < n_ctx; ++j) ref += double(p[j]) * fp16_to_fp32(v[j * stride + d]);
      EXPECT_NEAR(out[d], ref, 1e-4) << to_string(level);
    }
  }
}

TEST(bandwidth, refuses_bad_arguments_and_measures_something) {
  EXPECT_FALSE(measure_read_bandwidth(1000, 3));
  EXPECT_FALSE(measure_read_bandwidth(4u << 20, 0));
  EXPECT_FALSE(measure_read_bandwidth(max_probe_bytes + 1, 1));
  auto r = measure_read_bandwidth(4u << 20, 2);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_GT(r->median_gb_per_s, 0.0);
  EXPECT_GE(r->best_gb_per_s, r->median_gb_per_s);
  EXPECT_EQ(r->bytes, 4u << 20);
  EXPECT_DOUBLE_EQ(roofline_tokens_per_s(2'000'000'000, 30.0), 15.0);
}

}  // namespace
}  // namespace tessera::inference
