// private_avahi: a dbus-daemon and an avahi-daemon of the test's own, touching nothing of the
// host's network or buses.
//
//   dbus-daemon  --config-file <tmp>/bus.conf      system-bus config, socket <tmp>/bus.sock
//   avahi-daemon -f <tmp>/avahi.conf --no-drop-root --no-chroot --no-rlimits
//       run inside a fresh network namespace (its `lo` only: allow-interfaces=lo,
//       use-ipv6=no) and a private mount namespace with a tmpfs on /run, so its pid file
//       (/run/avahi-daemon/pid) cannot clash with a host avahi or a parallel test.
//
// Clients (the code under test) stay in the test process: they reach avahi over D-Bus through
// DBUS_SYSTEM_BUS_ADDRESS=unix:path=<tmp>/bus.sock, which the caller sets (see bus_address()).
// libdbus reads that variable once per process and caches it: use one bus per test process and
// start/stop avahi-daemon on it per test.
//
// Finding (checked 2026-11-23, avahi 0.8): a new namespace's `lo` lacks the MULTICAST flag, and
// with it off the tests still pass: every client talks to the one daemon, which answers browses
// for locally published services from its own records without any packet on the wire. The
// fixture sets `ip link set lo multicast on` inside its namespace anyway (it is private, so this
// costs the host nothing) so that the daemon's multicast socket path is the one production uses.
#pragma once

#include <memory>
#include <string>

#include "actors/base/result.hpp"
#include "tests/support/child_process.hpp"

namespace tessera::test {

class private_avahi {
 public:
  /// Why it cannot run here ("" when it can): needs root, dbus-daemon and avahi-daemon.
  [[nodiscard]] static std::string unavailable_reason();

  /// Starts the bus only; start_avahi() starts the daemon (tests of "daemon absent" start late).
  [[nodiscard]] static result<std::unique_ptr<private_avahi>> start_bus();
  /// Starts avahi-daemon and waits (up to 30 s) until it reports "Server startup complete".
  [[nodiscard]] result<void> start_avahi();
  /// Terminates avahi-daemon (SIGTERM; it withdraws its records), bus stays up.
  void stop_avahi();

  ~private_avahi();
  [[nodiscard]] const std::string& bus_address() const noexcept { return bus_address_; }
  [[nodiscard]] std::string avahi_log() const;

 private:
  private_avahi() = default;
  std::string dir_;
  std::string netns_;
  std::string bus_address_;
  child_process dbus_;
  child_process avahi_;
  int avahi_starts_ = 0;
};

}  // namespace tessera::test
