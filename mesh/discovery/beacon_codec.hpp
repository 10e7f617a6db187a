// The UDP beacon datagram, version 1 (all integers big-endian):
//
//   0  "TSRB"            magic
//   4  u8  version = 1
//   5  u8  flags          bit 0: a 32-byte HMAC-SHA256 trailer follows
//   6  u16 control_port   1..65535
//   8  16  node_id        128 bits, never zero
//  24  u32 protocol_version
//  28  u8  cluster_len    1..64, then cluster_len bytes of cluster id
//      u8  host_len       0..253, then host bytes (0: use the datagram's source address)
//      [32 bytes HMAC-SHA256(beacon_key, every byte before it)]
//
// At most max_beacon_bytes. Pure functions: no sockets, fuzzable.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::mesh {

inline constexpr std::size_t max_beacon_bytes = 512;
inline constexpr std::uint8_t beacon_version = 1;

/// The key beacons are authenticated with, derived from the cluster secret.
using beacon_key = std::array<std::uint8_t, 32>;

/// HMAC-SHA256(secret, "tessera beacon key v1"): separated from every other use of the secret.
[[nodiscard]] beacon_key derive_beacon_key(std::span<const std::uint8_t> cluster_secret);

struct beacon {
  std::string node_id;  ///< 32 lowercase hex digits
  std::string cluster_id;
  std::string host;  ///< may be empty
  std::uint16_t control_port = 0;
  std::uint32_t protocol_version = 0;
};

/// Encodes `b`; with a key, appends the MAC. invalid_argument if a field breaks the bounds.
[[nodiscard]] result<std::vector<std::uint8_t>> encode_beacon(const beacon& b,
                                                              const std::optional<beacon_key>& key);

/// Decodes a datagram. Errors: corrupt (malformed: short, bad magic, lengths, characters),
/// unsupported (another version), unauthorized (a key is set and the MAC is absent or wrong).
[[nodiscard]] result<beacon> decode_beacon(std::span<const std::uint8_t> datagram,
                                           const std::optional<beacon_key>& key);

}  // namespace tessera::mesh
