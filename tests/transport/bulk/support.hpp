// Test support shared by the conformance suite and its peer process (tessera_bulk_peer): default
// options, hex for params on pipes, and the little protocol the two processes speak. No gtest here.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "transport/bulk/link.hpp"

namespace tessera::transport::bulk::testing {

/// Generous bound for anything a test waits for (a loaded 2-core machine, or qemu TCG).
inline constexpr std::chrono::seconds patience{30};

/// Options every conformance test starts from (small bounds so the bounds get exercised).
link_options default_options(backend_kind kind);

/// Hex encoding for passing params through a pipe to the peer process.
std::string to_hex(const std::vector<std::byte>& bytes);
std::vector<std::byte> from_hex(const std::string& text);

}  // namespace tessera::transport::bulk::testing

namespace tessera::transport::bulk::peer_protocol {

struct answer {
  std::uint32_t imm = 0;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
  MSGPACK_DEFINE(imm, bytes, checksum)
};

inline std::uint64_t checksum(std::span<const std::byte> data) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::byte b : data) h = (h ^ std::to_integer<std::uint64_t>(b)) * 1099511628211ull;
  return h;
}

template <class T>
std::vector<std::byte> pack(const T& value) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, value);
  const auto* p = reinterpret_cast<const std::byte*>(buf.data());
  return {p, p + buf.size()};
}

template <class T>
result<T> unpack(std::span<const std::byte> bytes) {
  try {
    T value;
    msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size()).get().convert(value);
    return value;
  } catch (const std::exception& e) {
    return make_error(errc::corrupt, "peer protocol: {}", e.what());
  }
}

inline result<remote_buffer> decode_remote(std::span<const std::byte> b) {
  return unpack<remote_buffer>(b);
}
inline result<answer> decode_answer(std::span<const std::byte> b) { return unpack<answer>(b); }
inline std::vector<std::byte> bye() { return {std::byte{'b'}, std::byte{'y'}, std::byte{'e'}}; }

}  // namespace tessera::transport::bulk::peer_protocol
