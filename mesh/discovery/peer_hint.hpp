// peer_hint: what a discovery source reports. A hint is a rumour, never truth: it says "a node
// that claims to belong to cluster C may be reachable at host:port". Membership decides what is
// true after it has talked to the peer over the authenticated control plane.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::mesh {

/// A host (IPv4/IPv6 literal or DNS name, never resolved here) and a port.
struct endpoint {
  std::string host;
  std::uint16_t port = 0;

  [[nodiscard]] std::string to_string() const;  ///< "host:port", "[v6]:port"
  bool operator==(const endpoint&) const = default;
};

/// Parses "host:port", "[v6addr]:port". Port 1..65535; host 1..253 chars of [A-Za-z0-9.-_:].
[[nodiscard]] result<endpoint> parse_endpoint(std::string_view text);

enum class hint_source : std::uint8_t { mdns, beacon, seed };
[[nodiscard]] const char* to_string(hint_source s) noexcept;

/// Bounds shared by every source (hints come from the network: everything is bounded).
inline constexpr std::size_t max_cluster_id_bytes = 64;
inline constexpr std::size_t max_host_bytes = 253;
inline constexpr std::size_t max_endpoints_per_hint = 4;

struct peer_hint {
  std::string node_id;            ///< 32 hex digits; empty for a seed (not met yet)
  std::string cluster_id;         ///< empty for a seed (learned on contact)
  std::vector<endpoint> control;  ///< control endpoints, best first; 1..max_endpoints_per_hint
  hint_source source = hint_source::seed;
  std::uint32_t protocol_version = 0;  ///< 0 when the source does not carry it (seeds)
  std::chrono::system_clock::time_point seen_at{};
};

/// True when `id` is 32 lowercase hex digits (the node id form every source checks).
[[nodiscard]] bool is_node_id_text(std::string_view id) noexcept;

/// True when `id` is 1..max_cluster_id_bytes printable ASCII without spaces, '=' or ','.
[[nodiscard]] bool is_cluster_id_text(std::string_view id) noexcept;

}  // namespace tessera::mesh
