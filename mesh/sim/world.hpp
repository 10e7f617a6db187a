// A deterministic simulated network and clock for running N nodes of protocol state machines in
// one process, on the actor runtime's deterministic mode (actors::run_mode::deterministic): one
// thread, the runtime's virtual clock, and its seeded choice among runnable actors.
//
// Every node is an actor hosting its bundle of state machines; a network actor holds the messages
// in flight and the nodes' timers and hands each to its node's actor when it is due (one actor
// timer for the earliest). Events due at the same instant reach their nodes in an order the
// system seed picks, so seeds explore interleavings, and a seed replays exactly.
//
// Owns: virtual time, the in-flight messages, the network's faults — transport/faults'
// fault_policy, the same seeded model `tessera fault` drives on a live cluster (delay, jitter,
// drop, duplicate, reorder; clean, one-way and bridge partitions; any rule per directed pair, on
// nodes named by their decimal id) — plus what only a simulator can do (clogging (swizzle-clog),
// crash/restart, pause, clock skew), and the per-node durable bytes that survive a crash. Generic:
// a node is any sim_node (a bundle of state machines with step()); payloads are opaque bytes
// (msgpack in practice, so the wire encoding is exercised too). Same seed + same calls = the same
// run, event for event.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <msgpack.hpp>

#include "actors/system.hpp"
#include "mesh/membership/ids.hpp"
#include "transport/faults/fault_policy.hpp"

namespace tessera::mesh::sim {

class network_actor;
class node_actor;

using bytes = std::vector<std::uint8_t>;

/// A message between nodes; `channel` says which state machine of the bundle it is for.
struct envelope {
  member_id from = no_member;
  member_id to = no_member;
  std::uint8_t channel = 0;
  bytes payload;
  MSGPACK_DEFINE(from, to, channel, payload);
};

class world;

/// What a node sees of the world while handling one event.
class node_context {
 public:
  node_context(world& w, member_id self) : world_(w), self_(self) {}
  /// The node's local clock (global time through this node's offset and rate).
  [[nodiscard]] std::uint64_t now_ms() const;
  /// The world's global time (no skew): what a node's wall clock is built on.
  [[nodiscard]] std::uint64_t global_ms() const;
  [[nodiscard]] member_id self() const { return self_; }
  void send(member_id to, std::uint8_t channel, bytes payload);
  /// The node's single timer, in local time; replaces the previous one; nullopt cancels.
  void set_timer(std::optional<std::uint64_t> local_at_ms);
  /// Bytes that survive crash/restart (the node's data dir).
  bytes& durable();

 private:
  world& world_;
  member_id self_;
};

/// A simulated node: a bundle of state machines driven by these callbacks.
class sim_node {
 public:
  virtual ~sim_node() = default;
  virtual void on_start(node_context& ctx) = 0;
  virtual void on_message(node_context& ctx, const envelope& msg) = 0;
  virtual void on_timer(node_context& ctx) = 0;
};

/// Builds a node (again after a crash); it reads its durable bytes in on_start.
using node_factory = std::function<std::unique_ptr<sim_node>(member_id)>;

/// The base network, applied to every message: the fault policy's ("*", "*") rule (delay_min as
/// its delay, the rest as its jitter).
struct link_faults {
  std::uint32_t delay_min_ms = 1;
  std::uint32_t delay_max_ms = 3;  ///< uniform jitter in [min, max]; jitter reorders
  std::uint32_t drop_ppm = 0;
  std::uint32_t duplicate_ppm = 0;
};

struct world_counters {
  std::uint64_t sent = 0;
  std::uint64_t delivered = 0;
  std::uint64_t dropped_random = 0;     ///< the fault policy's drop
  std::uint64_t dropped_partition = 0;  ///< cut when sent, or when it arrived
  std::uint64_t dropped_down = 0;      ///< destination crashed or not started
  std::uint64_t dropped_overflow = 0;  ///< in-flight, pause or clog backlog bound reached
  std::uint64_t clogged = 0;           ///< messages held by a clog (delivered on unclog)
  std::uint64_t duplicated = 0;
  std::uint64_t events = 0;
};

class world {
 public:
  static constexpr std::size_t max_in_flight = 200'000;  ///< beyond: new messages dropped
  static constexpr std::size_t max_paused_backlog = 10'000;
  static constexpr std::size_t max_clogged = 50'000;  ///< held messages, all clogs together

