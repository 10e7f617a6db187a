#include "actors/envelope.hpp"

#include "actors/base/msgpack_bounded.hpp"

namespace tessera::actors {

std::vector<char> encode_envelope(const envelope& env) { return pack_message(env); }

result<envelope> decode_envelope(std::span<const char> bytes) {
  try {
    msgpack::object_handle handle = tessera::bounded_unpack(bytes.data(), bytes.size());
    envelope env;
    handle.get().convert(env);
    return env;
  } catch (const std::exception& e) {
    return make_error(errc::corrupt, "envelope: malformed msgpack ({} bytes): {}", bytes.size(),
                      e.what());
  }
}

}  // namespace tessera::actors
