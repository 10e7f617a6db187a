#include "inference/kernels/compute.hpp"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

// GCC 12's avx512fintrin.h initialises vectors from _mm512_undefined_*() (see gemm_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tessera::inference {

namespace {

// Every probe runs many independent accumulator chains (more than latency x issue width), so it
// measures issue throughput, not the latency of one chain, and stores the chains to a volatile
// sink so the work cannot be dropped. Each returns the multiply-accumulates it did.
volatile float float_sink;
volatile int int_sink;

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double int8_avx512(std::int64_t iters) {
  constexpr int chains = 16;
  __m512i acc[chains];
  for (int k = 0; k < chains; ++k)
    acc[k] = _mm512_set1_epi32(k);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < chains; ++k)
      acc[k] = _mm512_dpbusd_epi32(acc[k], a, b);
  }
  __m512i s = acc[0];
  for (int k = 1; k < chains; ++k)
    s = _mm512_add_epi32(s, acc[k]);
  // The lanes wrap around (vector adds do); summed as unsigned, as _mm512_reduce_add_epi32's
  // plain int adds would overflow, which is undefined (UBSan reports it).
  alignas(64) std::uint32_t lanes[16];
  _mm512_store_si512(lanes, s);
  std::uint32_t sum = 0;
  for (std::uint32_t l : lanes)
    sum += l;
  int_sink = static_cast<int>(sum & 0x7fffffffu);
  return static_cast<double>(iters) * chains * 64;
}

__attribute__((target("avx512f"))) double f32_avx512(std::int64_t iters) {
  constexpr int chains = 16;
  __m512 acc[chains];
  for (int k = 0; k < chains; ++k)
    acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < chains; ++k)
      acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  }
  __m512 s = acc[0];
  for (int k = 1; k < chains; ++k)
    s = _mm512_add_ps(s, acc[k]);
  float_sink = _mm512_reduce_add_ps(s);
  return static_cast<double>(iters) * chains * 16;
}

__attribute__((target("avx512f,avx512bf16"))) double bf16_avx512(std::int64_t iters) {
  constexpr int chains = 16;
  __m512 acc[chains];
  for (int k = 0; k < chains; ++k)
    acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < chains; ++k)
      acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  __m512 s = acc[0];
  for (int k = 1; k < chains; ++k)
    s = _mm512_add_ps(s, acc[k]);
  float_sink = _mm512_reduce_add_ps(s);
  return static_cast<double>(iters) * chains * 32;
}

__attribute__((target("avx2"))) double int8_avx2(std::int64_t iters) {
  constexpr int chains = 8;
  __m256i acc[chains];
  for (int k = 0; k < chains; ++k)
    acc[k] = _mm256_set1_epi32(k);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
    for (int k = 0; k < chains; ++k)
      acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
    // The product does not depend on the loop: keep the compiler from hoisting it out.
    __asm__ volatile("" : "+x"(acc[0]));
  }
  __m256i s = acc[0];
  for (int k = 1; k < chains; ++k)
    s = _mm256_add_epi32(s, acc[k]);
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  int_sink = static_cast<int>((lanes[0] + lanes[7]) & 0x7fffffffu);  // unsigned: no overflow
  return static_cast<double>(iters) * chains * 32;
}

__attribute__((target("avx2,fma"))) double f32_avx2(std::int64_t iters) {
  constexpr int chains = 12;
  __m256 acc[chains];
  for (int k = 0; k < chains; ++k)
    acc[k] = _mm256_set1_ps(static_cast<float>(k));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (std::int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < chains; ++k)
      acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  }
  __m256 s = acc[0];
  for (int k = 1; k < chains; ++k)
    s = _mm256_add_ps(s, acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float_sink = lanes[0] + lanes[7];
  return static_cast<double>(iters) * chains * 8;
}

double f32_scalar(std::int64_t iters) {
  constexpr int chains = 8;
  float acc[chains];
  for (int k = 0; k < chains; ++k)
    acc[k] = static_cast<float>(k);
  for (std::int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < chains; ++k)
      acc[k] = std::fma(acc[k], 0.999f, 1e-3f);
  }
  float s = 0;
  for (float v : acc)
    s += v;
  float_sink = s;
  return static_cast<double>(iters) * chains;
}

// Median G MAC/s of `reps` runs of about `ms` each (the iteration count calibrated once).
double measure(double (*probe)(std::int64_t), int reps, int ms) {
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  std::int64_t iters = 1 << 12;
  for (;;) {  // calibration, also the warm-up (clock ramp, AVX-512 licence)
    const auto t0 = clock::now();
    probe(iters);
    const double s = seconds(t0);
    if (s >= ms * 1e-3 / 4 || iters > (std::int64_t{1} << 40)) {
      iters = std::max<std::int64_t>(
          1, static_cast<std::int64_t>(static_cast<double>(iters) * ms * 1e-3 / std::max(s, 1e-9)));
      break;
    }
    iters *= 4;
  }
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock::now();
    const double macs = probe(iters);
    rates.push_back(macs / seconds(t0) / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

bool cpu_has_bf16() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

}  // namespace

result<compute_sample> measure_compute(isa level, int repetitions, int ms_per_probe) {
  if (repetitions < 1 || repetitions > 100)
    return make_error(errc::invalid_argument, "compute probe: {} repetitions is outside [1, 100]",
                      repetitions);
  if (ms_per_probe < 1 || ms_per_probe > 1000)
    return make_error(errc::invalid_argument, "compute probe: {} ms is outside [1, 1000]",
                      ms_per_probe);
  if (!isa_supported(level))
    return make_error(errc::unsupported, "compute probe: this CPU cannot run {}", to_string(level));
  compute_sample s;
  s.level = level;
  switch (level) {
    case isa::avx512:
      s.int8_gmacs = measure(int8_avx512, repetitions, ms_per_probe);
      s.f32_gmacs = measure(f32_avx512, repetitions, ms_per_probe);
      if (cpu_has_bf16()) s.bf16_gmacs = measure(bf16_avx512, repetitions, ms_per_probe);
      break;
    case isa::avx2:
      s.int8_gmacs = measure(int8_avx2, repetitions, ms_per_probe);
      s.f32_gmacs = measure(f32_avx2, repetitions, ms_per_probe);
      break;
    case isa::scalar:
      s.f32_gmacs = measure(f32_scalar, repetitions, ms_per_probe);
      break;
  }
  return s;
}

std::string describe(const compute_sample& s) {
  std::string out = fmt::format("int8 {:.1f}, f32 {:.1f}", s.int8_gmacs, s.f32_gmacs);
  if (s.bf16_gmacs > 0) out += fmt::format(", bf16 {:.1f}", s.bf16_gmacs);
  return out + fmt::format(" G MAC/s ({}, one thread)", to_string(s.level));
}

}  // namespace tessera::inference
