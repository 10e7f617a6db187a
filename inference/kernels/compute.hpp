// Compute-throughput probe: the physical limit of prefill and batched decode (each weight loaded
// is used for many tokens, so the multiply-accumulate units bound them, not memory), measured on
// one thread at run time as the bandwidth probe measures decode's limit. `tessera bench` prints
// prefill against it as it prints decode against the roofline (issue 35).
#pragma once

#include <string>

#include "actors/base/result.hpp"
#include "inference/kernels/cpu.hpp"

namespace tessera::inference {

/// Peak multiply-accumulates per second of one thread, in G MAC/s (1e9), each the median of the
/// repetitions, with the instructions the kernels of `level` use. 0 where the tier lacks them.
struct compute_sample {
  isa level = isa::scalar;
  /// int8 x int8 products summed into int32: vpdpbusd on zmm (avx512), vpmaddubsw + vpmaddwd +
  /// vpaddd on ymm (avx2: 3 instructions per 32 products). What q8_0 / q4_0 / K-quant mat-muls do.
  double int8_gmacs = 0;
  /// f32 fused multiply-adds (zmm for avx512, ymm for avx2, scalar fmaf otherwise): the ceiling
  /// of f32 / f16 / bf16 weights with f32 activations.
  double f32_gmacs = 0;
  /// vdpbf16ps (AVX512_BF16: two bf16 products per f32 lane): 0 where the CPU lacks it.
  double bf16_gmacs = 0;
};

/// Runs each probe for about `ms_per_probe` milliseconds per repetition. Errors: repetitions
/// outside [1, 100], ms_per_probe outside [1, 1000].
[[nodiscard]] result<compute_sample> measure_compute(isa level, int repetitions = 5,
                                                     int ms_per_probe = 20);

/// "int8 182.3, f32 58.1, bf16 116.0 G MAC/s (avx512, one thread)".
[[nodiscard]] std::string describe(const compute_sample& s);

}  // namespace tessera::inference
