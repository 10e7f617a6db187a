// What a peer measured of the streams it served, per model, for /metrics: time to first token,
// time between tokens and stream duration as histograms with fixed buckets (Prometheus'
// cumulative form is made when rendering), prompt and generated token counts. The engine thread
// observes; the status reader copies under the same mutex. Every bound is fixed: a handful of
// buckets per model, one entry per model this peer serves.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera::mesh::serving {

/// Counts of observations at most each bound (not cumulative: one bucket each, plus +Inf).
template <std::size_t N>
struct histogram {
  std::array<std::uint64_t, N + 1> counts{};  ///< [i] <= bounds[i]; [N]: above every bound
  double sum = 0;
  std::uint64_t count = 0;
  void observe(std::span<const double, N> bounds, double v) {
    std::size_t i = 0;
    while (i < N && v > bounds[i])
      ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

inline constexpr std::array<double, 12> kFirstTokenBounds{0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                          1,    2.5,   5,    10,  30,   60};
inline constexpr std::array<double, 11> kTokenGapBounds{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                        0.1,   0.25,   0.5,   1,    2.5};
inline constexpr std::array<double, 11> kDurationBounds{0.1, 0.25, 0.5, 1,   2.5, 5,
                                                        10,  30,   60,  120, 300};

class stream_stats {
 public:
  /// A stream was accepted with `prompt_tokens` to read.
  void accepted(const std::string& model, std::uint64_t prompt_tokens);
  /// A token was sent: the first of this attempt after `since_start` seconds, else `since_last`
  /// after the one before.
  void token(const std::string& model, bool first, double seconds);
  /// A stream ended (done, or cut by an error) after `seconds` since it was accepted.
  void finished(const std::string& model, double seconds);
  /// {"model": {"prompt_tokens", "tokens", "streams", "first_token": {...}, ...}}: each histogram
  /// as {"bounds", "counts" (not cumulative, +Inf last), "sum", "count"}.
  [[nodiscard]] nlohmann::json to_json() const;

 private:
  struct per_model {
    std::uint64_t prompt_tokens = 0, tokens = 0, streams = 0;
    histogram<kFirstTokenBounds.size()> first_token;
    histogram<kTokenGapBounds.size()> token_gap;
    histogram<kDurationBounds.size()> duration;
  };
  static constexpr std::size_t kMaxModels = 64;  ///< a peer serves a few; beyond: not recorded
  per_model* find(const std::string& model);
  mutable std::mutex mu_;
  std::map<std::string, per_model> models_;
};

}  // namespace tessera::mesh::serving
