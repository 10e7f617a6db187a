#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/pattern_formatter.h>
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
namespace {
format g_format = format::text;  // set by init(), before any thread logs

// %* in the json pattern: the message as a JSON string's inside.
class json_message final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string e = json_escape(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(e.data(), e.data() + e.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<json_message>();
  }
};
}  // namespace

std::string json_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out += c;
    }
  }
  return out;
}

void sayf(bool error, const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string text(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(text.data(), text.size() + 1, format, again);
  va_end(again);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  say(text, error);
}

format current_format() noexcept {
  return g_format;
}

std::string current_level() {
  const auto name = spdlog::level::to_string_view(spdlog::default_logger()->level());
  return std::string(name.data(), name.size());
}

void say(std::string_view text, bool error) {
  if (g_format == format::json) {
    if (error)
      spdlog::error("{}", text);
    else
      spdlog::info("{}", text);
    return;
  }
  std::fprintf(stderr, "%.*s\n", static_cast<int>(text.size()), text.data());
}

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
  g_format = fmt;
  if (fmt == format::json) {
    auto f = std::make_unique<spdlog::pattern_formatter>();
    f->add_flag<json_message>('*').set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%f%z","level":"%l","pid":%P,"thread":%t,"msg":"%*"})");
    logger->set_formatter(std::move(f));
  } else {
    logger->set_pattern("%H:%M:%S.%e %^%L%$ [%P] %v");
  }
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return ok();
}
}  // namespace log

}  // namespace tessera
