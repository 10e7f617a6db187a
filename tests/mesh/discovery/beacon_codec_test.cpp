#include "mesh/discovery/beacon_codec.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

beacon sample() {
  return {"00112233445566778899aabbccddeeff", "prod", "", 7400, 3};
}

beacon_key key_of(const char* secret) {
  std::string s(secret);
  return derive_beacon_key({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
}

TEST(beacon_codec, encode_refuses_fields_outside_their_bounds) {
  auto b = sample();
  b.node_id = "xyz";
  EXPECT_EQ(encode_beacon(b, {}).error().code, errc::invalid_argument);
  b = sample();
  b.cluster_id = std::string(65, 'c');
  EXPECT_FALSE(encode_beacon(b, {}));
  b = sample();
  b.host = std::string(254, 'h');
  EXPECT_FALSE(encode_beacon(b, {}));
  b = sample();
  b.control_port = 0;
  EXPECT_FALSE(encode_beacon(b, {}));
}

TEST(beacon_codec, every_malformed_shape_is_corrupt_never_a_crash) {
  auto good = *encode_beacon(sample(), {});
  auto expect_code = [](std::vector<std::uint8_t> d, errc code, const char* what) {
    auto r = decode_beacon(d, {});
    ASSERT_FALSE(r) << what;
    EXPECT_EQ(r.error().code, code) << what << ": " << r.error().message;
  };
  expect_code({}, errc::corrupt, "empty");
  expect_code(std::vector<std::uint8_t>(good.begin(), good.begin() + 20), errc::corrupt, "short");
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(decode_beacon(std::span(good.data(), cut), {})) << "truncated at " << cut;
  }
  auto d = good;
  d[0] = 'X';
  expect_code(d, errc::corrupt, "magic");
  d = good;
  d[4] = 2;
  expect_code(d, errc::unsupported, "version");
  d = good;
  d[5] = 0x80;
  expect_code(d, errc::corrupt, "unknown flags");
  d = good;
  d[6] = d[7] = 0;
  expect_code(d, errc::corrupt, "port 0");
  d = good;
  std::fill(d.begin() + 8, d.begin() + 24, 0);
  expect_code(d, errc::corrupt, "zero node id");
  d = good;
  d[28] = 0;
  expect_code(d, errc::corrupt, "cluster length 0");
  d = good;
  d[28] = 200;
  expect_code(d, errc::corrupt, "cluster length past end");
  d = good;
  d[29] = ' ';
  expect_code(d, errc::corrupt, "cluster with a space");
  d = good;
  d.push_back(0);
  expect_code(d, errc::corrupt, "trailing byte");
  d = good;
  d.back() = 9;  // host_len 9 with no host bytes
  expect_code(d, errc::corrupt, "host past end");
  d.resize(max_beacon_bytes + 1, 0);
  expect_code(d, errc::corrupt, "oversized");
}

TEST(beacon_codec, a_host_with_bad_characters_is_corrupt) {
  auto b = sample();
  b.host = "10.0.0.1";
  auto d = *encode_beacon(b, {});
  d[d.size() - 2] = '/';
  EXPECT_EQ(decode_beacon(d, {}).error().code, errc::corrupt);
}

TEST(beacon_codec, with_a_key_a_missing_or_wrong_mac_is_unauthorized) {
  auto key = key_of("cluster secret");
  auto other = key_of("another secret");
  auto plain = *encode_beacon(sample(), {});
  EXPECT_EQ(decode_beacon(plain, key).error().code, errc::unauthorized);
  auto signed_other = *encode_beacon(sample(), other);
  EXPECT_EQ(decode_beacon(signed_other, key).error().code, errc::unauthorized);
  auto signed_ok = *encode_beacon(sample(), key);
  for (std::size_t i = 0; i < signed_ok.size(); ++i) {
    auto d = signed_ok;
    d[i] ^= 0x01;
    EXPECT_FALSE(decode_beacon(d, key)) << "flipped byte " << i;
  }
}

TEST(beacon_codec, round_trips_with_and_without_a_key) {
  auto key = key_of("cluster secret");
  auto b = sample();
  b.host = "node-a.lan";
  for (auto k : {std::optional<beacon_key>{}, std::optional<beacon_key>{key}}) {
    auto d = encode_beacon(b, k);
    ASSERT_TRUE(d);
    EXPECT_LE(d->size(), max_beacon_bytes);
    auto back = decode_beacon(*d, k);
    ASSERT_TRUE(back) << back.error().describe();
    EXPECT_EQ(back->node_id, b.node_id);
    EXPECT_EQ(back->cluster_id, b.cluster_id);
    EXPECT_EQ(back->host, b.host);
    EXPECT_EQ(back->control_port, 7400);
    EXPECT_EQ(back->protocol_version, 3u);
  }
  // A receiver without a key still reads a signed beacon (it just cannot check it).
  EXPECT_TRUE(decode_beacon(*encode_beacon(b, key), {}));
  // The largest legal beacon fits the bound.
  b.cluster_id = std::string(64, 'c');
  b.host = std::string(253, 'h');
  auto big = encode_beacon(b, key);
  ASSERT_TRUE(big);
  EXPECT_LE(big->size(), max_beacon_bytes);
}

TEST(beacon_codec, keys_derived_from_different_secrets_differ) {
  EXPECT_NE(key_of("a"), key_of("b"));
  EXPECT_EQ(key_of("a"), key_of("a"));
  EXPECT_NE(derive_beacon_key({}), key_of("a"));  // an empty secret is defined, not UB
}

}  // namespace
}  // namespace tessera::mesh
