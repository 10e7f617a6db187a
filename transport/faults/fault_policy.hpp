// fault_policy: what the network does to a message from one node to another — pure, seeded data.
//
// Transport-agnostic: the control plane asks it about frames, the bulk-link decorator
// (faulty_link.hpp) about writes and sends. decide(from, to, now) returns when the message is
// delivered: never (dropped or partitioned), once (possibly delayed), or twice (duplicated).
// Decisions depend only on the seed, the rules and the sequence of decide() calls *for that
// directed pair*: each pair draws from its own random stream (seeded from the policy seed and the
// two names), so traffic between other nodes, or thread interleaving across pairs, cannot change
// what happens between a and b. Every decision draws the same number of random values whatever
// the rules, so changing a rule changes outcomes but not the stream's position.
//
// Rules are per directed pair, with "*" as a wildcard; the most specific applies:
// (from, to) > (from, *) > (*, to) > (*, *). Partitions are separate from rules (heal() removes
// every partition and keeps the rules; clear() removes everything).
//
// Not thread-safe; fault_injector wraps it with a mutex for use from several threads.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/result.hpp"

namespace tessera::transport::faults {

using nanoseconds = std::chrono::nanoseconds;

/// Matches any node in a rule.
inline constexpr std::string_view any_node = "*";

/// What happens to messages on one directed pair.
struct link_rule {
  double drop = 0;       ///< probability a message is lost [0, 1]
  nanoseconds delay{0};  ///< fixed extra latency
  nanoseconds jitter{0}; ///< uniform extra latency in [0, jitter]
  double duplicate = 0;  ///< probability a message is delivered twice
  double reorder = 0;    ///< probability a message is held back by reorder_hold (later ones overtake)
  nanoseconds reorder_hold{std::chrono::milliseconds(5)};
  bool operator==(const link_rule&) const = default;
};

/// The fate of one message.
struct decision {
  enum class fate : std::uint8_t { deliver, dropped, partitioned };
  fate outcome = fate::deliver;
  std::uint8_t copies = 0;                 ///< 0 (lost), 1, or 2 (duplicated)
  std::array<nanoseconds, 2> deliver_at{}; ///< the first `copies` entries are valid, ascending
  [[nodiscard]] bool lost() const noexcept { return copies == 0; }
};

/// A node's protocol clock fault (Jepsen's clock nemesis): the node's timers run `rate` times as
/// fast as real time, and its clock has been bumped forward by `bump_ns` in all. Forward only: the
/// protocols' clocks are monotonic, and a node whose clock went back would be a broken node, not a
/// skewed one. Applied by the node whose name it carries (mesh/runtime reads it).
struct clock_rule {
  double rate = 1.0;         ///< in [min_clock_rate, max_clock_rate]
  std::int64_t bump_ns = 0;  ///< total forward jumps so far, in [0, max_clock_bump_ns]
  bool operator==(const clock_rule&) const = default;
};
inline constexpr double min_clock_rate = 0.25;
inline constexpr double max_clock_rate = 4.0;
inline constexpr std::int64_t max_clock_bump_ns = 3600LL * 1'000'000'000;

/// Orders (from, to) pairs of std::string or std::string_view alike (heterogeneous lookup).
struct pair_less {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    const std::string_view af(a.first), as(a.second), bf(b.first), bs(b.second);
    return af != bf ? af < bf : as < bs;
  }
};

