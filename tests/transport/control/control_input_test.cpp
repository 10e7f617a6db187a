// Bad input from an authenticated peer: every rejection path is counted, the frame is dropped,
// and the connection and the node live on. Frames come from a raw DEALER socket holding the
// cluster's keys, so that the bytes are exactly what the test writes.
#include <gtest/gtest.h>
#include <zmq.hpp>

#include "tests/transport/control/test_support.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::transport::control {
namespace {

using test::inbox;
using test::int_body;
using test::kPing;
using test::wait_for;

class raw_member {
 public:
  raw_member(const cluster_keys& keys, const std::string& routing_id, const std::string& ep)
      : socket_(ctx_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::routing_id, routing_id);
    socket_.set(zmq::sockopt::curve_serverkey, zmq::const_buffer(keys.server.public_key.data(), 32));
    socket_.set(zmq::sockopt::curve_publickey, zmq::const_buffer(keys.client.public_key.data(), 32));
    socket_.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(keys.client.secret_key.data(), 32));
    socket_.connect(ep);
  }
  void send(std::string_view bytes) { socket_.send(zmq::buffer(bytes), zmq::send_flags::none); }
  void send_parts(const std::vector<std::string>& parts) {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      socket_.send(zmq::buffer(parts[i]),
                   i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t socket_;
};

std::string frame(std::string_view sender, std::uint64_t seq, std::int64_t value,
                  std::uint16_t type = kPing) {
  frame_header h;
  h.type = type;
  h.incarnation = 77;
  h.seq = seq;
  h.sender = sender;
  const auto body = int_body(value);
  return *encode_frame(h, as_bytes(body));
}

class control_input_test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = test::config("node", keys_);
    c.limits.max_frame_size = 4096;
    c.limits.max_body_size = 2048;
    auto r = control_node::start(c, in_.handlers());
    ASSERT_TRUE(r.has_value());
    node_ = std::move(*r);
    raw_ = std::make_unique<raw_member>(keys_, "m", node_->endpoint());
  }
  // Sends `bad`, then a good frame with `good_value`; waits for the good one. Because both go
  // down one connection in order, the bad one has been judged by then.
  void expect_rejected(std::string_view bad, reject_reason why, std::int64_t good_value) {
    const auto before = node_->stats().rejected_for(why);
    const auto delivered = in_.message_count();
    raw_->send(bad);
    raw_->send(frame("m", ++seq_, good_value));
    ASSERT_TRUE(wait_for([&] { return in_.message_count() == delivered + 1; }))
        << to_string(why);
    EXPECT_EQ(node_->stats().rejected_for(why), before + 1) << to_string(why);
    EXPECT_EQ(test::body_int(in_.messages().back().body), good_value);
  }

  cluster_keys keys_ = test::keys_from(21);
  inbox in_;
  std::unique_ptr<control_node> node_;
  std::unique_ptr<raw_member> raw_;
  std::uint64_t seq_ = 0;
};

TEST_F(control_input_test, every_kind_of_bad_frame_is_counted_and_the_connection_lives_on) {
  const std::string good = frame("m", 1000, 1);
  expect_rejected("", reject_reason::truncated, 1);
  expect_rejected(good.substr(0, 20), reject_reason::truncated, 2);
  expect_rejected(good.substr(0, good.size() - 1), reject_reason::truncated, 3);
  expect_rejected(good + "x", reject_reason::trailing_bytes, 4);
  expect_rejected(std::string(5000, 'T'), reject_reason::oversized, 5);  // > max_frame_size
  std::string bad = good;
  bad[0] = 'Z';
  expect_rejected(bad, reject_reason::bad_magic, 6);
  bad = good;
  bad[2] = 9;
  expect_rejected(bad, reject_reason::bad_version, 7);
  bad = good;
  bad[6] = 1;
  expect_rejected(bad, reject_reason::bad_header, 8);
  bad = good;
  bad[4] = 7;
  bad[5] = 0;
  expect_rejected(bad, reject_reason::unknown_type, 9);
  bad = good;
  bad.back() = '\xc1';
  expect_rejected(bad, reject_reason::bad_body, 10);
  expect_rejected(frame("someone-else", ++seq_, 0), reject_reason::sender_mismatch, 11);
  // Random garbage of many sizes.
  std::uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 50; ++i) {
    std::string junk(static_cast<std::size_t>(i * 37 % 300), '\0');
    for (auto& ch : junk) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      ch = static_cast<char>(x);
    }
    raw_->send(junk);
  }
  raw_->send(frame("m", ++seq_, 12));
  ASSERT_TRUE(wait_for([&] {
    auto m = in_.messages();
    return !m.empty() && test::body_int(m.back().body) == 12;
  }));
  EXPECT_EQ(node_->stats().rejected_total(), 11u + 50u);
}

TEST_F(control_input_test, multipart_messages_are_rejected) {
  const auto before = node_->stats().rejected_for(reject_reason::bad_parts);
  raw_->send_parts({frame("m", ++seq_, 0), frame("m", ++seq_, 0)});
  raw_->send_parts({"a", "b", "c", "d"});
  raw_->send(frame("m", ++seq_, 3));
  ASSERT_TRUE(wait_for([&] { return in_.message_count() == 1; }));
  EXPECT_EQ(node_->stats().rejected_for(reject_reason::bad_parts), before + 2);
}

TEST_F(control_input_test, duplicates_and_late_frames_are_dropped_and_gaps_counted) {
  // Sequence tracking lives in the peer's link: make "m" a known peer (its endpoint is unused).
  ASSERT_TRUE(node_->add_peer("m", "tcp://127.0.0.1:1").has_value());
  for (std::uint64_t s : {1, 2, 2, 1, 5, 4, 6}) raw_->send(frame("m", s, static_cast<std::int64_t>(s)));
  ASSERT_TRUE(wait_for([&] { return in_.message_count() == 4; }));
  std::vector<std::int64_t> got;
  for (const auto& m : in_.messages()) got.push_back(test::body_int(m.body));
  EXPECT_EQ(got, (std::vector<std::int64_t>{1, 2, 5, 6}));
  auto s = node_->stats();
  EXPECT_EQ(s.duplicates_dropped, 3u);
  EXPECT_EQ(s.frames_missing, 2u);
}

}  // namespace
}  // namespace tessera::transport::control
