// The node's control messages between peers: types, the bodies defined here, and the msgpack
// helpers every side of the wire uses (docs/design/011-node-runtime.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <msgpack.hpp>

#include "actors/base/msgpack_bounded.hpp"
#include "mesh/membership/ids.hpp"
#include "mesh/topology/topology.hpp"

namespace tessera::mesh::runtime {

enum class runtime_msg : std::uint16_t {
  membership = 64,
  election = 65,
  topo_ping = 66,
  topo_pong = 67,
  topo_report = 68,
  topo_view = 69,
  status_request = 70,
  status_reply = 71,
  bulk_offer = 72,   ///< bandwidth probe: initiator's bulk connect params
  bulk_answer = 73,  ///< bandwidth probe: responder's bulk connect params
  plan = 74,         ///< the leader's serving plan (placement::plan), to every live member
  group_link = 75,   ///< bulk connect params between the ranks of a group split over peers
  model_share = 76,  ///< model distribution: a fetcher's offer / a holder's answer (share_setup)
};

/// topo.ping / topo.pong: a round-trip probe carrying the sender's capabilities.
struct ping_body {
  std::uint64_t seq = 0;
  std::int64_t sent_ns = 0;
  topology::capabilities caps;
  MSGPACK_DEFINE_MAP(seq, sent_ns, caps);
};

/// A message body's bytes as the control plane takes them (control_node::send).
inline std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

template <class T>
std::string pack(const T& value) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, value);
  return std::string(buf.data(), buf.size());
}

/// nullopt when `data` is not a valid T (bounded: a hostile frame cannot make it allocate more
/// than its own size allows).
template <class T>
std::optional<T> unpack(std::string_view data) {
  auto r = tessera::bounded_decode<T>(data.data(), data.size());
  if (!r) return std::nullopt;
  return std::move(*r);
}

/// "hexid@tcp://host:port" -> (hexid, endpoint); nullopt for anything else.
[[nodiscard]] std::optional<std::pair<std::string, std::string>> split_address(std::string_view a);
/// The member id of a node id's text (its low 64 bits); no_member when it is not a node id.
[[nodiscard]] member_id member_of(std::string_view hex);

}  // namespace tessera::mesh::runtime
