// The control frame codec: round trips and every rejection path.
#include "transport/control/frame.hpp"

#include <gtest/gtest.h>

#include <msgpack.hpp>

namespace tessera::transport::control {
namespace {

std::string pack_map_body() {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(2);
  pk.pack(std::string_view("k"));
  pk.pack(42);
  pk.pack(std::string_view("list"));
  pk.pack_array(3);
  pk.pack(1);
  pk.pack(std::string_view("two"));
  pk.pack_nil();
  return {buf.data(), buf.size()};
}

frame_header header(std::uint16_t type = 64) {
  frame_header h;
  h.type = type;
  h.epoch = 7;
  h.incarnation = 0x1122334455667788ull;
  h.seq = 99;
  h.sender = "node-a.1";
  return h;
}

std::string encode(const frame_header& h, std::string_view body) {
  auto r = encode_frame(h, as_bytes(body));
  EXPECT_TRUE(r.has_value());
  return r.has_value() ? *r : std::string();
}

reject_reason decode(std::string_view bytes, const frame_limits& limits = {}) {
  frame_view v;
  std::string detail;
  auto why = decode_frame(as_bytes(bytes), limits, v, &detail);
  if (why != reject_reason::none) {
    EXPECT_FALSE(detail.empty()) << to_string(why);
  }
  return why;
}

TEST(frame_test, truncated_frames_are_rejected_at_every_length) {
  const std::string f = encode(header(), pack_map_body());
  for (std::size_t n = 0; n < f.size(); ++n) {
    auto why = decode(std::string_view(f).substr(0, n));
    // A prefix either lacks the header or the bytes the header declares; never accepted.
    EXPECT_TRUE(why == reject_reason::truncated) << "length " << n << ": " << to_string(why);
  }
}

TEST(frame_test, trailing_bytes_are_rejected) {
  std::string f = encode(header(), pack_map_body());
  f.push_back('\0');
  EXPECT_EQ(decode(f), reject_reason::trailing_bytes);
}

TEST(frame_test, bad_magic_and_wrong_version_are_rejected) {
  std::string f = encode(header(), pack_map_body());
  std::string bad = f;
  bad[0] = 'X';
  EXPECT_EQ(decode(bad), reject_reason::bad_magic);
  bad = f;
  bad[2] = 2;
  EXPECT_EQ(decode(bad), reject_reason::bad_version);
  auto r = parse_frame(as_bytes(bad));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::unsupported);
  EXPECT_NE(r.error().message.find("version 2"), std::string::npos) << r.error().message;
}

TEST(frame_test, oversized_frames_and_bodies_are_rejected) {
  frame_limits small;
  small.max_frame_size = 128;
  small.max_body_size = 64;
  std::string big_body;
  {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack(std::string(200, 'x'));
    big_body.assign(buf.data(), buf.size());
  }
  const std::string f = encode(header(), big_body);
  EXPECT_EQ(decode(f, small), reject_reason::oversized);
  // Body over its limit while the frame is within its own.
  small.max_frame_size = 4096;
  EXPECT_EQ(decode(f, small), reject_reason::oversized);
  // The encoder refuses to build what the decoder would refuse.
  auto enc = encode_frame(header(), as_bytes(big_body), small);
  ASSERT_FALSE(enc.has_value());
  EXPECT_EQ(enc.error().code, errc::overloaded);
}

TEST(frame_test, header_fields_are_validated) {
  const std::string f = encode(header(), pack_map_body());
  std::string bad = f;
  bad[6] = 1;  // reserved flags
  EXPECT_EQ(decode(bad), reject_reason::bad_header);
  bad = f;
  bad[3] = 0;  // empty sender
  EXPECT_EQ(decode(bad), reject_reason::bad_header);
  bad = f;
  bad[3] = static_cast<char>(kMaxNodeIdLen + 1);
  EXPECT_EQ(decode(bad), reject_reason::bad_header);
  bad = f;
  bad[kHeaderSize] = ' ';  // sender character outside the alphabet
  EXPECT_EQ(decode(bad), reject_reason::bad_header);
  bad = f;
  bad[4] = 5;  // type 5: inside the transport range, unassigned
  bad[5] = 0;
  EXPECT_EQ(decode(bad), reject_reason::unknown_type);
}

TEST(frame_test, bodies_that_are_not_one_bounded_msgpack_object_are_rejected) {
  // Two objects where one is expected.
  std::string two = pack_map_body() + pack_map_body();
  EXPECT_EQ(decode(encode(header(), two)), reject_reason::bad_body);
  // A msgpack header announcing more bytes than present (str8 of length 10, 2 bytes given).
  EXPECT_EQ(decode(encode(header(), std::string("\xd9\x0a" "ab", 4))), reject_reason::bad_body);
  // 0xc1 is never used in msgpack.
  EXPECT_EQ(decode(encode(header(), std::string("\xc1", 1))), reject_reason::bad_body);
  // An array header announcing 4 billion elements in 5 bytes: refused before any allocation.
  EXPECT_EQ(decode(encode(header(), std::string("\xdd\xff\xff\xff\xff", 5))),
            reject_reason::bad_body);
  // Nesting deeper than the limit.
  frame_limits limits;
  limits.max_body_depth = 4;
  std::string deep(6, '\x91');  // fixarray of 1, six levels
  deep.push_back('\xc0');
  EXPECT_EQ(decode(encode(header(), deep), limits), reject_reason::bad_body);
  deep = std::string(4, '\x91') + "\xc0";
  EXPECT_EQ(decode(encode(header(), deep), limits), reject_reason::none);
  // Empty body.
  EXPECT_EQ(decode(encode(header(), "")), reject_reason::bad_body);
}

TEST(frame_test, round_trip_keeps_every_field) {
  const std::string body = pack_map_body();
  for (std::uint16_t type : {1, 2, 3, 16, 64, 65535}) {
    auto h = header(type);
    const std::string f = encode(h, body);
    auto r = parse_frame(as_bytes(f));
    ASSERT_TRUE(r.has_value()) << r.error().describe();
    EXPECT_EQ(r->header.version, kProtocolVersion);
    EXPECT_EQ(r->header.type, type);
    EXPECT_EQ(r->header.epoch, 7u);
    EXPECT_EQ(r->header.incarnation, 0x1122334455667788ull);
    EXPECT_EQ(r->header.seq, 99u);
    EXPECT_EQ(r->header.sender, "node-a.1");
    EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(r->body.data()), r->body.size()),
              body);
  }
}

TEST(frame_test, patch_seq_changes_only_the_sequence_number) {
  std::string f = encode(header(), pack_map_body());
  patch_seq(f, 0xfedcba9876543210ull);
  auto r = parse_frame(as_bytes(f));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->header.seq, 0xfedcba9876543210ull);
  EXPECT_EQ(r->header.epoch, 7u);
  EXPECT_EQ(r->header.sender, "node-a.1");
}

TEST(frame_test, node_id_alphabet_and_length) {
  EXPECT_TRUE(is_valid_node_id("a"));
  EXPECT_TRUE(is_valid_node_id("host-1.rack_2"));
  EXPECT_TRUE(is_valid_node_id(std::string(kMaxNodeIdLen, 'x')));
  EXPECT_FALSE(is_valid_node_id(""));
  EXPECT_FALSE(is_valid_node_id(std::string(kMaxNodeIdLen + 1, 'x')));
  EXPECT_FALSE(is_valid_node_id("a b"));
  EXPECT_FALSE(is_valid_node_id(std::string("a\0b", 3)));
}

}  // namespace
}  // namespace tessera::transport::control