class fault_policy {
 public:
  explicit fault_policy(std::uint64_t seed = 1) : seed_(seed) {}

  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }

  /// Sets the rule for from -> to (either may be "*"). Probabilities outside [0, 1] or negative
  /// times are refused with errc::invalid_argument.
  [[nodiscard]] result<void> set_rule(std::string_view from, std::string_view to, link_rule rule);
  /// Removes the rule for exactly (from, to).
  void remove_rule(std::string_view from, std::string_view to);

  /// Cuts every direction from a node of `side_a` to a node of `side_b`; with two_way also back.
  void partition(const std::vector<std::string>& side_a, const std::vector<std::string>& side_b,
                 bool two_way = true);
  /// Removes every partition (rules stay).
  void heal() { cuts_.clear(); }
  /// Removes every partition, rule and clock fault (a node's clock keeps the time it reached and
  /// runs at the real rate again). Random streams keep their positions.
  void clear() {
    cuts_.clear();
    rules_.clear();
    clocks_.clear();
  }

  /// The clock fault of `node` (nullptr: none).
  [[nodiscard]] const clock_rule* clock_for(std::string_view node) const {
    auto it = clocks_.find(node);
    return it == clocks_.end() ? nullptr : &it->second;
  }
  /// Asks `node`'s actor `actor` to fail (`tessera fault crash`): a request, not a fault in force,
  /// so heal and clear leave it; the node compares the count with the ones it acted on.
  void request_crash(std::string_view node, std::string_view actor) {
    ++crashes_[std::pair<std::string, std::string>(node, actor)];
  }
  /// How many crashes of `node`'s `actor` were ever requested.
  [[nodiscard]] std::uint64_t crashes_requested(std::string_view node,
                                                std::string_view actor) const {
    auto it = crashes_.find(std::pair<std::string_view, std::string_view>(node, actor));
    return it == crashes_.end() ? 0 : it->second;
  }
  /// Every clock fault in force, by node.
  [[nodiscard]] std::vector<std::pair<std::string, clock_rule>> clocks() const {
    return {clocks_.begin(), clocks_.end()};
  }
  /// Sets the rate, adds a forward bump, or (rate 1 and no bump ever) removes the entry. Errors
  /// name the bound a value is outside of.
  [[nodiscard]] result<void> set_clock(std::string_view node, std::optional<double> rate,
                                       std::int64_t add_bump_ns, bool reset);

  /// True while a partition or a rule (any, even an empty one) is in force: what a link's
  /// messages may be decided by. Clock faults do not count.
  [[nodiscard]] bool has_link_faults() const noexcept { return !cuts_.empty() || !rules_.empty(); }

  /// True when from -> to is cut.
  [[nodiscard]] bool is_cut(std::string_view from, std::string_view to) const;
  /// The rule in force for from -> to (the default rule when none matches).
  [[nodiscard]] link_rule rule_for(std::string_view from, std::string_view to) const;

  /// Every directed cut in force, as (from, to), sorted.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> cuts() const {
    return {cuts_.begin(), cuts_.end()};
  }
  /// Every rule in force, keyed (from, to) ("*" = any node), sorted.
  [[nodiscard]] std::vector<std::pair<std::pair<std::string, std::string>, link_rule>> rules()
      const {
    return {rules_.begin(), rules_.end()};
  }

  /// The fate of a message sent from -> to at `now` (any monotonic time base).
  [[nodiscard]] decision decide(std::string_view from, std::string_view to, nanoseconds now);

 private:
  struct pair_stream {
    std::uint64_t state;
  };
  pair_stream& stream(std::string_view from, std::string_view to);

  std::uint64_t seed_;
  std::map<std::pair<std::string, std::string>, link_rule, pair_less> rules_;
  std::map<std::string, clock_rule, std::less<>> clocks_;
  std::set<std::pair<std::string, std::string>, pair_less> cuts_;
  std::map<std::pair<std::string, std::string>, pair_stream, pair_less> streams_;
  std::map<std::pair<std::string, std::string>, std::uint64_t, pair_less> crashes_;  // requests
};

