// Control-plane frame codec: pure functions, no sockets, no threads, no allocation on decode.
//
// Wire format (one ZeroMQ message part; all integers little-endian):
//
//   offset size field
//   0      2    magic        'T' 'C'
//   2      1    version      kProtocolVersion (1); anything else is rejected (bad_version)
//   3      1    sender_len   1..kMaxNodeIdLen
//   4      2    type         msg_type (transport range or application range >= 64)
//   6      2    flags        reserved, must be 0
//   8      4    body_len     length of the msgpack body in bytes
//   12     8    epoch        the sender's epoch (set by the mesh: plan/term it acts under)
//   20     8    incarnation  random per process start: a new value resets sequence tracking
//   28     8    seq          per (sender, receiver) link, starts at 1, +1 per frame
//   36     n    sender       node id, [A-Za-z0-9._-], n = sender_len
//   36+n   b    body         exactly one msgpack object, b = body_len
//
// The frame size must equal 36 + sender_len + body_len exactly. A ROUTER receives the frame as
// the second part of [routing id, frame]; anything else (fewer or more parts) is rejected. Limits
// (frame_limits) bound frame and body size and the msgpack body's nesting and element counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "actors/base/result.hpp"

namespace tessera::transport::control {

inline constexpr std::uint8_t kProtocolVersion = 1;
inline constexpr std::size_t kHeaderSize = 36;
inline constexpr std::size_t kMaxNodeIdLen = 64;
/// Hard cap on any configured frame size; also the ZMQ_MAXMSGSIZE of the ROUTER (beyond it the
/// connection is dropped by libzmq to protect memory; below it an oversized frame is only rejected).
inline constexpr std::size_t kHardMaxFrameSize = 16u << 20;

/// Message types. 0..63 belong to the transport; 64.. are free for the modules above.
enum class msg_type : std::uint16_t {
  heartbeat = 1,       ///< body: {"ep": advertised endpoint}; liveness + introduction
  fault_set = 2,       ///< body: fault rule (see transport/README.md); applied to control frames
  fault_clear = 3,     ///< body: nil; clears every fault rule
  actor_envelope = 16, ///< body: opaque msgpack envelope of the actor runtime (remote actors)
  app_first = 64,      ///< first application type; every type >= app_first is passed through
};

/// True for the types a receiver accepts.
[[nodiscard]] constexpr bool is_known_type(std::uint16_t t) noexcept {
  return t == 1 || t == 2 || t == 3 || t == 16 || t >= 64;
}

/// Why a frame was rejected. Each has a counter in control_stats.
enum class reject_reason : std::uint8_t {
  none = 0,
  truncated,        ///< shorter than the header, or than the lengths it declares
  oversized,        ///< frame or body larger than the configured limits
  bad_magic,        ///< does not start with 'T' 'C'
  bad_version,      ///< protocol version we do not speak
  bad_header,       ///< reserved flags set, or sender id empty/too long/bad characters
  unknown_type,     ///< message type outside the known set
  trailing_bytes,   ///< more bytes than the header declares
  bad_body,         ///< body is not exactly one msgpack object within the limits
  bad_parts,        ///< ZeroMQ message with the wrong number of parts
  sender_mismatch,  ///< header sender differs from the connection's routing id
  count_            ///< number of reasons (array size)
};
inline constexpr std::size_t kRejectReasonCount = static_cast<std::size_t>(reject_reason::count_);

[[nodiscard]] std::string_view to_string(reject_reason r) noexcept;

/// Bounds applied by the decoder. Defaults suit control traffic (not tensors: those use bulk).
struct frame_limits {
  std::size_t max_frame_size = 1u << 20;    ///< whole frame, header included; <= kHardMaxFrameSize
  std::size_t max_body_size = (1u << 20) - kHeaderSize - kMaxNodeIdLen;
  std::uint32_t max_body_depth = 32;        ///< msgpack nesting depth
  std::uint32_t max_body_elements = 65536;  ///< array items + map pairs, summed over the body
};

/// The fixed fields of a frame.
struct frame_header {
  std::uint8_t version = kProtocolVersion;
  std::uint16_t type = 0;
  std::uint64_t epoch = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t seq = 0;
  std::string_view sender;  ///< points into the decoded bytes (or the caller's string on encode)
};

/// A decoded frame: views into the bytes passed to decode_frame (valid while they are).
struct frame_view {
  frame_header header;
  std::span<const std::byte> body;
};

/// True when `id` is a valid node id: 1..kMaxNodeIdLen bytes of [A-Za-z0-9._-].
[[nodiscard]] bool is_valid_node_id(std::string_view id) noexcept;

/// Encodes a frame. Preconditions (asserted; programmer errors): valid sender id, known type,
/// version set. Errors: oversized when the frame would exceed `limits`.
[[nodiscard]] result<std::string> encode_frame(const frame_header& header,
                                               std::span<const std::byte> body,
                                               const frame_limits& limits = {});

/// Overwrites the sequence number of an encoded frame (the send queue assigns it at enqueue).
void patch_seq(std::string& frame, std::uint64_t seq);

/// Decodes and validates one frame (header, bounds, msgpack body). On success fills `out` and
/// returns reject_reason::none; otherwise returns why and, when `detail` is given, a message for
/// the log. Never reads outside `bytes`; never allocates except for `detail` (and, for a body
/// nested deeper than 64 levels where the limits allow that, the body check's stack).
[[nodiscard]] reject_reason decode_frame(std::span<const std::byte> bytes,
                                         const frame_limits& limits, frame_view& out,
                                         std::string* detail = nullptr);

/// decode_frame as a result<frame_view> (errc::corrupt, errc::unsupported for bad_version).
[[nodiscard]] result<frame_view> parse_frame(std::span<const std::byte> bytes,
                                             const frame_limits& limits = {});

/// Checks that `body` is exactly one msgpack object within the depth/element limits (a walk by
/// the msgpack spec that builds nothing; it agrees with msgpack-c's parser, see frame_test).
[[nodiscard]] bool is_valid_msgpack_body(std::span<const std::byte> body,
                                         const frame_limits& limits) noexcept;

/// Byte-span helpers.
[[nodiscard]] inline std::span<const std::byte> as_bytes(std::string_view s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace tessera::transport::control
