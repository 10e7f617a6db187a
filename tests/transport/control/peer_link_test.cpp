// The per-peer liveness / backoff / sequence state machine, driven with explicit time.
#include "transport/control/peer_link.hpp"

#include <gtest/gtest.h>

namespace tessera::transport::control {
namespace {

link_timing timing() {
  link_timing t;
  t.heartbeat_interval_ms = 100;
  t.dead_after_ms = 1000;
  t.backoff_min_ms = 50;
  t.backoff_max_ms = 800;
  return t;
}

TEST(peer_link_test, a_peer_never_heard_from_goes_down_once) {
  peer_link l(timing(), 1, 0);
  EXPECT_EQ(l.state(), link_state::connecting);
  EXPECT_EQ(l.next_deadline_ms(), 1000u);
  auto a = l.on_tick(999);
  EXPECT_FALSE(a.emit_down);
  a = l.on_tick(1000);
  EXPECT_TRUE(a.emit_down);
  EXPECT_NE(a.reason.find("connecting"), std::string::npos) << a.reason;
  EXPECT_EQ(l.state(), link_state::down);
  // Further ticks reconnect but never report down again.
  for (std::uint64_t t = 1000; t < 20000; t += 10) EXPECT_FALSE(l.on_tick(t).emit_down);
}

TEST(peer_link_test, silence_takes_an_up_peer_down_with_a_reason_and_a_frame_brings_it_back) {
  peer_link l(timing(), 1, 0);
  EXPECT_TRUE(l.on_frame(10).emit_up);
  EXPECT_FALSE(l.on_frame(20).emit_up);  // up is reported once
  EXPECT_FALSE(l.on_tick(1019).emit_down);
  auto a = l.on_tick(1020);
  ASSERT_TRUE(a.emit_down);
  EXPECT_NE(a.reason.find("no frame for 1000 ms"), std::string::npos) << a.reason;
  auto b = l.on_frame(1500);
  EXPECT_TRUE(b.emit_up);
  EXPECT_EQ(l.state(), link_state::up);
  EXPECT_EQ(l.reconnect_attempts(), 0u);
}

TEST(peer_link_test, reconnect_backoff_doubles_is_jittered_and_bounded) {
  peer_link l(timing(), 42, 0);
  (void)l.on_tick(1000);  // down
  std::uint64_t now = 1000;
  std::uint64_t prev_reconnect = 1000;
  std::vector<std::uint64_t> gaps;
  while (gaps.size() < 10) {
    now = l.next_deadline_ms();
    auto a = l.on_tick(now);
    ASSERT_TRUE(a.reconnect);
    gaps.push_back(now - prev_reconnect);
    prev_reconnect = now;
  }
  // gap[i] is the delay chosen after attempt i: within [d/2, d] of the un-jittered backoff.
  for (std::size_t i = 0; i < gaps.size(); ++i) {
    const auto d = l.backoff_ms(static_cast<std::uint32_t>(i));
    EXPECT_GE(gaps[i], d / 2) << i;
    EXPECT_LE(gaps[i], d) << i;
  }
  EXPECT_EQ(l.backoff_ms(0), 50u);
  EXPECT_EQ(l.backoff_ms(3), 400u);
  EXPECT_EQ(l.backoff_ms(4), 800u);
  EXPECT_EQ(l.backoff_ms(1000), 800u);  // bounded, no overflow
}

TEST(peer_link_test, same_seed_same_schedule) {
  peer_link a(timing(), 7, 0);
  peer_link b(timing(), 7, 0);
  (void)a.on_tick(1000);
  (void)b.on_tick(1000);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(a.next_deadline_ms(), b.next_deadline_ms());
    (void)a.on_tick(a.next_deadline_ms());
    (void)b.on_tick(b.next_deadline_ms());
  }
}

TEST(peer_link_test, a_peer_that_stops_echoing_our_heartbeats_gets_a_fresh_connection) {
  peer_link l(timing(), 1, 0);
  (void)l.on_frame(0);
  std::uint64_t t = 0;
  // Healthy: every heartbeat of the peer echoes our latest number.
  for (int i = 0; i < 30; ++i, t += 100) {
    const auto ours = l.next_heartbeat_number();
    auto a = l.on_heartbeat(static_cast<std::uint64_t>(i + 1), ours, t);
    EXPECT_FALSE(a.reconnect) << i;
  }
  EXPECT_EQ(l.echo_for_peer(), 30u);
  // Deaf: the peer keeps sending, its echo is stuck. Not before dead_after_ms (1000) ...
  const std::uint64_t stuck = 30;
  const std::uint64_t last_move = t - 100;  // the heartbeat that carried echo 30
  int reconnects = 0;
  std::uint64_t first_at = 0;
  for (int i = 0; i < 40; ++i, t += 100) {
    (void)l.next_heartbeat_number();
    auto a = l.on_heartbeat(100 + static_cast<std::uint64_t>(i), stuck, t);
    if (a.reconnect) {
      if (reconnects++ == 0) first_at = t;
      EXPECT_FALSE(a.emit_down);  // the peer is not down: it talks to us
      EXPECT_NE(a.reason.find("not heard"), std::string::npos) << a.reason;
    }
  }
  EXPECT_GE(first_at, last_move + 1000);
  EXPECT_LE(first_at, last_move + 1200);
  // ... and then once per window, not on every heartbeat.
  EXPECT_GE(reconnects, 2);
  EXPECT_LE(reconnects, 4);
  EXPECT_EQ(l.deaf_reconnects(), static_cast<std::uint64_t>(reconnects));
  EXPECT_EQ(l.state(), link_state::up);
}

TEST(peer_link_test, a_stalled_sender_or_a_peer_without_echo_is_not_called_deaf) {
  peer_link l(timing(), 1, 0);
  (void)l.on_frame(0);
  (void)l.on_heartbeat(1, 1, 0);
  // We sent nothing for 5 s (our thread stalled): the echo cannot move, that proves nothing.
  for (std::uint64_t t = 100; t < 5000; t += 100)
    EXPECT_FALSE(l.on_heartbeat(t, 1, t).reconnect);
  // A peer whose heartbeats carry no echo (an older build) is never judged.
  peer_link m(timing(), 2, 0);
  for (std::uint64_t t = 0; t < 5000; t += 100) {
    (void)m.next_heartbeat_number();
    EXPECT_FALSE(m.on_heartbeat(t, std::nullopt, t).reconnect);
  }
}

TEST(peer_link_test, sequence_numbers_detect_duplicates_gaps_and_restarts) {
  peer_link l(timing(), 1, 0);
  std::uint64_t missing = 0;
  EXPECT_EQ(l.on_seq(5, 0, missing), seq_verdict::unsequenced);  // heartbeat first
  EXPECT_EQ(l.on_seq(5, 1, missing), seq_verdict::in_order);
  EXPECT_EQ(l.on_seq(5, 2, missing), seq_verdict::in_order);
  EXPECT_EQ(l.on_seq(5, 2, missing), seq_verdict::duplicate);
  EXPECT_EQ(l.on_seq(5, 1, missing), seq_verdict::duplicate);
  EXPECT_EQ(l.on_seq(5, 6, missing), seq_verdict::gap);
  EXPECT_EQ(missing, 3u);
  EXPECT_EQ(l.on_seq(5, 4, missing), seq_verdict::duplicate);  // late (reordered)
  EXPECT_EQ(l.on_seq(5, 0, missing), seq_verdict::unsequenced);
  EXPECT_EQ(l.on_seq(9, 0, missing), seq_verdict::restarted);  // new incarnation
  EXPECT_EQ(l.on_seq(9, 1, missing), seq_verdict::in_order);
}

}  // namespace
}  // namespace tessera::transport::control
