#include "cli/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace tessera::cli {

std::string render_progress(std::string_view label, std::uint64_t done, std::uint64_t total,
                            double elapsed_s, int width) {
  const double frac =
      total == 0 ? 1.0
                 : std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
  const int full = static_cast<int>(frac * width + 0.5);
  const double mib = 1024.0 * 1024.0;
  std::string out =
      fmt::format("{}  [{}{}]  {:3.0f}%  {:.1f}/{:.1f} MiB", label,
                  std::string(static_cast<std::size_t>(full), '#'),
                  std::string(static_cast<std::size_t>(width - full), '.'), frac * 100.0,
                  static_cast<double>(done) / mib, static_cast<double>(total) / mib);
  if (elapsed_s > 0.05)
    out += fmt::format("  {:.0f} MiB/s", static_cast<double>(done) / mib / elapsed_s);
  return out;
}

progress_bar::progress_bar(std::string label, std::FILE* out)
    : label_(std::move(label)), out_(out), start_(std::chrono::steady_clock::now()), last_(start_) {
  const char* term = std::getenv("TERM");
  enabled_ = out_ != nullptr && ::isatty(::fileno(out_)) == 1 &&
             !(term != nullptr && std::strcmp(term, "dumb") == 0);
}

progress_bar::~progress_bar() {
  finish();
}

void progress_bar::update(std::uint64_t done, std::uint64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  // Redraw at most every 100 ms, but always the last step (the bar must end at 100 %).
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double s = std::chrono::duration<double>(now - start_).count();
  // \r back to the line's start, \x1b[K clears what a longer previous line left.
  std::fprintf(out_, "\r%s\x1b[K", render_progress(label_, done, total, s).c_str());
  std::fflush(out_);
  drawn_ = true;
}

void progress_bar::finish() {
  if (!drawn_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace tessera::cli
