// A progress bar on stderr for long work (loading a model): drawn only when stderr is a terminal,
// so logs, pipes and CI output never see carriage returns; redrawn at most 10 times a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tessera::cli {

/// One line: "label  [#####.....]  45%  120.0/266.0 MiB  450 MiB/s". `width`: the bar's cells.
[[nodiscard]] std::string render_progress(std::string_view label, std::uint64_t done_bytes,
                                          std::uint64_t total_bytes, double elapsed_s,
                                          int width = 30);

class progress_bar {
 public:
  /// Draws on `out` when it is a terminal (and TERM is not "dumb"); otherwise does nothing.
  explicit progress_bar(std::string label, std::FILE* out = stderr);
  ~progress_bar();
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;

  void update(std::uint64_t done_bytes, std::uint64_t total_bytes);
  /// Ends the line (when anything was drawn). Called by the destructor too.
  void finish();
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

 private:
  std::string label_;
  std::FILE* out_;
  bool enabled_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace tessera::cli