  world(std::uint64_t seed, node_factory factory);
  ~world();
  world(const world&) = delete;
  world& operator=(const world&) = delete;

  [[nodiscard]] std::uint64_t seed() const { return seed_; }
  /// Global simulated time: the actor system's virtual clock.
  [[nodiscard]] std::uint64_t now_ms() const;

  /// Adds a node (down until start()).
  void add_node(member_id id);
  void start(member_id id);
  /// Drops the node's volatile state (its object) and everything in flight to it; durable()
  /// bytes stay.
  void crash(member_id id);
  void restart(member_id id) { start(id); }
  /// A paused node processes nothing; its messages and timer wait (bounded) until resume.
  void pause(member_id id);
  void resume(member_id id);
  /// Local clock = offset_ms + global * (1e6 + rate_ppm) / 1e6 (rate_ppm > -1e6).
  void set_clock(member_id id, std::int64_t offset_ms, std::int32_t rate_ppm);
  /// A clock fault as `tessera fault clock` makes one: the node's clock runs at `rate_ppm` from
  /// now on (continuing from the time it shows) and jumps `bump_ms` forward. Never goes back.
  void skew_clock(member_id id, std::int32_t rate_ppm, std::uint64_t bump_ms);

  /// Clean partition: nodes in different groups cannot talk; nodes in no group talk to all.
  void partition(const std::vector<std::vector<member_id>>& groups);
  /// One-way: messages from `from` to `to` are lost; the reverse direction works.
  void block(member_id from, member_id to);
  /// Bridge: two sides that cannot talk, and `bridge` that talks to both.
  void bridge(const std::vector<member_id>& a, member_id bridge, const std::vector<member_id>& b);
  /// Clog (FoundationDB's swizzle-clog): messages from or to `id` are held, not lost, until
  /// both ends are unclogged; then they arrive after a fresh link delay, in the order they were
  /// held. Unlike a partition nothing is dropped, so a clogged node looks slow, then floods.
  void clog(member_id id);
  void unclog(member_id id);
  [[nodiscard]] bool is_clogged(member_id id) const { return clogged_.contains(id); }
  /// Removes every partition, block and clog (held messages are released).
  void heal();
  void set_link_faults(const link_faults& f);
  /// The fault policy itself: any rule on any directed pair, as `tessera fault` sets them (a
  /// node's name is its id in decimal). Partitions set here count like the ones above.
  [[nodiscard]] transport::faults::fault_policy& faults() { return policy_; }
  /// A node's name in the fault policy.
  [[nodiscard]] static std::string name_of(member_id id);
  /// Applies a command of `tessera fault`'s language (transport/faults' parse_fault_command) to
  /// the simulated cluster, as the live cluster applies it: partitions and rules to the network,
  /// `clock` to the named node's clock (skew_clock). Errors name what the policy refused.
  result<void> apply_fault(const transport::faults::fault_command& command);
  /// Messages of `channel` between two nodes arrive in the order they were sent (a TCP stream,
  /// like the clients' ZeroMQ sockets); jitter then delays, never reorders them. Drops,
  /// duplicates and partitions still apply.
  void set_fifo(std::uint8_t channel) { fifo_.insert(channel); }

  /// False while from -> to is cut.
  [[nodiscard]] bool can_deliver(member_id from, member_id to) const;
  /// The groups of the current clean partition (empty if none or not clean).
  [[nodiscard]] const std::vector<std::vector<member_id>>& clean_partition() const {
    return clean_groups_;
  }

  /// Runs events until global time `t_ms` (inclusive); then now_ms() == t_ms.
  void run_until(std::uint64_t t_ms);
  void run_for(std::uint64_t ms) { run_until(now_ms() + ms); }
  /// Runs `fn` as an event of node `id` now (a test injecting an input, e.g. a graceful leave);
  /// does nothing while the node is down.
  void invoke(member_id id, const std::function<void(sim_node&, node_context&)>& fn);
  /// Called after every event (checkers hook in here).
  void set_observer(std::function<void()> observer) { observer_ = std::move(observer); }

