#include "mesh/discovery/beacon_codec.hpp"

#include <sodium.h>

#include <cstring>

#include "mesh/discovery/peer_hint.hpp"

namespace tessera::mesh {
namespace {

constexpr std::uint8_t magic[4] = {'T', 'S', 'R', 'B'};
constexpr std::size_t fixed_bytes = 28;
constexpr std::size_t mac_bytes = crypto_auth_hmacsha256_BYTES;
constexpr std::uint8_t flag_mac = 0x01;

void hmac(const beacon_key& key, std::span<const std::uint8_t> data, std::uint8_t* out) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  crypto_auth_hmacsha256_update(&st, data.data(), data.size());
  crypto_auth_hmacsha256_final(&st, out);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

beacon_key derive_beacon_key(std::span<const std::uint8_t> cluster_secret) {
  static constexpr char label[] = "tessera beacon key v1";
  beacon_key key{};
  crypto_auth_hmacsha256_state st;
  // libsodium's key argument is declared nonnull even when the length is 0.
  static constexpr std::uint8_t no_secret = 0;
  crypto_auth_hmacsha256_init(&st, cluster_secret.empty() ? &no_secret : cluster_secret.data(),
                              cluster_secret.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(label),
                                sizeof(label) - 1);
  crypto_auth_hmacsha256_final(&st, key.data());
  return key;
}

result<std::vector<std::uint8_t>> encode_beacon(const beacon& b,
                                                const std::optional<beacon_key>& key) {
  if (!is_node_id_text(b.node_id)) {
    return make_error(errc::invalid_argument, "beacon: node id '{}' is not 32 hex digits",
                      b.node_id);
  }
  if (!is_cluster_id_text(b.cluster_id)) {
    return make_error(errc::invalid_argument, "beacon: bad cluster id '{}'", b.cluster_id);
  }
  if (b.host.size() > max_host_bytes) {
    return make_error(errc::invalid_argument, "beacon: host longer than {} bytes", max_host_bytes);
  }
  if (b.control_port == 0) return make_error(errc::invalid_argument, "beacon: control port 0");
  std::vector<std::uint8_t> out(magic, magic + 4);
  out.push_back(beacon_version);
  out.push_back(key ? flag_mac : 0);
  out.push_back(static_cast<std::uint8_t>(b.control_port >> 8));
  out.push_back(static_cast<std::uint8_t>(b.control_port));
  for (std::size_t i = 0; i < 32; i += 2) {
    out.push_back(
        static_cast<std::uint8_t>(hex_value(b.node_id[i]) << 4 | hex_value(b.node_id[i + 1])));
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<std::uint8_t>(b.protocol_version >> shift));
  }
  out.push_back(static_cast<std::uint8_t>(b.cluster_id.size()));
  out.insert(out.end(), b.cluster_id.begin(), b.cluster_id.end());
  out.push_back(static_cast<std::uint8_t>(b.host.size()));
  out.insert(out.end(), b.host.begin(), b.host.end());
  if (key) {
    std::size_t n = out.size();
    out.resize(n + mac_bytes);
    hmac(*key, std::span(out.data(), n), out.data() + n);
  }
  TESSERA_ASSERT(out.size() <= max_beacon_bytes, "beacon of {} bytes", out.size());
  return out;
}

result<beacon> decode_beacon(std::span<const std::uint8_t> d,
                             const std::optional<beacon_key>& key) {
  auto bad = [&](std::string_view why) {
    return make_error(errc::corrupt, "beacon of {} bytes: {}", d.size(), why);
  };
  if (d.size() > max_beacon_bytes) return bad("larger than the 512-byte bound");
  if (d.size() < fixed_bytes + 2) return bad("shorter than the fixed header");
  if (std::memcmp(d.data(), magic, 4) != 0) return bad("bad magic");
  if (d[4] != beacon_version) {
    return make_error(errc::unsupported, "beacon version {} (this build speaks {})", d[4],
                      beacon_version);
  }
  std::uint8_t flags = d[5];
  if (flags & ~flag_mac) return bad("unknown flag bits");
  beacon b;
  b.control_port = static_cast<std::uint16_t>(d[6] << 8 | d[7]);
  if (b.control_port == 0) return bad("control port 0");
  static constexpr char hex[] = "0123456789abcdef";
  bool zero = true;
  for (std::size_t i = 8; i < 24; ++i) {
    b.node_id += hex[d[i] >> 4];
    b.node_id += hex[d[i] & 0xf];
    zero = zero && d[i] == 0;
  }
  if (zero) return bad("node id is zero");
  b.protocol_version = static_cast<std::uint32_t>(d[24]) << 24 |
                       static_cast<std::uint32_t>(d[25]) << 16 |
                       static_cast<std::uint32_t>(d[26]) << 8 | d[27];
  std::size_t at = fixed_bytes;
  std::size_t cluster_len = d[at++];
  if (cluster_len == 0 || cluster_len > max_cluster_id_bytes || at + cluster_len + 1 > d.size()) {
    return bad("cluster id length out of bounds");
  }
  b.cluster_id.assign(reinterpret_cast<const char*>(d.data() + at), cluster_len);
  at += cluster_len;
  if (!is_cluster_id_text(b.cluster_id)) return bad("cluster id has bad characters");
  std::size_t host_len = d[at++];
  if (at + host_len > d.size()) return bad("host length past the end");
  b.host.assign(reinterpret_cast<const char*>(d.data() + at), host_len);
  at += host_len;
  if (!b.host.empty()) {
    auto ep = parse_endpoint(b.host + ":1");
    if (!ep) return bad("host has bad characters");
  }
  bool has_mac = (flags & flag_mac) != 0;
  if (at + (has_mac ? mac_bytes : 0) != d.size()) return bad("length does not match contents");
  if (key) {
    if (!has_mac) {
      return make_error(errc::unauthorized, "beacon from node {} carries no MAC", b.node_id);
    }
    std::uint8_t expect[mac_bytes];
    hmac(*key, d.subspan(0, at), expect);
    if (crypto_verify_32(expect, d.data() + at) != 0) {
      return make_error(errc::unauthorized, "beacon from node {}: MAC does not verify", b.node_id);
    }
  }
  return b;
}

}  // namespace tessera::mesh
