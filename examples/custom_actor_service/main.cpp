// A custom actor service built on tessera::actors: a bounded key-value store actor, a client that
// talks to it with requests and deadlines, and backpressure when the store is full.
// Exits 0 when every answer is what it should be.
#include <cstdio>
#include <map>
#include <string>

#include "actors/system.hpp"

namespace kv {
using namespace tessera::actors;

struct put {
  TESSERA_MESSAGE("example.kv.put");
  std::string key;
  std::string value;
  MSGPACK_DEFINE(key, value);
};
struct get {
  TESSERA_MESSAGE("example.kv.get");
  std::string key;
  MSGPACK_DEFINE(key);
};
struct stored {
  TESSERA_MESSAGE("example.kv.stored");
  std::size_t entries = 0;
  MSGPACK_DEFINE(entries);
};
struct value {
  TESSERA_MESSAGE("example.kv.value");
  std::string value;
  MSGPACK_DEFINE(value);
};

/// The service: owns its map; no locks, because one message at a time.
class store : public actor {
 public:
  explicit store(std::size_t max_entries) : max_entries_(max_entries) {
    on<put>([this](put& p) -> tessera::result<stored> {
      if (!map_.contains(p.key) && map_.size() >= max_entries_) {
        return tessera::make_error(tessera::errc::no_capacity, "store full ({} entries)",
                                   max_entries_);
      }
      map_[p.key] = p.value;
      return stored{map_.size()};
    });
    on<get>([this](get& g) -> tessera::result<value> {
      auto it = map_.find(g.key);
      if (it == map_.end()) return tessera::make_error(tessera::errc::not_found, "no key '{}'", g.key);
      return value{it->second};
    });
  }

 private:
  std::size_t max_entries_;
  std::map<std::string, std::string> map_;
};
}  // namespace kv

int main() {
  using namespace std::chrono_literals;
  using namespace tessera::actors;
  actor_system sys(config{.workers = 2});
  spawn_options opts;
  opts.name = "kv";
  auto store = sys.spawn(std::make_unique<kv::store>(2), opts);
  if (!store) return 1;
  auto kv_ref = *sys.lookup("kv");
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += ok ? 0 : 1;
  };
  expect(sys.ask<kv::stored>(kv_ref, kv::put{"a", "1"}, 5s).has_value(), "put a");
  expect(sys.ask<kv::stored>(kv_ref, kv::put{"b", "2"}, 5s)->entries == 2, "put b -> 2 entries");
  auto full = sys.ask<kv::stored>(kv_ref, kv::put{"c", "3"}, 5s);
  expect(!full && full.error().code == tessera::errc::no_capacity, "put c -> no_capacity");
  expect(sys.ask<kv::value>(kv_ref, kv::get{"b"}, 5s)->value == "2", "get b -> 2");
  auto missing = sys.ask<kv::value>(kv_ref, kv::get{"zz"}, 5s);
  expect(!missing && missing.error().code == tessera::errc::not_found, "get zz -> not_found");
  sys.shutdown();
  auto after = sys.send(kv_ref, kv::get{"a"});
  expect(!after && after.error().code == tessera::errc::closed, "after shutdown -> closed");
  return failures == 0 ? 0 : 1;
}