  [[nodiscard]] const std::vector<member_id>& ids() const { return ids_; }
  [[nodiscard]] bool is_up(member_id id) const;
  [[nodiscard]] bool is_paused(member_id id) const;
  /// The node object, or nullptr while down.
  [[nodiscard]] sim_node* node(member_id id) const;
  [[nodiscard]] const world_counters& counters() const { return counters_; }
  [[nodiscard]] std::uint64_t local_time(member_id id, std::uint64_t global_ms) const;
  /// A node's durable bytes (its data dir), also while it is down (tests edit them).
  [[nodiscard]] bytes& durable_of(member_id id) { return at(id).durable; }

 private:
  friend class node_context;
  friend class node_actor;
  friend class network_actor;
  struct slot {
    std::unique_ptr<sim_node> node;
    actors::actor_ref actor;  // hosts `node` while it is up
    bytes durable;
    std::uint64_t epoch = 0;  // bumps on crash: events of an older life are ignored
    bool paused = false;
    std::vector<envelope> backlog;
    bool timer_pending = false;  // fired while paused
    std::uint64_t timer_gen = 0;
    std::optional<std::uint64_t> timer_local;  // the pending timer's deadline, in local time
    std::int64_t offset_ms = 0;
    std::int32_t rate_ppm = 0;
  };
  struct event {
    std::uint64_t at_ms;
    std::uint64_t seq;
    member_id node;
    std::uint64_t epoch;
    std::uint64_t timer_gen;  // 0 = message
    std::shared_ptr<envelope> msg;
    bool operator>(const event& o) const { return std::tie(at_ms, seq) > std::tie(o.at_ms, o.seq); }
  };

  void send(member_id from, envelope e);
  /// Network actor: hands every event due now to its node's actor, then re-arms for the next.
  void pump();
  /// After an event was queued: make sure the network actor looks at the queue again.
  void kick();
  /// Node actor: runs one event on the node (or, if it no longer applies, counts it).
  void run_event(member_id id, std::uint64_t epoch, std::uint64_t timer_gen, envelope* msg);
  void hand_to_node(slot& s, std::uint64_t timer_gen, const envelope* msg);
  /// When a message sent now from `e.from` to `e.to` arrives (a FIFO channel: never before the
  /// previous one on the same link).
  std::uint64_t arrival(const envelope& e);
  /// `at_ms`, or later on a FIFO channel (never before the previous message of its link).
  std::uint64_t fifo_at(const envelope& e, std::uint64_t at_ms);
  void set_timer(member_id id, std::optional<std::uint64_t> local_at_ms);
  void dispatch(const event& e);
  slot& at(member_id id);
  const slot& at(member_id id) const;

  std::uint64_t seed_;
  det_rng rng_;
  node_factory factory_;
  actors::actor_system sys_;
  actors::actor_ref net_;
  network_actor* net_actor_ = nullptr;  // owned by sys_
  bool kicked_ = false;  // a wake for the network actor is on its way
  std::uint64_t next_seq_ = 0;
  std::map<member_id, slot> slots_;
  std::vector<member_id> ids_;
  std::priority_queue<event, std::vector<event>, std::greater<>> queue_;
  std::size_t in_flight_ = 0;
  transport::faults::fault_policy policy_;
  std::map<member_id, std::string> names_;  // member -> its name in the policy
  std::map<member_id, transport::faults::clock_rule> clocks_applied_;  // by apply_fault
  std::set<member_id> clogged_;
  std::set<std::uint8_t> fifo_;
  std::map<std::tuple<member_id, member_id, std::uint8_t>, std::uint64_t> last_arrival_;
  std::vector<event> held_;  // messages stopped by a clog, in the order they were held
  std::vector<std::vector<member_id>> clean_groups_;
  world_counters counters_;
  std::function<void()> observer_;
};

}  // namespace tessera::mesh::sim
