// The control frame codec: round trips and every rejection path.
#include "transport/control/frame.hpp"

#include <gtest/gtest.h>

#include <random>

#include <msgpack.hpp>

#include "tests/transport/control/msgpack_reference.hpp"

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

// A random msgpack object of every type the format has, nested up to `depth`.
void pack_random(msgpack::packer<msgpack::sbuffer>& pk, std::mt19937_64& rng, int depth) {
  const auto pick = rng() % (depth > 0 ? 16 : 13);
  const auto small = static_cast<std::uint32_t>(rng() % 4);
  std::string bytes(rng() % 3 == 0 ? 300 : rng() % 40, 'b');
  switch (pick) {
    case 0: pk.pack_nil(); break;
    case 1: pk.pack(rng() % 2 == 0); break;
    case 2: pk.pack(static_cast<std::int64_t>(rng()) >> (rng() % 64)); break;
    case 3: pk.pack(static_cast<std::uint64_t>(rng()) >> (rng() % 64)); break;
    case 4: pk.pack(1.5f); break;
    case 5: pk.pack(2.25); break;
    case 6: pk.pack(bytes); break;
    case 7: pk.pack_bin(static_cast<std::uint32_t>(bytes.size())); pk.pack_bin_body(bytes.data(), static_cast<std::uint32_t>(bytes.size())); break;
    case 8: pk.pack_ext(static_cast<std::uint32_t>(bytes.size()), 7); pk.pack_ext_body(bytes.data(), static_cast<std::uint32_t>(bytes.size())); break;
    case 9: {  // fixext 1..16
      const std::uint32_t n = 1u << (rng() % 5);
      const std::string e(n, 'e');
      pk.pack_ext(n, -3);
      pk.pack_ext_body(e.data(), n);
      break;
    }
    case 10: pk.pack(std::string(70000, 's')); break;
    case 11: pk.pack(static_cast<std::int8_t>(-5)); break;
    case 12: pk.pack(static_cast<std::uint16_t>(60000)); break;
    case 13:
      pk.pack_array(small);
      for (std::uint32_t i = 0; i < small; ++i) pack_random(pk, rng, depth - 1);
      break;
    case 14:
      pk.pack_map(small);
      for (std::uint32_t i = 0; i < 2 * small; ++i) pack_random(pk, rng, depth - 1);
      break;
    default: {
      const std::uint32_t n = 16 + static_cast<std::uint32_t>(rng() % 8);  // array16 / map16
      pk.pack_array(n);
      for (std::uint32_t i = 0; i < n; ++i) pk.pack(i);
    }
  }
}

TEST(frame_test, body_check_agrees_with_msgpack_c_on_generated_and_damaged_bodies) {
  // The body check is hand-written (frame.cpp); msgpack-c's parser with a counting visitor is
  // the reference. Valid bodies, then each cut short, extended and with bytes flipped, under
  // tight and default limits.
  std::mt19937_64 rng(20261128);
  frame_limits tight;
  tight.max_body_depth = 3;
  tight.max_body_elements = 40;
  std::size_t accepted = 0;
  std::size_t refused = 0;
  auto check = [&](const std::string& body) {
    const auto bytes = as_bytes(body);
    for (const frame_limits& l : {frame_limits{}, tight}) {
      const bool ours = is_valid_msgpack_body(bytes, l);
      ASSERT_EQ(ours, testing::reference_is_valid_body(bytes, l))
          << "body of " << body.size() << " bytes, first byte 0x" << std::hex
          << (body.empty() ? 0 : static_cast<int>(static_cast<unsigned char>(body[0])));
      (ours ? accepted : refused) += 1;
    }
  };
  for (int i = 0; i < 3000; ++i) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pack_random(pk, rng, static_cast<int>(rng() % 6));
    const std::string body(buf.data(), buf.size());
    check(body);
    check(body.substr(0, rng() % body.size()));
    check(body + std::string(1, static_cast<char>(rng())));
    std::string flipped = body;
    for (int k = 0; k < 3; ++k) flipped[rng() % flipped.size()] = static_cast<char>(rng());
    check(flipped);
    std::string noise(1 + rng() % 24, '\0');
    for (auto& c : noise) c = static_cast<char>(rng());
    check(noise);
  }
  // Deeper than the walker keeps inline (64 levels), within a limit that allows it.
  frame_limits deep_ok;
  deep_ok.max_body_depth = 200;
  const std::string deep = std::string(150, '\x91') + "\xc0";
  EXPECT_TRUE(is_valid_msgpack_body(as_bytes(deep), deep_ok));
  EXPECT_TRUE(testing::reference_is_valid_body(as_bytes(deep), deep_ok));
  EXPECT_FALSE(is_valid_msgpack_body(as_bytes(deep), frame_limits{}));
  // Both outcomes were exercised often.
  EXPECT_GT(accepted, 3000u);
  EXPECT_GT(refused, 3000u);
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
