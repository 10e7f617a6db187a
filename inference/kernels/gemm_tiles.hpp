// Internal: the tile driver shared by the SIMD kernel files. A kernel is a set of register tiles
// Tile<R, T>::run(args, r0, t0) computing R rows x T tokens; the driver walks the rows in steps of
// MaxR (outer loop: each group of weight rows is loaded from memory once and reused from cache for
// every token) and the tokens in steps of MaxT, picking the tile that fits the remainder.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "inference/kernels/gemm_kernels.hpp"

namespace tessera::inference::detail {

// Internal linkage on purpose: each kernel file instantiates drive_tiles with its own tiles, and
// GCC gives an instantiation over a template template argument from an unnamed namespace a weak
// *external* symbol — the AVX2 and AVX-512 q4_K drivers then had the same name and the linker kept
// one of them for both tables (an AVX-512 kernel in the AVX2 table would crash AVX2-only CPUs).
namespace {

using tile_fn = void (*)(const gemm_args&, std::int64_t r0, std::int64_t t0) noexcept;

// Decode (one token) streams each weight row once, R rows side by side. The rows of a layer are
// short (1-3 KB), so the hardware stream prefetcher keeps re-training on every new group of rows
// and a single thread reached only ~17 GB/s of the ~40 GB/s a plain sequential read gets here
// (bench/RESULTS.md, issue 5). A decode tile therefore prefetches, at every step, the same place
// `decode_prefetch_ahead` bytes further on: the rows of a later tile, at least 8 KiB ahead per
// row stream (measured best of 4/8/12/16 KiB; more evicts lines from L1 before their use).
inline constexpr std::size_t decode_prefetch_bytes = 8192;

// A batch tile (2 or more tokens over weights in panels) reads one panel, one stream, at a time,
// and the hardware prefetcher alone held such a stream to ~19 GB/s where 8 streams reach ~30: the
// 8-token q8_0 panel tile waited on memory (large Q8_0 in panels, 8 streams: 216-225 tok/s).
// So it prefetches the panel this many bytes ahead too (316-354 tok/s; q4_K, 8 streams: 265-274
// -> 322-342; bench/RESULTS.md, issue 35). 8, 16 and 32 KiB were within noise of each other,
// 2 KiB clearly worse. Not for panels packed into a scratch buffer, which are in L1 already and
// end sooner.
inline constexpr std::size_t batch_prefetch_bytes = 16384;

[[nodiscard]] inline std::size_t decode_prefetch_ahead(std::size_t w_stride, int rows) noexcept {
  const std::size_t whole_rows = (decode_prefetch_bytes + w_stride - 1) / w_stride;
  return std::max<std::size_t>(static_cast<std::size_t>(rows), whole_rows) * w_stride;
}

// A prefetch hint for p + offset. Integer arithmetic on purpose: past the last row the address
// lies outside the weights (a prefetch never faults, but forming such a pointer would be UB).
// Into L2 (prefetcht2), not L1: L1 tracks only a few misses at once, so with a slow memory day
// (~166 ns) L1 prefetches capped the stream at ~9 GB/s where L2 ones reached ~30 (005-kernels.md).
inline void prefetch_ahead(const void* p, std::size_t offset) noexcept {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + offset),
                     /*rw=*/0, /*locality=*/1);
}

template <template <int, int> class Tile, int MaxR, int MaxT, std::size_t... I>
constexpr std::array<tile_fn, MaxR * MaxT> make_tiles(std::index_sequence<I...>) {
  return {&Tile<static_cast<int>(I) / MaxT + 1, static_cast<int>(I) % MaxT + 1>::run...};
}

template <template <int, int> class Tile, int MaxR, int MaxT>
void drive_tiles(const gemm_args& g) noexcept {
  static constexpr auto tiles =
      make_tiles<Tile, MaxR, MaxT>(std::make_index_sequence<MaxR * MaxT>{});
  for (std::int64_t r0 = 0; r0 < g.rows; r0 += MaxR) {
    const auto nr = static_cast<int>(std::min<std::int64_t>(MaxR, g.rows - r0));
    for (std::int64_t t0 = 0; t0 < g.n_tokens; t0 += MaxT) {
      const auto nt = static_cast<int>(std::min<std::int64_t>(MaxT, g.n_tokens - t0));
      tiles[static_cast<std::size_t>((nr - 1) * MaxT + (nt - 1))](g, r0, t0);
    }
  }
}

// Every cache line of [p + offset, p + offset + bytes): for the K-quant blocks (144 or 210 bytes
// per step of one row).
inline void prefetch_span_ahead(const void* p, std::size_t bytes, std::size_t offset) noexcept {
  for (std::size_t o = 0; o < bytes; o += 64) prefetch_ahead(p, offset + o);
  prefetch_ahead(p, offset + bytes - 1);
}

}  // namespace

}  // namespace tessera::inference::detail
