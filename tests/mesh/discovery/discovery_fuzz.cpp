// libFuzzer entry: everything discovery reads from the network goes through these decoders.
// Any input must give a value or an error — never a crash, a hang or a sanitizer report — and a
// decoded beacon must re-encode to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mesh/discovery/beacon_codec.hpp"
#include "mesh/discovery/mdns_txt.hpp"
#include "mesh/discovery/peer_hint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera::mesh;
  std::span<const std::uint8_t> bytes(data, size);
  static const beacon_key key = derive_beacon_key(std::span<const std::uint8_t>());
  auto plain = decode_beacon(bytes, {});
  if (plain) {
    auto again = encode_beacon(*plain, {});
    bool has_mac = size > 5 && (data[5] & 1);
    if (!has_mac && (!again || *again != std::vector<std::uint8_t>(data, data + size))) {
      __builtin_trap();
    }
  }
  (void)decode_beacon(bytes, key);
  std::string text(reinterpret_cast<const char*>(data), size);
  (void)parse_endpoint(text);
  std::vector<std::string> entries;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n') {
      entries.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  (void)decode_txt(entries);
  return 0;
}
