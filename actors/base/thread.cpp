#include "actors/base/thread.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

namespace tessera {

void name_this_thread(std::string_view name) noexcept {
  char buf[16] = {};
  const std::size_t n = std::min<std::size_t>(name.size(), sizeof buf - 1);
  name.copy(buf, n);
  ::pthread_setname_np(::pthread_self(), buf);
}

bool set_this_thread_nice(int nice) noexcept {
  if (nice <= 0) return true;
  nice = std::min(nice, 19);
  // PRIO_PROCESS with a thread id: on Linux a thread's nice value is its own (not POSIX).
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  return ::setpriority(PRIO_PROCESS, tid, nice) == 0;
}

int this_thread_nice() noexcept {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int v = ::getpriority(PRIO_PROCESS, tid);
  return errno == 0 ? v : 0;
}

std::map<std::string, std::size_t> thread_roles() {
  std::map<std::string, std::size_t> out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(t.path() / "comm");
    std::string name;
    if (!std::getline(in, name)) continue;
    // "http-12" -> "http", "ZMQbg/IO/0" -> "ZMQbg/IO": the slot says which, the role what.
    auto end = name.size();
    while (end > 0 && std::isdigit(static_cast<unsigned char>(name[end - 1])))
      --end;
    if (end > 0 && end < name.size() && (name[end - 1] == '-' || name[end - 1] == '/'))
      name.resize(end - 1);
    ++out[name];
  }
  return out;
}

}  // namespace tessera
