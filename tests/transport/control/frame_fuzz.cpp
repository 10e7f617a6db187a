// libFuzzer entry: decode arbitrary bytes as a control frame. Any crash, sanitizer report, leak,
// an accepted frame that does not re-encode to the same bytes, or a body check that disagrees with
// msgpack-c's parser on the same bytes (msgpack_reference.hpp) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "tests/transport/control/msgpack_reference.hpp"
#include "transport/control/frame.hpp"

using namespace tessera::transport::control;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  frame_limits limits;
  limits.max_frame_size = 64 * 1024;
  limits.max_body_size = 60 * 1024;
  limits.max_body_depth = 16;
  limits.max_body_elements = 4096;
  frame_view view;
  auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size);
  // The whole input as a body, too: the walker must agree with the reference on every input.
  if (is_valid_msgpack_body(bytes, limits) !=
      tessera::transport::control::testing::reference_is_valid_body(bytes, limits)) {
    std::abort();
  }
  if (decode_frame(bytes, limits, view) != reject_reason::none) return 0;
  auto again = encode_frame(view.header, view.body, limits);
  if (!again.has_value() || again->size() != size || std::memcmp(again->data(), data, size) != 0) {
    std::abort();
  }
  return 0;
}
