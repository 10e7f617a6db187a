// Forward-pass ops against straightforward double-precision references, on every ISA path;
// bandwidth probe argument checks.
#include "inference/kernels/ops.hpp"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "inference/kernels/attention.hpp"
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

// SwiGLU on every ISA: within a few ulp of silu(g) * u in double, finite at the extremes, an
// element's bits independent of where it falls in the call (the tail of n % 8 goes through the
// same code), and in place.
TEST(ops, swiglu_on_every_isa_is_accurate_finite_and_position_independent) {
  test::isa_guard guard;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-12.0f, 12.0f);
  std::vector<float> g(203), u(203);
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = d(rng);
    u[i] = d(rng);
  }
  g[0] = -100.0f;  // e^100 overflows float: silu is ~-0
  g[1] = 100.0f;   // e^-100 underflows: silu is g
  g[2] = 0.0f;
  for (isa level : supported_isas()) {
    ASSERT_TRUE(set_active_isa(level));
    std::vector<float> all(g.size());
    swiglu(g.data(), u.data(), all.data(), static_cast<std::int64_t>(g.size()));
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double want = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
      ASSERT_TRUE(std::isfinite(all[i])) << to_string(level) << " i " << i;
      EXPECT_NEAR(all[i], want, 4e-7 * std::fabs(want) + 1e-30) << to_string(level) << " i " << i;
    }
    // The same elements in calls of 13 (a vector step and a tail of 5), in place.
    for (std::size_t i0 = 0; i0 < g.size(); i0 += 13) {
      const std::size_t n = std::min<std::size_t>(13, g.size() - i0);
      std::vector<float> part(g.begin() + i0, g.begin() + i0 + n);
      swiglu(part.data(), u.data() + i0, part.data(), static_cast<std::int64_t>(n));
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(part[i], all[i0 + i]) << to_string(level) << " i " << i0 + i;
    }
  }
}

// What a cache of type t holds for n floats: f16-rounded, or q8_0-quantized and back.
std::vector<float> as_stored(kv_cache_type t, const float* x, int n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  if (t == kv_cache_type::f16) {
    for (int i = 0; i < n; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
  } else {
    std::vector<block_q8_0> q(static_cast<std::size_t>(n / qk8_0));
    quantize_row_q8_0(x, q.data(), n);
    dequantize_row_q8_0(q.data(), out.data(), n);
  }
  return out;
}

// A reference for one query: scores in double over the keys and values as the cache holds them
// (and, for q8_0, the query quantized as the kernel quantizes it), softmax and the weighted sum in
// double.
std::vector<double> attention_reference(kv_cache_type t, const std::vector<float>& q,
                                        const std::vector<float>& kf, const std::vector<float>& vf,
                                        int n_att, int head_dim, double scale) {
  const auto qs = t == kv_cache_type::f16 ? q : as_stored(t, q.data(), head_dim);
  std::vector<double> sc(static_cast<std::size_t>(n_att));
  double mx = -1e300, sum = 0;
  for (int j = 0; j < n_att; ++j) {
    const auto k = as_stored(t, kf.data() + j * head_dim, head_dim);
    double dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += double(qs[d]) * k[d];
    sc[j] = scale * dot;
    mx = std::max(mx, sc[j]);
  }
  for (auto& x : sc)
    sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<std::size_t>(head_dim), 0.0);
  for (int j = 0; j < n_att; ++j) {
    const auto v = as_stored(t, vf.data() + j * head_dim, head_dim);
    for (int d = 0; d < head_dim; ++d) out[d] += sc[j] / sum * v[d];
  }
  return out;
}

