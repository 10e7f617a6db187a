// child_process / run_command: start real programs from tests (daemons, `ip`), with a bounded
// wait and a clean kill. Only ever signals the pid it started.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::test {

/// Runs argv[0] (PATH lookup) to completion, output to a temporary file; error with the output
/// when it exits non-zero or runs longer than `timeout`.
[[nodiscard]] result<std::string> run_command(
    const std::vector<std::string>& argv,
    std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// A running child. The destructor terminates it (SIGTERM, then SIGKILL after 5 s).
class child_process {
 public:
  /// Starts argv with extra "NAME=VALUE" environment entries; stdout+stderr go to `log_file`.
  [[nodiscard]] static result<child_process> spawn(const std::vector<std::string>& argv,
                                                   const std::vector<std::string>& extra_env,
                                                   const std::string& log_file);
  child_process() = default;
  child_process(child_process&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  child_process& operator=(child_process&& o) noexcept;
  ~child_process() { terminate(); }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running();
  /// SIGTERM, wait up to `grace`, then SIGKILL; reaps the child. Idempotent. Returns its wait
  /// status (waitpid's), or -1 when there was no child (not started, or already reaped).
  int terminate(std::chrono::milliseconds grace = std::chrono::seconds(5));

 private:
  pid_t pid_ = -1;
};

/// Polls `pred` every 10 ms until it is true or `deadline` passes; returns its last value.
template <class Pred>
bool wait_until(Pred&& pred, std::chrono::milliseconds deadline = std::chrono::seconds(30));

/// Reads a whole file ("" if absent).
[[nodiscard]] std::string read_file(const std::string& path);

}  // namespace tessera::test

#include <thread>

template <class Pred>
bool tessera::test::wait_until(Pred&& pred, std::chrono::milliseconds deadline) {
  auto end = std::chrono::steady_clock::now() + deadline;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}
