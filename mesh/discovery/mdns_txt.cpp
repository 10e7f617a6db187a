#include "mesh/discovery/mdns_txt.hpp"

#include <charconv>
#include <map>

#include "mesh/discovery/peer_hint.hpp"

namespace tessera::mesh {

std::vector<std::string> encode_txt(const mdns_announcement& a) {
  return {"txtvers=1", "cluster=" + a.cluster_id, "node=" + a.node_id,
          fmt::format("ctl={}", a.control_port), fmt::format("proto={}", a.protocol_version)};
}

namespace {
template <class T>
bool parse_uint(const std::string& text, T& out, std::uint64_t min, std::uint64_t max) {
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || ptr != text.data() + text.size() || v < min || v > max) {
    return false;
  }
  out = static_cast<T>(v);
  return true;
}
}  // namespace

result<mdns_announcement> decode_txt(const std::vector<std::string>& entries) {
  if (entries.size() > max_txt_entries) {
    return make_error(errc::corrupt, "TXT record has {} entries (at most {})", entries.size(),
                      max_txt_entries);
  }
  std::map<std::string, std::string> kv;
  for (const auto& e : entries) {
    if (e.size() > max_txt_entry_bytes) return make_error(errc::corrupt, "TXT entry too long");
    auto eq = e.find('=');
    std::string key = e.substr(0, eq);
    // RFC 6763 6.4: the first occurrence of a key wins.
    kv.emplace(key, eq == std::string::npos ? std::string() : e.substr(eq + 1));
  }
  auto need = [&](const char* key) -> const std::string* {
    auto it = kv.find(key);
    return it == kv.end() ? nullptr : &it->second;
  };
  const auto* vers = need("txtvers");
  if (!vers || *vers != "1") return make_error(errc::corrupt, "TXT: txtvers missing or not 1");
  mdns_announcement a;
  const auto* cluster = need("cluster");
  if (!cluster || !is_cluster_id_text(*cluster)) {
    return make_error(errc::corrupt, "TXT: cluster missing or malformed");
  }
  a.cluster_id = *cluster;
  const auto* node = need("node");
  if (!node || !is_node_id_text(*node)) {
    return make_error(errc::corrupt, "TXT: node missing or not 32 hex digits");
  }
  a.node_id = *node;
  const auto* ctl = need("ctl");
  if (!ctl || !parse_uint(*ctl, a.control_port, 1, 65535)) {
    return make_error(errc::corrupt, "TXT: ctl missing or not a port");
  }
  const auto* proto = need("proto");
  if (!proto || !parse_uint(*proto, a.protocol_version, 0, UINT32_MAX)) {
    return make_error(errc::corrupt, "TXT: proto missing or not a number");
  }
  return a;
}

}  // namespace tessera::mesh
