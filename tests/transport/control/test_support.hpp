// Helpers for the control-plane tests: a thread-safe inbox fed by node callbacks and a bounded
// wait. Waits are generous (the suite runs on a loaded 2-core machine under sanitizers) and never
// assert on timing: they only bound how long a broken build takes to fail.
#pragma once

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <msgpack.hpp>

#include "transport/control/control_node.hpp"

namespace tessera::transport::control::test {

inline constexpr auto kWait = std::chrono::seconds(30);
/// The message type the node tests send to each other.
inline constexpr std::uint16_t kPing = 64;

/// Polls `pred` until it holds or `limit` passes; returns the last value.
inline bool wait_for(const std::function<bool()>& pred,
                     std::chrono::milliseconds limit = kWait) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// Collects what a node delivers.
class inbox {
 public:
  node_handlers handlers() {
    return node_handlers{
        [this](inbound_message&& m) {
          std::lock_guard lock(mu_);
          messages_.push_back(std::move(m));
        },
        [this](const peer_event& e) {
          std::lock_guard lock(mu_);
          events_.push_back(e);
        }};
  }
  std::vector<inbound_message> messages() const {
    std::lock_guard lock(mu_);
    return messages_;
  }
  std::size_t message_count() const {
    std::lock_guard lock(mu_);
    return messages_.size();
  }
  std::vector<peer_event> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::size_t count_events(peer_event_kind kind, const std::string& peer) const {
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (const auto& e : events_) n += e.kind == kind && e.peer == peer;
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::vector<inbound_message> messages_;
  std::vector<peer_event> events_;
};

/// A msgpack body holding one integer.
inline std::string int_body(std::int64_t v) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, v);
  return {buf.data(), buf.size()};
}

inline std::int64_t body_int(const std::string& body) {
  auto h = msgpack::unpack(body.data(), body.size());
  return h.get().as<std::int64_t>();
}

/// Node config with quick timings; `dead_after_ms` large unless a test is about liveness.
inline node_config config(const std::string& id, std::optional<cluster_keys> keys,
                          std::uint32_t dead_after_ms = 60000) {
  node_config c;
  c.node_id = id;
  c.keys = std::move(keys);
  c.timing.heartbeat_interval_ms = 50;
  c.timing.dead_after_ms = dead_after_ms;
  c.timing.backoff_min_ms = 20;
  c.timing.backoff_max_ms = 200;
  c.seed = std::hash<std::string>{}(id) | 1;
  return c;
}

inline cluster_keys keys_from(std::uint8_t fill) {
  cluster_secret s;
  for (auto& b : s.bytes) b = fill;
  auto k = derive_cluster_keys(s);
  return *k;
}

}  // namespace tessera::transport::control::test
