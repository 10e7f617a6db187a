#include "mesh/discovery/mdns_txt.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

const mdns_announcement announcement{"prod", "00112233445566778899aabbccddeeff", 7400, 1};

std::vector<std::string> without(const std::string& prefix) {
  std::vector<std::string> out;
  for (auto& e : encode_txt(announcement)) {
    if (e.rfind(prefix, 0) != 0) out.push_back(e);
  }
  return out;
}

TEST(mdns_txt, missing_or_bad_required_keys_are_corrupt) {
  for (const char* key : {"txtvers=", "cluster=", "node=", "ctl=", "proto="}) {
    auto r = decode_txt(without(key));
    ASSERT_FALSE(r) << key;
    EXPECT_EQ(r.error().code, errc::corrupt);
  }
  auto with = [](std::string entry) {
    auto v = encode_txt(announcement);
    v.insert(v.begin(), std::move(entry));  // first occurrence wins (RFC 6763 6.4)
    return decode_txt(v);
  };
  EXPECT_FALSE(with("txtvers=2"));
  EXPECT_FALSE(with("cluster=a b"));
  EXPECT_FALSE(with("node=ABC"));
  EXPECT_FALSE(with("ctl=0"));
  EXPECT_FALSE(with("ctl=70000"));
  EXPECT_FALSE(with("proto=x"));
  EXPECT_FALSE(with(std::string(256, 'x')));
  EXPECT_FALSE(decode_txt(std::vector<std::string>(33, "x=y")));
}

TEST(mdns_txt, round_trips_and_ignores_unknown_keys) {
  auto v = encode_txt(announcement);
  v.push_back("future=thing");
  v.push_back("flag-without-value");
  auto r = decode_txt(v);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(r->cluster_id, "prod");
  EXPECT_EQ(r->node_id, announcement.node_id);
  EXPECT_EQ(r->control_port, 7400);
  EXPECT_EQ(r->protocol_version, 1u);
}

}  // namespace
}  // namespace tessera::mesh
