// A cluster of real `tessera node` processes for tests and benchmarks: temp data dirs, one
// generated cluster key, unique ports, seeds listing each other, mDNS and beacons off. Nodes run
// on loopback, or each in a network namespace of a netns_lab (then `ns` names it).
#pragma once

#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/base/result.hpp"
#include "tests/support/child_process.hpp"

namespace tessera::test {

struct cluster_node {
  std::string host;        ///< address it binds and advertises
  std::uint16_t port = 0;  ///< control port
  std::string data_dir;
  std::string log;
  std::string ns;  ///< network namespace ("" = host)
  /// Runs before the node's argv, inside its namespace (e.g. {"prlimit", "--nofile=256:256"}:
  /// a command that execs the rest, so that the pid is the node's).
  std::vector<std::string> exec_prefix;
  std::optional<child_process> proc;
  [[nodiscard]] std::string endpoint() const { return host + ":" + std::to_string(port); }
};

class cluster_fixture {
 public:
  /// Creates the temp directory and the key. `tessera` is the binary path.
  static result<cluster_fixture> create(std::string tessera, std::size_t n,
                                        std::vector<std::string> hosts = {},
                                        std::vector<std::string> namespaces = {});
  cluster_fixture(cluster_fixture&&) = default;
  ~cluster_fixture();

  /// Starts node i (seeds: every other node's endpoint). Extra flags are appended; `key`
  /// replaces the cluster key file when not empty.
  result<void> start(std::size_t i, const std::vector<std::string>& extra = {},
                     const std::string& key = "");
  /// Starts node i as the README starts peers on one host: no --listen (the node picks the
  /// address it advertises), only the given seeds ("host:port"), the fixture's timeouts.
  result<void> start_plain(std::size_t i, const std::vector<std::string>& seeds,
                           const std::vector<std::string>& extra = {});
  /// Adds one more node slot (not started) and returns its index.
  std::size_t add_node(std::string host = "127.0.0.1", std::string ns = "");
  void kill9(std::size_t i);
  /// SIGTERM (a graceful leave, 5 s at most); returns the wait status, -1 if it was not running.
  int term(std::size_t i);
  [[nodiscard]] bool running(std::size_t i);

  /// `tessera status --json` against node i (run from node `from_ns_of`'s namespace when set).
  [[nodiscard]] std::optional<nlohmann::json> status(std::size_t i) const;
  /// Node ids known to be running -> leader id each reports ("" = none); nullopt if one failed.
  [[nodiscard]] std::vector<std::optional<nlohmann::json>> status_all(
      const std::vector<std::size_t>& nodes) const;

  /// True when every node in `nodes` answers, names the same non-null leader, holds a view with
  /// the same epoch whose live members are exactly `nodes`, and every directed link between them
  /// has been measured. `leader_out` gets the leader's id.
  [[nodiscard]] bool converged(const std::vector<std::size_t>& nodes,
                               std::string* leader_out = nullptr, std::string* why = nullptr) const;

  [[nodiscard]] const std::string& key_file() const { return key_; }
  [[nodiscard]] const std::string& dir() const { return dir_; }
  [[nodiscard]] cluster_node& node(std::size_t i) { return nodes_.at(i); }
  [[nodiscard]] std::string node_id(std::size_t i) const;  ///< from node.id ("" if absent)
  [[nodiscard]] std::size_t size() const { return nodes_.size(); }
  [[nodiscard]] std::string logs() const;  ///< tail of every node's log, for failure messages

 private:
  cluster_fixture() = default;
  std::vector<std::string> wrap(const std::string& ns, std::vector<std::string> argv) const;
  /// `tessera node` for slot i: data dir, key, ports, discovery off, the tests' timeouts.
  std::vector<std::string> node_argv(std::size_t i, const std::string& key, bool listen) const;
  result<void> spawn(std::size_t i, const std::vector<std::string>& argv);

  std::string tessera_;
  std::string dir_;
  std::string key_;
  std::uint16_t base_port_ = 0;
  /// flock on the port block's lock file, held while the fixture lives: two fixtures (ctest -j)
  /// never share a block.
  struct port_lock {
    int fd = -1;
    port_lock() = default;
    explicit port_lock(int f) : fd(f) {}
    port_lock(port_lock&& o) noexcept : fd(o.fd) { o.fd = -1; }
    port_lock& operator=(port_lock&& o) noexcept {
      std::swap(fd, o.fd);
      return *this;
    }
    ~port_lock();
  } port_lock_;
  std::vector<cluster_node> nodes_;
};

}  // namespace tessera::test
