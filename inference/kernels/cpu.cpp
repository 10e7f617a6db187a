#include "inference/kernels/cpu.hpp"

#include <atomic>
#include <cstdlib>

#include "actors/base/log.hpp"

namespace tessera::inference {

namespace {

struct cpu_flags {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
};

cpu_flags detect() noexcept {
  __builtin_cpu_init();
  cpu_flags f;
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  return f;
}

const cpu_flags& flags() noexcept {
  static const cpu_flags f = detect();
  return f;
}

isa initial_isa() noexcept {
  const char* env = std::getenv("TESSERA_KERNEL_ISA");
  if (env != nullptr && *env != '\0') {
    auto parsed = parse_isa(env);
    if (parsed && isa_supported(*parsed)) return *parsed;
    spdlog::warn("TESSERA_KERNEL_ISA={}: {}; using {}", env,
                 parsed ? "not supported by this CPU" : parsed.error().message,
                 to_string(best_isa()));
  }
  return best_isa();
}

std::atomic<isa>& active() noexcept {
  static std::atomic<isa> level{initial_isa()};
  return level;
}

}  // namespace

std::string_view to_string(isa level) noexcept {
  switch (level) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "unknown";
}

result<isa> parse_isa(std::string_view text) {
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (text == to_string(level)) return level;
  }
  return make_error(errc::invalid_argument, "unknown kernel ISA '{}' (scalar, avx2, avx512)", text);
}

bool isa_supported(isa level) noexcept {
  const auto& f = flags();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (level) {
    case isa::scalar: return true;
    case isa::avx2: return avx2;
    case isa::avx512: return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
  }
  return false;
}

isa best_isa() noexcept {
  if (isa_supported(isa::avx512)) return isa::avx512;
  if (isa_supported(isa::avx2)) return isa::avx2;
  return isa::scalar;
}

std::vector<isa> supported_isas() {
  std::vector<isa> out;
  for (isa level : {isa::scalar, isa::avx2, isa::avx512}) {
    if (isa_supported(level)) out.push_back(level);
  }
  return out;
}

isa active_isa() noexcept { return active().load(std::memory_order_relaxed); }

result<void> set_active_isa(isa level) {
  if (!isa_supported(level)) {
    return make_error(errc::unsupported, "kernel ISA {} is not supported by this CPU ({})",
                      to_string(level), describe_cpu());
  }
  active().store(level, std::memory_order_relaxed);
  return ok();
}

std::string describe_cpu() {
  const auto& f = flags();
  std::string s = std::string(to_string(active_isa())) + " (";
  auto add = [&s](bool have, const char* name) {
    if (!have) return;
    if (s.back() != '(') s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f && f.avx512bw && f.avx512vl, "avx512f/bw/vl");
  add(f.avx512vnni, "vnni");
  add(f.avx512bf16, "bf16");
  s += ')';
  return s;
}

}  // namespace tessera::inference
