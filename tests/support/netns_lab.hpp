// netns_lab: a private L2 network for tests, made of network namespaces.
//
//     member 0 (eth0 10.77.0.1/24) ─┐
//     member 1 (eth0 10.77.0.2/24) ─┼─ veth ── br0 (bridge, in a namespace of its own)
//     member 2 (eth0 10.77.0.3/24) ─┘
//
// Nothing is created in the host's namespace: the bridge and every veth end live in namespaces
// the lab made, so deleting them (destructor) removes everything. Names carry the pid
// ("tsr<pid>-<n>-..."); namespaces left by a test process that died are removed on the next
// create(). Needs root (CAP_SYS_ADMIN); create() says so when it is not.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::test {

class netns_lab {
 public:
  /// Why netns tests cannot run here, or "" when they can (root).
  [[nodiscard]] static std::string unavailable_reason();

  [[nodiscard]] static result<netns_lab> create(std::size_t members);
  netns_lab(netns_lab&& o) noexcept : names_(std::move(o.names_)), bridge_(std::move(o.bridge_)) {
    o.names_.clear();
    o.bridge_.clear();
  }
  netns_lab& operator=(netns_lab&&) = delete;
  ~netns_lab();

  [[nodiscard]] const std::string& member(std::size_t i) const { return names_.at(i); }
  [[nodiscard]] static std::string address(std::size_t i);  ///< "10.77.0.<i+1>"
  [[nodiscard]] static constexpr const char* broadcast() { return "10.77.0.255"; }
  [[nodiscard]] static constexpr const char* interface_name() { return "eth0"; }

  /// Runs `fn` on a new thread that has entered member i's namespace, and waits for it. Sockets
  /// made inside belong to that namespace for their whole life, whichever thread uses them.
  result<void> run_in(std::size_t i, const std::function<void()>& fn) const;

 private:
  netns_lab() = default;
  std::vector<std::string> names_;
  std::string bridge_;
};

}  // namespace tessera::test
