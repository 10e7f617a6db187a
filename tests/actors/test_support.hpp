// Messages and helpers shared by the actor-runtime tests.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "actors/system.hpp"

namespace tessera::actors::test {

struct ping {
  TESSERA_MESSAGE("tessera.test.ping");
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};
struct pong {
  TESSERA_MESSAGE("tessera.test.pong");
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};
struct boom {
  TESSERA_MESSAGE("tessera.test.boom");
  std::string why;
  MSGPACK_DEFINE(why);
};
struct tick {
  TESSERA_MESSAGE("tessera.test.tick");
  std::uint32_t n = 0;
  MSGPACK_DEFINE(n);
};

/// Answers ping with pong(seq); throws on boom.
class echo : public actor {
 public:
  echo() {
    on<ping>([](ping& p) { return pong{p.seq}; });
    on<boom>([](boom& b) -> void { throw std::runtime_error(b.why); });
  }
};

/// Sends `count` pings to `to` in one turn, then stops itself.
struct burst {
  TESSERA_MESSAGE("tessera.test.sched.burst");
  actor_ref to;
  std::uint32_t count = 0;
  MSGPACK_DEFINE(to, count);
};
class burster : public actor {
 public:
  burster() {
    on<burst>([this](burst& b) {
      for (std::uint32_t i = 0; i < b.count; ++i) (void)send(b.to, ping{i});
      quit();
    });
  }
};
/// Counts the pings it gets.
class counter : public actor {
 public:
  explicit counter(std::atomic<std::uint64_t>& seen) : seen_(seen) {
    on<ping>([this](ping&) { seen_.fetch_add(1); });
  }

 private:
  std::atomic<std::uint64_t>& seen_;
};

/// Polls `pred` until it holds or a generous deadline passes (loaded 2-core CI machines).
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace tessera::actors::test
