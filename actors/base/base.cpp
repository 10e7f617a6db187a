#include <cstdio>
#include <cstdlib>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "actors/base/assert.hpp"
#include "actors/base/log.hpp"
#include "actors/base/result.hpp"

namespace tessera {

std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_found: return "not_found";
    case errc::timeout: return "timeout";
    case errc::closed: return "closed";
    case errc::overloaded: return "overloaded";
    case errc::corrupt: return "corrupt";
    case errc::unsupported: return "unsupported";
    case errc::io: return "io";
    case errc::protocol: return "protocol";
    case errc::unauthorized: return "unauthorized";
    case errc::cancelled: return "cancelled";
    case errc::internal: return "internal";
    case errc::no_capacity: return "no_capacity";
  }
  return "unknown";
}

std::string error::describe() const { return fmt::format("{}: {}", to_string(code), message); }

namespace detail {
void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  // fprintf, not spdlog: the logger itself may be what is broken.
  std::fprintf(stderr, "TESSERA_ASSERT failed: %s at %s:%d%s%s\n", expr, file, line,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

namespace log {
result<void> init(std::string_view level, format fmt) {
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return make_error(errc::invalid_argument,
                      "unknown log level '{}' (expected trace, debug, info, warn, error, off)",
                      level);
  }
  // Idempotent: tests and examples may call init() more than once per process.
  spdlog::drop("tessera");
  auto logger = spdlog::stderr_color_mt("tessera");
  if (fmt == format::json) {
    logger->set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%f%z","level":"%l","pid":%P,"thread":%t,"msg":"%v"})");
  } else {
    logger->set_pattern("%H:%M:%S.%e %^%L%$ [%P] %v");
  }
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return ok();
}
}  // namespace log

}  // namespace tessera
