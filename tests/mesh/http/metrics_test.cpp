// /metrics: the text is Prometheus' exposition format (every sample belongs to a family declared
// by HELP and TYPE, label values escaped) and the numbers are the status document's.
#include "mesh/http/metrics.hpp"

#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

namespace tessera::mesh::http {
namespace {

using json = nlohmann::json;

json sample_status() {
  return json::parse(R"({
    "node": {"id": "aa", "role": "leader", "term": 7, "leader": "aa"},
    "membership": [{"id": "aa", "status": "alive"}, {"id": "bb", "status": "suspect"}],
    "view": {"epoch": {"term": 7, "version": 3},
             "members": [{"id": "aa", "memory_free_mb": 2}, {"id": "bb", "memory_free_mb": 9}],
             "links": [{"from": "aa", "to": "b\"b", "rtt_us": 250, "bandwidth_mbps": 8000,
                        "bulk_rtt_us": 1.5, "backend": "shm"},
                       {"from": "bb", "to": "aa", "rtt_us": 300, "bandwidth_mbps": 8000,
                        "backend": "shm"}]},
    "serving": {"accepted": 5, "completed": 4, "rejected": 1, "tokens": 99, "passes": 30,
                "pass_streams": 75,
                "fetches": [{"model": "big", "state": "fetching", "bytes_done": 1024,
                             "bytes_total": 4096}],
                "share": {"sessions": 1, "bytes": 8192},
                "streams": [{"id": "r1", "model": "tiny", "prompt_tokens": 10, "tokens": 5,
                             "context": 128},
                            {"id": "r2", "model": "tiny", "queued": true}],
                "stream_stats": {"tiny": {"prompt_tokens": 40, "tokens": 99, "streams": 4,
                  "first_token": {"bounds": [0.1, 1], "counts": [1, 2, 1], "sum": 2.5, "count": 4},
                  "token_gap": {"bounds": [0.01], "counts": [90, 5], "sum": 0.7, "count": 95},
                  "duration": {"bounds": [10], "counts": [4, 0], "sum": 8, "count": 4}}}},
    "faults": {"partitions": [{}], "rules": []},
    "stats": {"leader_changes": 2, "dropped_events": 0, "undecodable": 0},
    "control": {"frames_received": 10, "rejected": {"oversized": 4, "bad_body": 0},
                "handshakes_refused": 1}
  })");
}

/// Checks one sample line against the format's grammar: name, optional {k="v",...} (values
/// escaped), a space, a value. Returns the line without its value, or "" when malformed. (Hand
/// written: std::regex trips GCC 12's -Wmaybe-uninitialized in sanitizer builds.)
std::string sample_key(const std::string& line) {
  const auto is_name = [](char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  std::size_t i = 0;
  while (i < line.size() && is_name(line[i], i == 0))
    ++i;
  if (i == 0) return "";
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const std::size_t k = i;
      while (i < line.size() &&
             (std::islower(static_cast<unsigned char>(line[i])) || line[i] == '_'))
        ++i;
      if (i == k || line.compare(i, 2, "=\"") != 0) return "";
      i += 2;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\') {
          if (i + 1 >= line.size() || std::string("\\\"n").find(line[i + 1]) == std::string::npos)
            return "";
          ++i;
        }
        ++i;
      }
      if (i >= line.size()) return "";
      ++i;  // closing quote
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return "";
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ' || i + 1 >= line.size()) return "";
  for (std::size_t v = i + 1; v < line.size(); ++v)
    if (std::isspace(static_cast<unsigned char>(line[v]))) return "";
  return line.substr(0, i);
}

/// Parses the exposition text: sample (name and labels) -> value; checks the grammar on the way.
std::map<std::string, std::string> parse(const std::string& text) {
  std::map<std::string, std::string> out;
  std::set<std::string> typed;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << line;
      typed.insert(type == "histogram" ? name + " histogram" : name);
      continue;
    }
    const std::string key = sample_key(line);
    EXPECT_FALSE(key.empty()) << "not a sample: " << line;
    if (key.empty()) continue;
    const std::string name = key.substr(0, key.find('{'));
    // A histogram's samples carry its name with _bucket, _sum or _count.
    bool of_histogram = false;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (name.ends_with(suffix) &&
          typed.count(name.substr(0, name.size() - std::string_view(suffix).size()) + " histogram"))
        of_histogram = true;
    EXPECT_TRUE(typed.count(name) || of_histogram) << "sample before its TYPE: " << line;
    out.emplace(key, line.substr(key.size() + 1));
  }
  return out;
}

