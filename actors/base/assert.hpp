// TESSERA_ASSERT: always-on checks of programmer errors (pre- and post-conditions, invariants).
//
// Unlike assert(), it stays on in release builds: a broken invariant in a distributed system must
// stop the process loudly, with file, line and the values involved, rather than corrupt state that
// peers then replicate. Bad *input* is never asserted on: it gets a result<T> error instead.
#pragma once

#include <string>

#include <fmt/format.h>

namespace tessera::detail {
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace tessera::detail

#define TESSERA_ASSERT(cond, ...)                                                         \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      ::tessera::detail::assert_fail(#cond, __FILE__, __LINE__,                           \
                                     ::tessera::detail::assert_message(__VA_ARGS__));     \
    }                                                                                     \
  } while (0)

namespace tessera::detail {
inline std::string assert_message() { return {}; }
template <class... Args>
std::string assert_message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
}  // namespace tessera::detail
