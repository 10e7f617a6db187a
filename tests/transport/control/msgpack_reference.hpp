// The reference for is_valid_msgpack_body(): msgpack-c's own parser walking the body with a
// visitor that counts nesting and elements as frame_limits define them. The frame codec's
// hand-written walker must say yes and no exactly where this does (frame_test, frame_fuzz).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>

#include <msgpack.hpp>

#include "transport/control/frame.hpp"

namespace tessera::transport::control::testing {

class bounded_reference_visitor : public msgpack::null_visitor {
 public:
  explicit bounded_reference_visitor(const frame_limits& limits) : limits_(limits) {}
  bool start_array(std::uint32_t n) { return enter(n); }
  bool end_array() { return leave(); }
  bool start_map(std::uint32_t n) { return enter(n); }
  bool end_map() { return leave(); }

 private:
  bool enter(std::uint32_t n) {
    if (++depth_ > limits_.max_body_depth) return false;
    elements_ += n;
    return elements_ <= limits_.max_body_elements;
  }
  bool leave() {
    --depth_;
    return true;
  }
  const frame_limits& limits_;
  std::uint32_t depth_ = 0;
  std::uint64_t elements_ = 0;
};

inline bool reference_is_valid_body(std::span<const std::byte> body, const frame_limits& limits) {
  if (body.empty()) return false;
  try {
    bounded_reference_visitor v(limits);
    std::size_t off = 0;
    auto ret = msgpack::detail::parse_imp(reinterpret_cast<const char*>(body.data()), body.size(),
                                          off, v);
    return ret == msgpack::PARSE_SUCCESS && off == body.size();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace tessera::transport::control::testing
