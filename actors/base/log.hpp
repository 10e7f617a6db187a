// Logging: spdlog behind one set-up call so every binary logs the same way.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

#include "actors/base/result.hpp"

namespace tessera::log {

enum class format { text, json };

/// Configures the default logger once per process: level ("trace".."off") and line format.
/// Logs go to stderr so that stdout stays clean for data (`--json` outputs, streamed tokens).
[[nodiscard]] result<void> init(std::string_view level, format fmt = format::text);

}  // namespace tessera::log
