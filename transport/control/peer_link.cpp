#include "transport/control/peer_link.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "actors/base/assert.hpp"

namespace tessera::transport::control {

peer_link::peer_link(const link_timing& timing, std::uint64_t seed, std::uint64_t now_ms)
    : timing_(timing), rng_(seed), last_heard_ms_(now_ms), echo_moved_ms_(now_ms) {
  TESSERA_ASSERT(timing.heartbeat_interval_ms > 0 &&
                     timing.dead_after_ms > timing.heartbeat_interval_ms,
                 "link timing: need dead_after_ms ({}) > heartbeat_interval_ms ({}) > 0",
                 timing.dead_after_ms, timing.heartbeat_interval_ms);
  TESSERA_ASSERT(timing.backoff_min_ms > 0 && timing.backoff_min_ms <= timing.backoff_max_ms,
                 "link timing: need 0 < backoff_min_ms ({}) <= backoff_max_ms ({})",
                 timing.backoff_min_ms, timing.backoff_max_ms);
}

std::uint64_t peer_link::backoff_ms(std::uint32_t attempt) const {
  std::uint64_t d = timing_.backoff_min_ms;
  for (std::uint32_t i = 0; i < attempt && d < timing_.backoff_max_ms; ++i) d *= 2;
  return std::min<std::uint64_t>(d, timing_.backoff_max_ms);
}

std::uint64_t peer_link::jittered(std::uint64_t d) {
  // splitmix64: tiny, seeded, good enough to de-synchronise reconnect storms.
  rng_ += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = rng_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const std::uint64_t half = d / 2;
  return half + (half == 0 ? 0 : z % (d - half + 1));
}

void peer_link::go_down(std::uint64_t now_ms) {
  state_ = link_state::down;
  reconnect_at_ms_ = now_ms + jittered(backoff_ms(attempts_));
}

link_actions peer_link::on_frame(std::uint64_t now_ms) {
  link_actions a;
  last_heard_ms_ = std::max(last_heard_ms_, now_ms);
  if (state_ != link_state::up) {
    state_ = link_state::up;
    attempts_ = 0;
    a.emit_up = true;
  }
  return a;
}

link_actions peer_link::on_tick(std::uint64_t now_ms) {
  link_actions a;
  switch (state_) {
    case link_state::connecting:
    case link_state::up:
      if (now_ms >= last_heard_ms_ + timing_.dead_after_ms) {
        a.emit_down = true;
        a.reason = state_ == link_state::up
                       ? fmt::format("no frame for {} ms (heartbeat every {} ms)",
                                     now_ms - last_heard_ms_, timing_.heartbeat_interval_ms)
                       : fmt::format("no frame within {} ms of connecting", now_ms - last_heard_ms_);
        go_down(now_ms);
      }
      break;
    case link_state::down:
      if (now_ms >= reconnect_at_ms_) {
        a.reconnect = true;
        ++attempts_;
        reconnect_at_ms_ = now_ms + jittered(backoff_ms(attempts_));
      }
      break;
  }
  return a;
}

std::uint64_t peer_link::next_deadline_ms() const {
  return state_ == link_state::down ? reconnect_at_ms_ : last_heard_ms_ + timing_.dead_after_ms;
}

link_actions peer_link::on_heartbeat(std::uint64_t number, std::optional<std::uint64_t> echo,
                                      std::uint64_t now_ms) {
  link_actions a;
  heard_number_ = number;
  if (!echo) return a;  // a peer that does not echo: nothing to judge
  if (*echo != last_echo_) {
    // Any change counts (a restarted peer echoes from 0 again).
    last_echo_ = *echo;
    echo_moved_ms_ = now_ms;
    sent_at_echo_move_ = heartbeats_sent_;
    heard_since_echo_move_ = 0;
    return a;
  }
  ++heard_since_echo_move_;
  if (heard_since_echo_move_ >= kDeafHeartbeats &&
      heartbeats_sent_ >= sent_at_echo_move_ + kDeafHeartbeats &&
      now_ms >= echo_moved_ms_ + timing_.dead_after_ms) {
    a.reconnect = true;
    a.reason = fmt::format("the peer has not heard our last {} heartbeats ({} ms)",
                           heartbeats_sent_ - sent_at_echo_move_, now_ms - echo_moved_ms_);
    ++deaf_reconnects_;
    // A full window for the fresh connection before judging it.
    echo_moved_ms_ = now_ms;
    sent_at_echo_move_ = heartbeats_sent_;
    heard_since_echo_move_ = 0;
  }
  return a;
}

seq_verdict peer_link::on_seq(std::uint64_t incarnation, std::uint64_t seq,
                              std::uint64_t& missing) {
  missing = 0;
  if (!have_incarnation_ || incarnation != incarnation_) {
    // Heartbeats (seq 0) carry the incarnation too, so a restart is noticed on the first frame.
    const bool restarted = have_incarnation_;
    have_incarnation_ = true;
    incarnation_ = incarnation;
    last_seq_ = seq;
    if (restarted) return seq_verdict::restarted;
    return seq == 0 ? seq_verdict::unsequenced : seq_verdict::in_order;
  }
  if (seq == 0) return seq_verdict::unsequenced;
  if (seq <= last_seq_) return seq_verdict::duplicate;
  const std::uint64_t expected = last_seq_ + 1;
  last_seq_ = seq;
  if (seq == expected) return seq_verdict::in_order;
  missing = seq - expected;
  return seq_verdict::gap;
}

}  // namespace tessera::transport::control
