// Messages: plain structs with a stable type id, serialisable with msgpack-cxx.
//
// The same struct travels to a local actor (moved, never serialised) or to a remote one (packed
// into an envelope body). A message type declares its wire name once:
//
//   struct ping {
//     TESSERA_MESSAGE("tessera.example.ping");
//     std::uint64_t seq = 0;
//     MSGPACK_DEFINE(seq);
//   };
//
// The type id is the 32-bit FNV-1a hash of that name, so two builds agree on it without a shared
// table, and renaming a C++ type does not change the wire format.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include <msgpack.hpp>

namespace tessera::actors {

/// 32-bit FNV-1a of `text`; constexpr so type ids are compile-time constants.
constexpr std::uint32_t fnv1a32(std::string_view text) noexcept {
  std::uint32_t hash = 2166136261u;
  for (char c : text) {
    hash ^= static_cast<std::uint8_t>(c);
    hash *= 16777619u;
  }
  return hash;
}

/// A message type: has `type_id` and `type_name` (from TESSERA_MESSAGE) and can be moved.
template <class T>
concept message = requires {
  { T::type_id } -> std::convertible_to<std::uint32_t>;
  { T::type_name } -> std::convertible_to<std::string_view>;
} && std::move_constructible<T>;

/// Why an actor stopped. `normal` and `shutdown` are orderly; `failed` means a handler threw or the
/// actor gave up (supervisors restart on it); `killed` means another party stopped it.
enum class exit_kind : std::uint8_t { normal = 0, failed = 1, shutdown = 2, killed = 3, unknown = 4 };

std::string_view to_string(exit_kind kind) noexcept;

}  // namespace tessera::actors

MSGPACK_ADD_ENUM(tessera::actors::exit_kind);

/// Declares the wire name and type id of a message struct (first line of the struct body).
#define TESSERA_MESSAGE(name)                                        \
  static constexpr std::string_view type_name = name;                \
  static constexpr std::uint32_t type_id = ::tessera::actors::fnv1a32(name)

namespace tessera::actors {

/// The reason carried by down and child_exit messages.
struct exit_reason {
  exit_kind kind = exit_kind::normal;
  std::string detail;

  [[nodiscard]] bool abnormal() const noexcept {
    return kind == exit_kind::failed || kind == exit_kind::killed || kind == exit_kind::unknown;
  }
  [[nodiscard]] std::string describe() const;
  bool operator==(const exit_reason&) const = default;
  MSGPACK_DEFINE(kind, detail);
};

}  // namespace tessera::actors
