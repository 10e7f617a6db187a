// envelope: the wire form of one actor message, versioned from day one.
//
// Local sends never build an envelope. A message for an actor on another node is packed into an
// envelope and handed to the remote_router; the transport carries the envelope's msgpack bytes and
// the receiving node calls actor_system::deliver_remote with the decoded envelope.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/actor_ref.hpp"
#include "actors/base/result.hpp"
#include "actors/message.hpp"

namespace tessera::actors {

/// The envelope format this build writes and accepts. Bump on any incompatible change.
inline constexpr std::uint16_t envelope_version = 1;

/// Bound on an envelope body: bulk data goes over transport::bulk, never through actor messages.
inline constexpr std::size_t max_envelope_body_bytes = 16u << 20;

/// What a message is for (the runtime's own kinds never leave the node).
enum class message_kind : std::uint8_t {
  message = 0,         ///< one-way message
  request = 1,         ///< expects exactly one response or error_response with request_id
  response = 2,        ///< the answer to request_id
  error_response = 3,  ///< request_id failed; body is an error_reply
  // Node-local kinds below: never in an envelope.
  timer = 16,            ///< a timer fired (request_id holds the timer id)
  request_timeout = 17,  ///< the deadline of request_id passed
  stop = 18,             ///< stop the receiver (body: exit_reason)
};

/// Which mailbox lane: control (system messages: down, exit, timers) is served first.
enum class lane : std::uint8_t { data = 0, control = 1 };

}  // namespace tessera::actors

MSGPACK_ADD_ENUM(tessera::actors::message_kind);
MSGPACK_ADD_ENUM(tessera::actors::lane);

namespace tessera::actors {

/// The body of an error_response.
struct error_reply {
  TESSERA_MESSAGE("tessera.actors.error_reply");
  std::uint16_t code = 0;
  std::string message;
  MSGPACK_DEFINE(code, message);
};

/// One message on the wire. Field order is the msgpack array order: append only, never reorder.
struct envelope {
  std::uint16_t version = envelope_version;
  actor_ref sender;    ///< may be invalid (id 0) for messages sent from outside any actor
  actor_ref receiver;  ///< must name an actor on the receiving node
  std::uint32_t type_id = 0;
  std::uint64_t request_id = 0;  ///< correlation for request / response / error_response
  message_kind kind = message_kind::message;
  lane lane_ = lane::data;
  std::vector<char> body;  ///< msgpack of the message struct named by type_id

  MSGPACK_DEFINE(version, sender, receiver, type_id, request_id, kind, lane_, body);
};

/// Packs an envelope into bytes (what the transport sends).
[[nodiscard]] std::vector<char> encode_envelope(const envelope& env);
/// Unpacks bytes into an envelope; malformed bytes give errc::corrupt, never an exception.
[[nodiscard]] result<envelope> decode_envelope(std::span<const char> bytes);

/// Packs a message struct into msgpack bytes.
template <class T>
std::vector<char> pack_message(const T& value) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, value);
  return std::vector<char>(buffer.data(), buffer.data() + buffer.size());
}

/// Unpacks msgpack bytes into a message struct; any msgpack failure becomes errc::corrupt.
template <class T>
result<T> unpack_message(std::span<const char> bytes) {
  try {
    msgpack::object_handle handle = tessera::bounded_unpack(bytes.data(), bytes.size());
    T value{};
    handle.get().convert(value);
    return value;
  } catch (const std::exception& e) {
    return make_error(errc::corrupt, "message {}: malformed msgpack body ({} bytes): {}",
                      T::type_name, bytes.size(), e.what());
  }
}

}  // namespace tessera::actors
