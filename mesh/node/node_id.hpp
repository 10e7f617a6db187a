// node_id: the 128-bit random identity of a node, created once per data directory.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

#include "actors/base/result.hpp"

namespace tessera::mesh {

/// A node's identity: 128 random bits, written as 32 lowercase hex digits. The all-zero id is
/// reserved as "unknown" (a seed address whose node we have not met yet).
struct node_id {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;

  [[nodiscard]] bool is_zero() const noexcept { return hi == 0 && lo == 0; }
  [[nodiscard]] std::string to_string() const;
  /// Parses exactly 32 hex digits (either case); anything else is invalid_argument.
  [[nodiscard]] static result<node_id> parse(std::string_view text);
  /// 128 bits from the kernel's CSPRNG (getrandom); never returns the zero id.
  [[nodiscard]] static result<node_id> random();

  auto operator<=>(const node_id&) const = default;
};

}  // namespace tessera::mesh
