// Bounds on the client endpoints' connections (issue 32, item 5): at most `per_address` open
// connections from one source address on each endpoint, and `total` on all of them together, so
// that a stranger holding idle connections cannot take every descriptor of the node (its control
// plane, peer links and model files need theirs) nor every connection an endpoint can hold.
//
// libzmq accepts connections by itself and has no such bound. It reports each accepted and each
// closed connection, with its descriptor, to a monitor socket; a connection past a bound is shut
// down (shutdown(2), not close: the descriptor stays libzmq's, which then sees the connection end
// and closes it through its normal path) as soon as the monitor says it was accepted — before its
// handshake, so an idle connection that never speaks is refused as fast as one that does.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include <zmq.hpp>

namespace tessera::mesh::serving {

struct connection_limits {
  std::uint32_t per_address = 256;  ///< open connections from one address, per endpoint
  std::uint32_t total = 4096;       ///< open connections on all watched endpoints together
};

/// The counting: pure, so that the bounds are tested without sockets.
class connection_ledger {
 public:
  explicit connection_ledger(connection_limits limits) : limits_(limits) {}
  /// Connection `fd` on endpoint `slot` from `address` was accepted: false when it is past a bound
  /// (it still counts until closed() — it holds its descriptor until then).
  bool opened(int slot, int fd, const std::string& address);
  /// Connection `fd` on `slot` ended (unknown ones are ignored).
  void closed(int slot, int fd);
  /// Every connection of `slot` ended at once (its socket was closed).
  void forget(int slot);
  [[nodiscard]] std::uint32_t open() const { return total_; }
  [[nodiscard]] std::uint32_t open_from(int slot, const std::string& address) const;
  [[nodiscard]] const connection_limits& limits() const { return limits_; }

 private:
  connection_limits limits_;
  std::map<std::pair<int, int>, std::string> address_of_;  // (slot, fd) -> address
  std::map<std::pair<int, std::string>, std::uint32_t> per_address_;
  std::uint32_t total_ = 0;
};

/// The plumbing: a monitor per watched endpoint, read on the endpoint's own (io) thread.
class connection_guard {
 public:
  static constexpr int max_slots = 2;
  /// `who` names the node in the log line of a refused connection.
  connection_guard(zmq::context_t& ctx, connection_limits limits, std::string who)
      : ctx_(ctx), ledger_(limits), who_(std::move(who)) {}
  /// Watches `s` as endpoint `slot` (call before it binds: no accepted connection goes unseen).
  void watch(int slot, zmq::socket_t& s);
  /// `slot`'s socket is about to close (its connections with it): stop watching it. Must be
  /// called while that socket is still open — before `close()` — and before the guard ends.
  void forget(int slot);
  /// The monitor socket of `slot`, to poll (null when not watched).
  [[nodiscard]] void* monitor_handle(int slot);
  /// Reads `slot`'s pending events and shuts down the connections past a bound.
  void drain(int slot);

  [[nodiscard]] const connection_ledger& ledger() const { return ledger_; }
  [[nodiscard]] std::uint64_t refused() const { return refused_; }

 private:
  zmq::context_t& ctx_;
  connection_ledger ledger_;
  std::string who_;
  /// Events queued for us before libzmq's I/O thread waits for us to read (ACCEPTED and
  /// DISCONNECTED: two per connection; the io loop reads up to 1024 per turn).
  static constexpr int kMaxQueuedEvents = 16384;
  std::optional<zmq::socket_t> monitors_[max_slots];
  void* watched_[max_slots] = {};  // the sockets monitored, until forget()
  std::uint64_t refused_ = 0;
  std::uint64_t generation_ = 0;  // monitor endpoints are unique per watch
  std::chrono::steady_clock::time_point last_log_{};
};

}  // namespace tessera::mesh::serving
