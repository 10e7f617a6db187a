// msgpack decoding of bytes from outside the process, bounded by their size.
//
// msgpack-c trusts the length in a header: an array32 header claiming 4 billion elements makes
// it allocate them before it finds the input short. One such frame from a client took every peer
// down (ASan: out-of-memory; a plain build would die the same way or swap). A valid object needs
// at least one byte per element, so limits equal to the input size refuse nothing valid and bound
// the allocation to a small multiple of the input. Nesting is bounded as well.
#pragma once

#include <algorithm>
#include <cstddef>

#include <msgpack.hpp>

#include "actors/base/result.hpp"

namespace tessera {

inline constexpr std::size_t kMaxMsgpackDepth = 64;

/// msgpack::unpack with per-input limits; throws what msgpack::unpack throws (a
/// msgpack::unpack_error or std::bad_cast family, all std::exception) on malformed input.
[[nodiscard]] inline msgpack::object_handle bounded_unpack(const char* data, std::size_t size) {
  const std::size_t n = std::max<std::size_t>(size, 1);
  const msgpack::unpack_limit limit(n, n / 2 + 1, n, n, n, kMaxMsgpackDepth);
  return msgpack::unpack(data, size, nullptr, nullptr, limit);
}

/// Decodes a T from outside bytes with bounded_unpack's limits: the one adapter from msgpack's
/// exceptions to a result. errc::corrupt carries msgpack's reason; callers say what they decoded.
template <class T>
[[nodiscard]] result<T> bounded_decode(const void* data, std::size_t size) {
  T out{};
  try {
    auto oh = bounded_unpack(static_cast<const char*>(data), size);
    oh.get().convert(out);
  } catch (const std::exception& e) {
    return make_error(errc::corrupt, "{}", e.what());
  }
  return out;
}

}  // namespace tessera
