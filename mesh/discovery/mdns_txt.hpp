// The TXT record of a _tessera._tcp service (DNS-SD, RFC 6763 key=value strings):
//
//   txtvers=1  cluster=<cluster id>  node=<32 hex>  ctl=<control port>  proto=<protocol version>
//
// Unknown keys are ignored (later versions may add some); a record lacking a required key or
// with a bad value is malformed. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::mesh {

inline constexpr const char* mdns_service_type = "_tessera._tcp";
inline constexpr std::size_t max_txt_entries = 32;
inline constexpr std::size_t max_txt_entry_bytes = 255;  // DNS character-string limit

struct mdns_announcement {
  std::string cluster_id;
  std::string node_id;
  std::uint16_t control_port = 0;
  std::uint32_t protocol_version = 0;
};

[[nodiscard]] std::vector<std::string> encode_txt(const mdns_announcement& a);
/// Errors are errc::corrupt, naming the missing or bad key.
[[nodiscard]] result<mdns_announcement> decode_txt(const std::vector<std::string>& entries);

}  // namespace tessera::mesh