// Both cache types; contexts long enough for several of the value pass's chunks (64 positions)
// and a last panel and chunk that are not whole.
TEST(attention, a_block_matches_the_reference_and_each_query_alone_bit_for_bit) {
  isa_guard guard;
  for (kv_cache_type type : {kv_cache_type::f16, kv_cache_type::q8_0}) {
    for (int head_dim : {40, 64, 96, 128}) {
      if (!kv_cache_supports(type, head_dim)) {
        EXPECT_TRUE(type == kv_cache_type::q8_0 && head_dim % 32 != 0);
        continue;
      }
      for (int n_ctx : {37, 203}) {
        const int n_q = 10;  // queries see n_ctx - 9 .. n_ctx positions (a causal prefill block)
        const auto kf = random_floats(n_ctx * head_dim, 4), vf = random_floats(n_ctx * head_dim, 5);
        const std::size_t pb = kv_position_bytes(type, head_dim);
        std::vector<std::uint8_t> keys(static_cast<std::size_t>(key_cache_positions(n_ctx)) * pb);
        std::vector<std::uint8_t> values(static_cast<std::size_t>(n_ctx) * pb);
        for (int j = 0; j < n_ctx; ++j) {
          store_key(type, kf.data() + j * head_dim, head_dim, keys.data(), j);
          store_value(type, vf.data() + j * head_dim, head_dim, values.data(), j);
        }
        const auto qf = random_floats(n_q * head_dim, 6);
        std::vector<std::int64_t> n_att(n_q);
        for (int i = 0; i < n_q; ++i)
          n_att[i] = n_ctx - 9 + i % 10;
        std::vector<float> scratch(attention_scratch_floats(n_q, n_ctx, head_dim));
        auto run = [&](int first, int count) {
          std::vector<float> out(static_cast<std::size_t>(count * head_dim), -1.0f);
          std::vector<const float*> qs;
          std::vector<float*> outs;
          for (int i = 0; i < count; ++i) {
            qs.push_back(qf.data() + (first + i) * head_dim);
            outs.push_back(out.data() + i * head_dim);
          }
          attention_block a;
          a.q = qs.data();
          a.out = outs.data();
          a.n_att = n_att.data() + first;
          a.n_q = count;
          a.type = type;
          a.keys = keys.data();
          a.values = values.data();
          a.head_dim = head_dim;
          a.scale = 0.3f;
          a.scratch = scratch.data();
          attend(a);
          return out;
        };
        for (isa level : supported_isas()) {
          ASSERT_TRUE(set_active_isa(level));
          const auto block = run(0, n_q);
          for (int i = 0; i < n_q; ++i) {
            const std::vector<float> qi(qf.begin() + i * head_dim, qf.begin() + (i + 1) * head_dim);
            const auto ref = attention_reference(type, qi, kf, vf, static_cast<int>(n_att[i]),
                                                 head_dim, 0.3);
            for (int d = 0; d < head_dim; ++d)
              ASSERT_NEAR(block[i * head_dim + d], ref[d], 2e-5)
                  << to_string(type) << " " << to_string(level) << " hd " << head_dim << " n "
                  << n_ctx << " q " << i << " d " << d;
            // Alone (decode) or in another block: the same bits.
            const auto alone = run(i, 1);
            for (int d = 0; d < head_dim; ++d)
              ASSERT_EQ(alone[d], block[i * head_dim + d]) << to_string(level) << " q " << i;
          }
          const auto tail = run(3, 5);
          for (int d = 0; d < 5 * head_dim; ++d)
            ASSERT_EQ(tail[d], block[3 * head_dim + d]);
        }
      }
    }
  }
}

TEST(attention, kv_cache_types_parse_and_name_themselves) {
  EXPECT_EQ(parse_kv_cache_type("f16"), kv_cache_type::f16);
  EXPECT_EQ(parse_kv_cache_type("q8_0"), kv_cache_type::q8_0);
  EXPECT_FALSE(parse_kv_cache_type("q4_0"));
  EXPECT_FALSE(parse_kv_cache_type(""));
  EXPECT_EQ(to_string(kv_cache_type::q8_0), "q8_0");
  EXPECT_EQ(kv_position_bytes(kv_cache_type::f16, 64), 128u);
  EXPECT_EQ(kv_position_bytes(kv_cache_type::q8_0, 64), 68u);
  EXPECT_FALSE(kv_cache_supports(kv_cache_type::q8_0, 80));
  EXPECT_FALSE(kv_cache_supports(kv_cache_type::q8_0, 2048));
  EXPECT_TRUE(kv_cache_supports(kv_cache_type::f16, 80));
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
