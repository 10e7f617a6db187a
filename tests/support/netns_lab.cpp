#include "tests/support/netns_lab.hpp"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tests/support/child_process.hpp"

namespace tessera::test {
namespace {

std::atomic<int> lab_counter{0};

// Removes tsr<pid>-* namespaces whose pid is gone (a crashed or killed test run).
void remove_stale() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("tsr", 0) != 0) continue;
    pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + 3));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    (void)run_command({"ip", "netns", "del", name});
  }
}

}  // namespace

std::string netns_lab::unavailable_reason() {
  if (::geteuid() != 0) return "network namespace tests need root (ip netns add); skipped";
  return "";
}

std::string netns_lab::address(std::size_t i) {
  return fmt::format("10.77.0.{}", i + 1);
}

result<netns_lab> netns_lab::create(std::size_t members) {
  if (auto why = unavailable_reason(); !why.empty())
    return make_error(errc::unsupported, "{}", why);
  remove_stale();
  netns_lab lab;
  std::string prefix = fmt::format("tsr{}-{}", ::getpid(), lab_counter.fetch_add(1));
  lab.bridge_ = prefix + "-br";
  // From here the destructor of `lab` deletes whatever was made, on every error path too.
  auto ip = [](std::vector<std::string> args) -> result<void> {
    args.insert(args.begin(), "ip");
    auto r = run_command(args);
    if (!r) return std::move(r).error();
    return ok();
  };
  TESSERA_TRY(ip({"netns", "add", lab.bridge_}));
  TESSERA_TRY(
      ip({"-n", lab.bridge_, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"}));
  TESSERA_TRY(ip({"-n", lab.bridge_, "link", "set", "br0", "up"}));
  for (std::size_t i = 0; i < members; ++i) {
    std::string ns = fmt::format("{}-m{}", prefix, i);
    TESSERA_TRY(ip({"netns", "add", ns}));
    lab.names_.push_back(ns);
    std::string port = fmt::format("p{}", i);
    TESSERA_TRY(ip({"-n", lab.bridge_, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                    "netns", ns}));
    TESSERA_TRY(ip({"-n", lab.bridge_, "link", "set", port, "master", "br0", "up"}));
    TESSERA_TRY(ip({"-n", ns, "addr", "add", address(i) + "/24", "brd", "+", "dev", "eth0"}));
    TESSERA_TRY(ip({"-n", ns, "link", "set", "eth0", "up"}));
    TESSERA_TRY(ip({"-n", ns, "link", "set", "lo", "up"}));
  }
  return lab;
}

netns_lab::~netns_lab() {
  for (const auto& ns : names_)
    (void)run_command({"ip", "netns", "del", ns});
  if (!bridge_.empty()) (void)run_command({"ip", "netns", "del", bridge_});
}

result<void> netns_lab::run_in(std::size_t i, const std::function<void()>& fn) const {
  std::string path = "/run/netns/" + member(i);
  result<void> outcome = ok();
  std::thread t([&] {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      outcome = make_error(errc::io, "{}: {}", path, std::strerror(errno));
      return;
    }
    if (::setns(fd, CLONE_NEWNET) != 0) {
      outcome = make_error(errc::io, "setns {}: {}", path, std::strerror(errno));
      ::close(fd);
      return;
    }
    ::close(fd);
    fn();
  });
  t.join();
  return outcome;
}

}  // namespace tessera::test
