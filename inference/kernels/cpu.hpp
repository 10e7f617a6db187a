// Which SIMD instruction set the kernels use: detected at run time, overridable for tests and
// benchmarks. The project is never compiled with -march=native (the qemu VM of the RDMA tests has
// no AVX-512); each SIMD kernel carries its own __attribute__((target(...))) and is only called
// after __builtin_cpu_supports says the CPU has it.
#pragma once

#include <string_view>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::inference {

/// Kernel instruction-set tiers, each a superset of the one before.
enum class isa {
  scalar = 0,  ///< portable C++, the reference
  avx2 = 1,    ///< AVX2 + FMA + F16C
  avx512 = 2,  ///< avx2 + AVX-512 F/BW/VL/VNNI (vpdpbusd); AVX512_BF16 used where present
};

[[nodiscard]] std::string_view to_string(isa level) noexcept;
/// Parses "scalar", "avx2", "avx512".
[[nodiscard]] result<isa> parse_isa(std::string_view text);

/// Whether this CPU can run `level`.
[[nodiscard]] bool isa_supported(isa level) noexcept;
/// The best tier this CPU supports.
[[nodiscard]] isa best_isa() noexcept;
/// Every tier this CPU supports, scalar first (tests run each against the scalar reference).
[[nodiscard]] std::vector<isa> supported_isas();

/// The tier the kernels use now. Initially best_isa(), or the environment variable
/// TESSERA_KERNEL_ISA (scalar|avx2|avx512) when set to a supported tier; an unsupported or
/// malformed value is logged once and ignored.
[[nodiscard]] isa active_isa() noexcept;
/// Forces a tier (tests, benchmarks). Error when the CPU lacks it. Not meant to be called while
/// kernels run on other threads (the switch is atomic, but a running matmul keeps its tier).
[[nodiscard]] result<void> set_active_isa(isa level);

/// A one-line description for logs: "avx512 (avx2 fma f16c avx512f/bw/vl vnni bf16)".
[[nodiscard]] std::string describe_cpu();

}  // namespace tessera::inference
