#include "inference/kernels/bandwidth.hpp"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "inference/kernels/cpu.hpp"

namespace tessera::inference {

namespace {

// AVX2 loads: on this machine kind 256-bit streaming reads beat 512-bit ones by ~10%.
__attribute__((target("avx2"))) std::uint64_t read_avx2(const std::uint8_t* p,
                                                        std::size_t n) noexcept {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return static_cast<std::uint64_t>(_mm256_extract_epi64(a, 0) ^ _mm256_extract_epi64(a, 3));
}

std::uint64_t read_scalar(const std::uint8_t* p, std::size_t n) noexcept {
  std::uint64_t a0 = 0, a1 = 0;
  for (std::size_t i = 0; i + 16 <= n; i += 16) {
    std::uint64_t v0, v1;
    std::memcpy(&v0, p + i, 8);
    std::memcpy(&v1, p + i + 8, 8);
    a0 ^= v0;
    a1 ^= v1;
  }
  return a0 ^ a1;
}

struct mapping {
  void* ptr = MAP_FAILED;
  std::size_t bytes = 0;
  ~mapping() {
    if (ptr != MAP_FAILED) munmap(ptr, bytes);
  }
};

}  // namespace

result<bandwidth_sample> measure_read_bandwidth(std::size_t bytes, int repetitions,
                                                thread_pool* pool) {
  if (bytes < (1u << 20) || bytes > max_probe_bytes) {
    return make_error(errc::invalid_argument, "bandwidth probe size {} B is outside [1 MiB, {} B]",
                      bytes, max_probe_bytes);
  }
  if (repetitions < 1 || repetitions > 1000) {
    return make_error(errc::invalid_argument, "bandwidth probe repetitions {} outside [1, 1000]",
                      repetitions);
  }
  bytes = bytes / 4096 * 4096;
  mapping m;
  m.bytes = bytes;
  m.ptr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m.ptr == MAP_FAILED) {
    return make_error(errc::io, "bandwidth probe: mmap of {} B failed: {}", bytes,
                      std::strerror(errno));
  }
  bandwidth_sample out;
  out.bytes = bytes;
  out.threads = pool ? pool->size() : 1;
  out.huge_pages = madvise(m.ptr, bytes, MADV_HUGEPAGE) == 0;
  std::memset(m.ptr, 1, bytes);  // populate: measure reads, not page faults

  const auto* base = static_cast<const std::uint8_t*>(m.ptr);
  const bool simd = isa_supported(isa::avx2);
  std::atomic<std::uint64_t> sink{0};
  auto read_part = [&](int index, int size) {
    // Ranges on 4 KiB boundaries so the aligned 32-byte loads stay aligned.
    const std::size_t pages = bytes / 4096;
    const std::size_t begin = pages * static_cast<std::size_t>(index) / static_cast<std::size_t>(size) * 4096;
    const std::size_t end = pages * static_cast<std::size_t>(index + 1) / static_cast<std::size_t>(size) * 4096;
    const std::uint64_t v = simd ? read_avx2(base + begin, end - begin)
                                 : read_scalar(base + begin, end - begin);
    sink.fetch_xor(v, std::memory_order_relaxed);
  };
  std::vector<double> rates;
  for (int rep = 0; rep < repetitions + 1; ++rep) {  // the first pass warms TLBs and is dropped
    const auto start = std::chrono::steady_clock::now();
    if (pool != nullptr) {
      pool->run(read_part);
    } else {
      read_part(0, 1);
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (rep > 0) rates.push_back(static_cast<double>(bytes) / took.count() / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  out.median_gb_per_s = rates[rates.size() / 2];
  out.best_gb_per_s = rates.back();
  return out;
}

}  // namespace tessera::inference
