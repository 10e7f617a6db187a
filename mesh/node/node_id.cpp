#include "mesh/node/node_id.hpp"

#include <span>

#include "actors/base/random.hpp"

namespace tessera::mesh {

std::string node_id::to_string() const {
  return fmt::format("{:016x}{:016x}", hi, lo);
}

result<node_id> node_id::parse(std::string_view text) {
  if (text.size() != 32) {
    return make_error(errc::invalid_argument, "node id '{}': expected 32 hex digits, got {}", text,
                      text.size());
  }
  node_id id;
  for (std::size_t i = 0; i < 32; ++i) {
    char c = text[i];
    unsigned v = 0;
    if (c >= '0' && c <= '9')
      v = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      v = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v = static_cast<unsigned>(c - 'A' + 10);
    else
      return make_error(errc::invalid_argument, "node id '{}': '{}' is not a hex digit", text, c);
    std::uint64_t& half = i < 16 ? id.hi : id.lo;
    half = (half << 4) | v;
  }
  return id;
}

result<node_id> node_id::random() {
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::uint64_t words[2] = {0, 0};
    TESSERA_TRY(fill_random(std::as_writable_bytes(std::span(words))));
    node_id id{words[0], words[1]};
    if (!id.is_zero()) return id;
  }
  return make_error(errc::internal, "getrandom returned zeros four times");
}

}  // namespace tessera::mesh
