// Shared by the remote-actor tests and their peer process: messages, actors, keys, waits.
// Waits are generous (loaded 2-core machine, sanitizers) and never assert on timing.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/system.hpp"
#include "actors/system_messages.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::transport::remote::test {

inline constexpr auto kWait = std::chrono::seconds(30);

inline bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds limit = kWait) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// The test cluster's secret (fixed: tests are reproducible) and a second, foreign one.
inline constexpr const char* kSecretHex =
    "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
inline constexpr const char* kForeignSecretHex =
    "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

inline control::cluster_keys keys_from(const char* hex) {
  auto secret = control::parse_cluster_secret(hex, "test secret");
  auto keys = control::derive_cluster_keys(*secret);
  return *keys;
}

/// A control node config for tests: CURVE on, loopback, fast liveness.
inline control::node_config control_config(const std::string& id, const char* secret_hex) {
  control::node_config c;
  c.node_id = id;
  c.keys = keys_from(secret_hex);
  c.timing.heartbeat_interval_ms = 100;
  c.timing.dead_after_ms = 1500;
  c.timing.backoff_min_ms = 50;
  c.timing.backoff_max_ms = 500;
  c.seed = 7;
  return c;
}

struct ping {
  TESSERA_MESSAGE("tessera.test.remote.ping");
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};
struct pong {
  TESSERA_MESSAGE("tessera.test.remote.pong");
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};
/// Asks the receiver to stop itself with reason `why` (failed).
struct die {
  TESSERA_MESSAGE("tessera.test.remote.die");
  std::string why;
  MSGPACK_DEFINE(why);
};

/// Answers ping with pong (same seq); counts one-way pings; `die` stops it as failed.
class echo final : public actors::actor {
 public:
  explicit echo(std::atomic<std::uint64_t>* seen = nullptr) : seen_(seen) {
    on<ping>([this](ping& p) {
      if (seen_ != nullptr) seen_->fetch_add(1);
      return pong{p.seq};
    });
    on<die>([this](die& d) { fail(d.why); });
  }

 private:
  std::atomic<std::uint64_t>* seen_;
};

/// Takes requests and never answers them (keeps the promises until it stops).
class silent final : public actors::actor {
 public:
  silent() {
    on<ping>([this](ping&) { held_.push_back(defer_reply<pong>()); });
  }

 private:
  std::vector<actors::reply_promise<pong>> held_;
};

/// Records every `down` it receives (thread-safe for the test thread).
class down_log {
 public:
  void add(const actors::down& d) {
    std::lock_guard lock(mu_);
    downs_.push_back(d);
  }
  std::vector<actors::down> all() const {
    std::lock_guard lock(mu_);
    return downs_;
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return downs_.size();
  }

 private:
  mutable std::mutex mu_;
  std::vector<actors::down> downs_;
};

class watcher final : public actors::actor {
 public:
  explicit watcher(down_log& log) {
    on<actors::down>([&log](actors::down& d) { log.add(d); });
  }
};

}  // namespace tessera::transport::remote::test