/// A fault command as the operator (`tessera fault ...`) or the control plane states it. Plain
/// data (msgpack), applied with apply().
struct fault_command {
  enum class verb : std::uint8_t {
    partition = 1,  ///< side_a | side_b (two_way) or side_a -> side_b
    heal = 2,
    clear = 3,
    rule = 4,   ///< set `rule` on from -> to (and back when two_way)
    clock = 5,  ///< side_a = [node]: clock_rate (when > 0), add clock_bump_ns, or clock_reset
    crash = 6,  ///< side_a = [node]: its actor named `actor` fails at its next turn (supervision)
  };
  /// For verb::rule: which part of the pair's rule this command sets (reset = remove the rule).
  enum class aspect : std::uint8_t { reset = 0, drop = 1, delay = 2, duplicate = 3, reorder = 4 };
  verb what = verb::heal;
  aspect part = aspect::reset;
  std::vector<std::string> side_a;  ///< partition; rule: [from]
  std::vector<std::string> side_b;  ///< partition; rule: [to]
  bool two_way = true;
  // rule fields (times in ns for the wire)
  double drop = 0;
  std::int64_t delay_ns = 0;
  std::int64_t jitter_ns = 0;
  double duplicate = 0;
  double reorder = 0;
  std::int64_t reorder_hold_ns = 5'000'000;
  // clock fields
  double clock_rate = 0;  ///< > 0: set the rate
  std::int64_t clock_bump_ns = 0;
  bool clock_reset = false;  ///< back to the real rate (the time reached is kept)
  // crash field
  std::string actor;  ///< the actor of side_a[0] that fails
  MSGPACK_DEFINE_MAP(what, part, side_a, side_b, two_way, drop, delay_ns, jitter_ns, duplicate,
                     reorder, reorder_hold_ns, clock_rate, clock_bump_ns, clock_reset, actor)
};

/// Parses the command language:
///   partition a,b | c,d        two-way partition between {a,b} and {c,d}
///   partition a -> c,d         one-way: a's messages to c and d vanish, theirs to a pass
///   heal                       remove all partitions
///   clear                      remove all partitions and rules
///   drop a->b 0.1              rule: drop 10% (a<->b: both directions; * = any node)
///   delay a->b 5ms [2ms]       fixed delay and optional jitter (units: ns, us, ms, s)
///   duplicate a->b 0.05
///   reorder a->b 0.2 [10ms]    hold 20% of messages back by 10 ms
///   ok a->b                    remove faults on a->b (a rule with nothing in it)
///   clock a rate 2             node a's protocol clock runs twice as fast (0.25 .. 4)
///   clock a bump 5s            node a's protocol clock jumps 5 s forward (up to 1 h in all)
///   clock a ok                 node a's clock runs at the real rate again (the time it reached stays)
/// Errors name the offending token.
[[nodiscard]] result<fault_command> parse_fault_command(std::string_view text);

/// Applies a command to a policy. Rule commands merge into the existing rule of the pair: each
/// command sets only its own aspect (drop, delay+jitter, duplicate, reorder) so they compose.
[[nodiscard]] result<void> apply(fault_policy& policy, const fault_command& command);

/// A fault_policy shared between threads (decorators, control plane, the fault command handler).
class fault_injector {
 public:
  explicit fault_injector(std::uint64_t seed = 1) : policy_(seed) {}

  [[nodiscard]] decision decide(std::string_view from, std::string_view to, nanoseconds now) {
    std::lock_guard lock(mutex_);
    return policy_.decide(from, to, now);
  }
  /// Runs f(policy) under the lock, for changes beyond what fault_command says.
  template <class F>
  auto update(F&& f) {
    std::lock_guard lock(mutex_);
    struct refresh {
      fault_injector* self;
      ~refresh() {
        self->link_faults_.store(self->policy_.has_link_faults(), std::memory_order_release);
      }
    } after{this};
    return f(policy_);
  }
  [[nodiscard]] result<void> apply(const fault_command& command) {
    return update([&](fault_policy& p) { return faults::apply(p, command); });
  }
  /// fault_policy::has_link_faults() without the lock (one atomic load): decorators pass traffic
  /// straight through while it is false, so the fault layer costs nothing until an operator sets
  /// a fault. A message already in flight when a fault is set may pass undecided.
  [[nodiscard]] bool link_faults() const noexcept {
    return link_faults_.load(std::memory_order_acquire);
  }

 private:
  std::mutex mutex_;
  fault_policy policy_;
  std::atomic<bool> link_faults_{false};
};

}  // namespace tessera::transport::faults

MSGPACK_ADD_ENUM(tessera::transport::faults::fault_command::verb);
MSGPACK_ADD_ENUM(tessera::transport::faults::fault_command::aspect);
