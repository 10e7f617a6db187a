// Logging: spdlog behind one set-up call so every binary logs the same way.
#pragma once

#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "actors/base/result.hpp"

namespace tessera::log {

enum class format { text, json };

/// Configures the default logger once per process: level ("trace".."off") and line format.
/// Logs go to stderr so that stdout stays clean for data (`--json` outputs, streamed tokens).
/// In json format every line is one JSON object, the message escaped.
[[nodiscard]] result<void> init(std::string_view level, format fmt = format::text);

/// What init() set last: the line format, and the level's name.
[[nodiscard]] format current_format() noexcept;
[[nodiscard]] std::string current_level();

/// A command's own message for its user on stderr ("tessera node: listening on ..."): as it is
/// in text format, a log line (one JSON object) in json format, so that the stream stays
/// machine-readable. `error` picks the level.
void say(std::string_view text, bool error = false);
/// say() with a printf format (one trailing newline of the text is dropped: say adds its own).
void sayf(bool error, const char* format, ...) __attribute__((format(printf, 2, 3)));

/// `text` as the inside of a JSON string (quotes, backslashes and control characters escaped, the
/// short forms where JSON has them, as Python's json.dumps writes them; other bytes, UTF-8 or
/// not, pass as they are). Also a valid TOML basic string's inside but for DEL (0x7f).
[[nodiscard]] std::string json_escape(std::string_view text);

}  // namespace tessera::log
