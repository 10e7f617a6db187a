// Internal: the tile driver shared by the SIMD kernel files. A kernel is a set of register tiles
// Tile<R, T>::run(args, r0, t0) computing R rows x T tokens; the driver walks the rows in steps of
// MaxR (outer loop: each group of weight rows is loaded from memory once and reused from cache for
// every token) and the tokens in steps of MaxT, picking the tile that fits the remainder.
#pragma once

#include <algorithm>
#include <array>
#include <utility>

#include "inference/kernels/gemm_kernels.hpp"

namespace tessera::inference::detail {

// Internal linkage on purpose: each kernel file instantiates drive_tiles with its own tiles, and
// GCC gives an instantiation over a template template argument from an unnamed namespace a weak
// *external* symbol — the AVX2 and AVX-512 q4_K drivers then had the same name and the linker kept
// one of them for both tables (an AVX-512 kernel in the AVX2 table would crash AVX2-only CPUs).
namespace {

using tile_fn = void (*)(const gemm_args&, std::int64_t r0, std::int64_t t0) noexcept;

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

}  // namespace

}  // namespace tessera::inference::detail
