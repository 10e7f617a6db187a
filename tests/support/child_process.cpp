#include "tests/support/child_process.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;  // NOLINT: POSIX

namespace tessera::test {
namespace {

// Everything the child needs is prepared before fork: after it only async-signal-safe calls.
struct exec_args {
  std::vector<std::string> storage;
  std::vector<char*> argv;
  std::vector<std::string> env_storage;
  std::vector<char*> envp;
};

exec_args prepare(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  exec_args a;
  a.storage = argv;
  for (auto& s : a.storage)
    a.argv.push_back(s.data());
  a.argv.push_back(nullptr);
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& x : extra_env)
      overridden |= x.substr(0, x.find('=')) == name;
    if (!overridden) a.env_storage.push_back(entry);
  }
  for (const auto& x : extra_env)
    a.env_storage.push_back(x);
  for (auto& s : a.env_storage)
    a.envp.push_back(s.data());
  a.envp.push_back(nullptr);
  return a;
}

result<pid_t> fork_exec(exec_args& a, const std::string& log_file) {
  int out = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0) return make_error(errc::io, "{}: {}", log_file, std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out);
    return make_error(errc::io, "fork: {}", std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(out, 1);
    ::dup2(out, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::setpgid(0, 0);  // its own group: a terminal's ^C does not reach it twice
    // A test process that dies (crash, SIGKILL, timeout) must not leave daemons behind: the
    // child gets SIGTERM when the forking thread goes. Survives execve.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::execvpe(a.argv[0], a.argv.data(), a.envp.data());
    ::_exit(127);
  }
  ::close(out);
  return pid;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

result<std::string> run_command(const std::vector<std::string>& argv,
                                std::chrono::milliseconds timeout) {
  char tmpl[] = "/tmp/tessera-cmd-XXXXXX";
  int fd = ::mkstemp(tmpl);
  if (fd < 0) return make_error(errc::io, "mkstemp: {}", std::strerror(errno));
  ::close(fd);
  auto args = prepare(argv, {});
  auto pid = fork_exec(args, tmpl);
  if (!pid) return std::move(pid).error();
  int status = 0;
  auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pid_t r = ::waitpid(*pid, &status, WNOHANG);
    if (r == *pid) break;
    if (std::chrono::steady_clock::now() > end) {
      ::kill(*pid, SIGKILL);
      ::waitpid(*pid, &status, 0);
      ::unlink(tmpl);
      return make_error(errc::timeout, "{}: still running after {} ms", argv[0], timeout.count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string output = read_file(tmpl);
  ::unlink(tmpl);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const auto& a : argv)
      cmd += a + " ";
    return make_error(errc::io, "`{}` failed (status {}): {}", cmd, status, output);
  }
  return output;
}

result<child_process> child_process::spawn(const std::vector<std::string>& argv,
                                           const std::vector<std::string>& extra_env,
                                           const std::string& log_file) {
  auto args = prepare(argv, extra_env);
  auto pid = fork_exec(args, log_file);
  if (!pid) return std::move(pid).error();
  child_process c;
  c.pid_ = *pid;
  return c;
}

child_process& child_process::operator=(child_process&& o) noexcept {
  if (this != &o) {
    terminate();
    pid_ = o.pid_;
    o.pid_ = -1;
  }
  return *this;
}

bool child_process::running() {
  if (pid_ < 0) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int child_process::terminate(std::chrono::milliseconds grace) {
  if (pid_ < 0) return -1;
  ::kill(pid_, SIGTERM);
  auto end = std::chrono::steady_clock::now() + grace;
  int status = -1;  // stays -1 if waitpid fails (not our child any more)
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
  return status;
}

}  // namespace tessera::test
