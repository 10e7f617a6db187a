// The rdma bulk backend: libibverbs directly, one RC queue pair per link.
//
// A link (see link.hpp for the semantics every backend shares) is one RC QP with a send CQ and a
// receive CQ on one completion channel:
//
//   prepare_link(rdma)           connect(remote params)                 link
//   ─────────────────            ──────────────────────────────         ─────────────────────────
//   open device, pick GID,       INIT ─► RTR (dest QPN/PSN/GID/MTU)     write_with_imm: RDMA WRITE
//   PD, channel, 2 CQs,            ─► RTS (timeout, retry_cnt,            chunks of <= max_msg (rxe:
//   QP in INIT, receives           rnr_retry) ─► SEND hello(nonce)        8 MiB), last one WITH_IMM
//   posted, params = QPN,          ─► wait for the peer's hello;         send: SEND_WITH_IMM from a
//   PSN, GID, LID, MTU, nonce      a hello that hit a QP not yet in       registered staging slot
//                                  RTR (retry exceeded) resets the QP    wait: spin, then block on
//                                  and tries again until the deadline     the completion channel
//
// Receives: the receiver keeps rq_depth receives posted; a WRITE_WITH_IMM consumes one (carrying
// the immediate), a SEND consumes one (carrying the bytes, copied out and the buffer reposted at
// once). Immediates of SENDs name a control type (user message, hello, bye, chunked-write notice)
// so control traffic never reaches the user. A write longer than one message goes out as plain
// RDMA WRITEs followed by a notice SEND with {imm, total bytes}: RC keeps them in order, so the
// notice arrives after the last byte.
//
// Failure: the ACK timeout (with retry_cnt 6; rxe reads 7 as infinite) is derived from link_options::peer_timeout_ms, so an
// operation towards a dead peer ends in IBV_WC_RETRY_EXC_ERR within about that time. rnr_retry is
// infinite: an RNR NAK comes only from a live peer that has not yet reposted receives (that is
// backpressure, not death). An idle link whose owner waits sends a zero-byte RDMA WRITE probe every
// keepalive interval, so a peer that died while nothing was moving is detected too. The first error
// completion takes the link down: every pending operation completes with that error, one link_down
// completion follows, the QP goes to the error state, and every later call returns errc::closed.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::transport::bulk::rdma {

/// One GID table entry. `type` follows enum ibv_gid_type (0 IB, 1 RoCE v1, 2 RoCE v2).
struct gid_entry {
  std::uint32_t index = 0;
  std::uint32_t type = 0;
  std::array<std::uint8_t, 16> gid{};
  /// ::ffff:a.b.c.d — a RoCE GID derived from an IPv4 address.
  [[nodiscard]] bool ipv4_mapped() const noexcept;
  [[nodiscard]] bool link_local() const noexcept;  ///< fe80::/10
};

inline constexpr std::uint32_t gid_type_ib = 0;
inline constexpr std::uint32_t gid_type_roce_v1 = 1;
inline constexpr std::uint32_t gid_type_roce_v2 = 2;

/// One port of a device, as far as link set-up and capability exchange care.
struct port_info {
  std::uint8_t port = 1;
  bool active = false;
  std::uint8_t active_mtu = 0;  ///< enum ibv_mtu (3 = 1024)
  std::uint16_t lid = 0;
  std::uint32_t max_msg_bytes = 0;
  bool ethernet = false;  ///< RoCE (GRH required) rather than InfiniBand
  std::vector<gid_entry> gids;
};

struct device_info {
  std::string name;
  std::uint64_t node_guid = 0;
  std::vector<port_info> ports;
};

/// Every RDMA device of this host with its ports and GID tables. An empty list (not an error)
/// when there is none; errc::io when a device exists but cannot be opened or queried.
[[nodiscard]] result<std::vector<device_info>> list_devices();

/// The GID a RoCE link should use: the RoCE v2 entry of `prefer_ipv4` (the node's advertised
/// address, dotted text) when the table has one; else the first IPv4-mapped RoCE v2 entry; else a
/// RoCE v2 entry that is not link-local; else (InfiniBand) entry 0. errc::not_found when the table
/// has none of these.
[[nodiscard]] result<std::uint32_t> pick_gid(std::span<const gid_entry> gids, bool ethernet,
                                             const std::string& prefer_ipv4 = {});

/// "::ffff:10.0.2.15"-style text for logs and errors.
[[nodiscard]] std::string format_gid(std::span<const std::uint8_t> gid);

/// The QP's local ACK timeout exponent (4.096 us * 2^t per try) such that the whole retry budget
/// (retry_cnt + 1 tries) is about `peer_timeout`; clamped to [10, 22] (4 ms .. 17 s per try).
[[nodiscard]] std::uint8_t ack_timeout_exponent(std::chrono::milliseconds peer_timeout,
                                                std::uint8_t retry_cnt) noexcept;

/// How many RDMA WRITE work requests a write of `bytes` needs with messages of at most
/// `max_msg_bytes` (>= 1; a 0-byte write still takes one).
[[nodiscard]] std::uint64_t chunk_count(std::uint64_t bytes, std::uint64_t max_msg_bytes) noexcept;

}  // namespace tessera::transport::bulk::rdma