TEST(Metrics, TheTextParsesAndCarriesTheStatusNumbers) {
  gateway_counters c;
  c.requests[{"/v1/completions", 200}] = 3;
  c.streamed_tokens = 12;
  const auto samples = parse(render_metrics(sample_status(), c));
  const auto value = [&](const std::string& key) {
    auto it = samples.find(key);
    return it == samples.end() ? std::string("<missing>") : it->second;
  };
  EXPECT_EQ(value("tessera_election_term"), "7");
  EXPECT_EQ(value("tessera_is_leader"), "1");
  EXPECT_EQ(value("tessera_leader_changes_total"), "2");
  EXPECT_EQ(value(R"(tessera_members{state="suspect"})"), "1");
  EXPECT_EQ(value(R"(tessera_requests_total{outcome="completed"})"), "4");
  EXPECT_EQ(value("tessera_tokens_generated_total"), "99");
  EXPECT_EQ(value("tessera_forward_passes_total"), "30");
  EXPECT_EQ(value("tessera_pass_streams_total"), "75");
  EXPECT_EQ(value(R"(tessera_model_fetch_bytes{model="big",of="done"})"), "1024");
  EXPECT_EQ(value(R"(tessera_model_fetch_bytes{model="big",of="total"})"), "4096");
  EXPECT_EQ(value(R"(tessera_model_fetch_ready{model="big"})"), "0");
  EXPECT_EQ(value("tessera_model_share_bytes_total"), "8192");
  EXPECT_EQ(value(R"(tessera_streams{model="tiny",state="queued"})"), "1");
  EXPECT_EQ(value(R"(tessera_kv_cache_tokens{model="tiny",of="used"})"), "15");
  EXPECT_EQ(value(R"(tessera_kv_cache_tokens{model="tiny",of="allocated"})"), "128");
  EXPECT_EQ(value(R"(tessera_link_rtt_seconds{from="aa",to="b\"b",backend="shm"})"), "0.00025");
  // MB/s in the document, bytes per second in the series; the bulk link's own round trip.
  EXPECT_EQ(value(R"(tessera_link_bandwidth_bytes_per_second{from="aa",to="b\"b",backend="shm"})"),
            "8000000000");
  EXPECT_EQ(value(R"(tessera_link_bulk_rtt_seconds{from="aa",to="b\"b",backend="shm"})"),
            "1.5e-06");
  // Only this node's own links and memory: a sum over the peers' series counts each once.
  EXPECT_EQ(value(R"(tessera_link_rtt_seconds{from="bb",to="aa",backend="shm"})"), "<missing>");
  EXPECT_EQ(value("tessera_memory_free_bytes"), "2097152");
  EXPECT_EQ(value(R"(tessera_prompt_tokens_total{model="tiny"})"), "40");
  EXPECT_EQ(value(R"(tessera_generated_tokens_total{model="tiny"})"), "99");
  // Histogram buckets are cumulative, +Inf equals the count.
  EXPECT_EQ(value(R"(tessera_time_to_first_token_seconds_bucket{model="tiny",le="0.1"})"), "1");
  EXPECT_EQ(value(R"(tessera_time_to_first_token_seconds_bucket{model="tiny",le="1"})"), "3");
  EXPECT_EQ(value(R"(tessera_time_to_first_token_seconds_bucket{model="tiny",le="+Inf"})"), "4");
  EXPECT_EQ(value(R"(tessera_time_to_first_token_seconds_count{model="tiny"})"), "4");
  EXPECT_EQ(value(R"(tessera_time_between_tokens_seconds_sum{model="tiny"})"), "0.7");
  EXPECT_EQ(value(R"(tessera_stream_duration_seconds_bucket{model="tiny",le="+Inf"})"), "4");
  EXPECT_EQ(value("tessera_fault_partitions"), "1");
  EXPECT_EQ(value(R"(tessera_control_frames_rejected_total{reason="oversized"})"), "4");
  EXPECT_EQ(value("tessera_control_handshakes_refused_total"), "1");
  EXPECT_EQ(value(R"(tessera_http_requests_total{route="/v1/completions",code="200"})"), "3");
  EXPECT_EQ(value("tessera_http_streamed_tokens_total"), "12");
}

TEST(Metrics, TheProcessAndTheBuildAreDescribed) {
  const auto p = read_process_facts();
  EXPECT_GT(p.resident_bytes, 1e6);
  EXPECT_GT(p.open_fds, 2);
  EXPECT_GT(p.threads, 0);
  EXPECT_GT(p.start_time_seconds, 1.6e9);
  const std::string text = render_metrics(nullptr, {}, p);
  const auto samples = parse(text);
  EXPECT_EQ(samples.count("process_resident_memory_bytes"), 1u);
  EXPECT_EQ(samples.count("process_cpu_seconds_total"), 1u);
  EXPECT_NE(text.find("tessera_build_info{version=\""), std::string::npos) << text;
}

TEST(Metrics, ANodeWithoutStatusStillAnswers) {
  const auto samples = parse(render_metrics(nullptr, {}));
  EXPECT_EQ(samples.count("tessera_http_in_flight"), 1u);
  EXPECT_EQ(samples.count("tessera_election_term"), 0u);
  EXPECT_EQ(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
}

}  // namespace
}  // namespace tessera::mesh::http
