// supervisor: an actor that starts children and restarts them when they fail.
//
//   strategy one_for_one: only the failed child is restarted.
//   strategy all_for_one: every other child is stopped (exit_kind::killed) and all restart.
//
// Restarts happen after a backoff (initial * 2^k for the k-th restart of that child within the
// window, capped at backoff_max). At most `max_restarts` restarts within `window`; one more
// failure and the supervisor gives up: it stops as failed ("restart bound exceeded ..."), which
// its own parent supervisor sees as a failed child (escalation), and monitors see as `down`.
// Children that stop normally (or at shutdown) are not restarted.
//
//        child_exit(abnormal)            backoff timer
//   up ───────────────────────► waiting ───────────────► up (new child, same name)
//    │  bound exceeded                                    
//    └────────────────────────► stopped(failed) ──► parent: child_exit / monitors: down
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor.hpp"
#include "actors/system.hpp"

namespace tessera::actors {

enum class restart_strategy : std::uint8_t { one_for_one, all_for_one };

struct supervisor_spec {
  restart_strategy strategy = restart_strategy::one_for_one;
  std::size_t max_restarts = 3;
  clock::duration window = std::chrono::seconds(5);
  clock::duration backoff_initial = std::chrono::milliseconds(10);
  clock::duration backoff_max = std::chrono::seconds(1);
};

struct child_spec {
  /// Registered name of the child (re-bound to each restarted instance); may be empty.
  std::string name;
  /// Makes a fresh instance (the state of a failed child is not reused).
  std::function<std::unique_ptr<actor>()> make;
  /// Mailbox bounds and pinning; name and parent are set by the supervisor.
  spawn_options options;
};

/// Asks a supervisor for its children (request; answered with supervisor_report).
struct supervisor_query {
  TESSERA_MESSAGE("tessera.actors.supervisor_query");
  MSGPACK_DEFINE();
};
struct supervisor_report {
  TESSERA_MESSAGE("tessera.actors.supervisor_report");
  std::vector<actor_ref> children;  ///< invalid while a child waits for its restart
  std::uint64_t restarts = 0;       ///< total restarts since the supervisor started
  MSGPACK_DEFINE(children, restarts);
};

class supervisor : public actor {
 public:
  supervisor(supervisor_spec spec, std::vector<child_spec> children);
  void on_start() override;
  void on_stop(const exit_reason& reason) override;

 private:
  struct restart_children {
    TESSERA_MESSAGE("tessera.actors.restart_children");
    std::vector<std::uint32_t> indices;
    MSGPACK_DEFINE(indices);
  };
  struct child {
    child_spec spec;
    actor_ref ref;
    std::deque<clock::time_point> restarts;  // of this child, within the window
  };
  void on_child_exit(const child_exit& e);
  bool start_child(std::size_t index);
  clock::duration backoff(child& c) const;

  supervisor_spec spec_;
  std::vector<child> children_;
  std::deque<clock::time_point> restarts_;  // of all children, within the window
  std::uint64_t total_restarts_ = 0;
};

}  // namespace tessera::actors
