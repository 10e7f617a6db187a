// /metrics: the node's status document and the HTTP gateway's counters in Prometheus' text
// exposition format (version 0.0.4). Pure: a status document in, text out — the names and what
// each means are listed in docs/HTTP.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace tessera::mesh::http {

/// What the gateway counts itself.
struct gateway_counters {
  /// (route, HTTP status) -> requests answered.
  std::map<std::pair<std::string, int>, std::uint64_t> requests;
  std::uint64_t in_flight = 0;        ///< API requests running now
  std::uint64_t streamed_tokens = 0;  ///< tokens sent over the API
  std::uint64_t disconnects = 0;      ///< streams whose HTTP client went away before the end
};

/// The process's own figures (Prometheus' standard process_* metrics), read from /proc.
struct process_facts {
  double resident_bytes = 0, virtual_bytes = 0, cpu_seconds = 0, start_time_seconds = 0;
  double open_fds = 0, max_fds = 0, threads = 0;
};
[[nodiscard]] process_facts read_process_facts();

/// Renders the metrics. `status` is the node's status document (mesh/runtime status_json); missing
/// sections are skipped, so a node that has no view yet still answers. Every series is this
/// peer's own (its links, its memory, the streams it served), so a sum over peers counts each
/// thing once.
[[nodiscard]] std::string render_metrics(const nlohmann::json& status,
                                         const gateway_counters& counters,
                                         const process_facts& process = {});

/// A label value escaped as the format requires (backslash, double quote, newline).
[[nodiscard]] std::string escape_label(std::string_view value);

}  // namespace tessera::mesh::http
