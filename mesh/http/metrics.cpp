#include "mesh/http/metrics.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace tessera::mesh::http {
namespace {

using json = nlohmann::json;

/// Writes one metric family: HELP and TYPE once, then each sample.
class family_writer {
 public:
  explicit family_writer(std::string& out) : out_(out) {}

  void family(std::string_view name, std::string_view type, std::string_view help) {
    name_ = name;
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(double value,
              std::initializer_list<std::pair<std::string_view, std::string>> l = {}) {
    sample_as(name_, value, l);
  }
  /// A sample under another name of the family (a histogram's _bucket, _sum, _count).
  void sample_as(std::string_view name, double value,
                 std::initializer_list<std::pair<std::string_view, std::string>> l = {}) {
    out_ += name;
    if (l.size() > 0) {
      out_ += '{';
      bool first = true;
      for (const auto& [k, v] : l) {
        if (!first) out_ += ',';
        first = false;
        out_ += fmt::format("{}=\"{}\"", k, escape_label(v));
      }
      out_ += '}';
    }
    out_ += fmt::format(" {}\n", value);
  }

 private:
  std::string& out_;
  std::string name_;
};

double num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void node_metrics(family_writer& w, const json& s) {
  if (!s.contains("node") || !s["node"].is_object()) return;
  const json& n = s["node"];
  w.family("tessera_node_info", "gauge", "This node: id, role and leader as labels (always 1).");
  w.sample(1, {{"node", text(n, "id")}, {"role", text(n, "role")}, {"leader", text(n, "leader")}});
  w.family("tessera_election_term", "gauge", "The election term this node is in.");
  w.sample(num(n, "term"));
  w.family("tessera_is_leader", "gauge", "1 when this node leads the mesh.");
  w.sample(text(n, "role") == "leader" ? 1 : 0);
  if (s.contains("stats") && s["stats"].is_object()) {
    w.family("tessera_leader_changes_total", "counter",
             "Leaders this node has seen elected since it started.");
    w.sample(num(s["stats"], "leader_changes"));
    w.family("tessera_control_dropped_events_total", "counter",
             "Control events dropped at the runtime's queue bound.");
    w.sample(num(s["stats"], "dropped_events"));
    w.family("tessera_control_undecodable_total", "counter",
             "Control messages that failed to decode.");
    w.sample(num(s["stats"], "undecodable"));
  }
  if (s.contains("control") && s["control"].is_object() && s["control"].contains("rejected") &&
      s["control"]["rejected"].is_object()) {
    w.family("tessera_control_frames_rejected_total", "counter",
             "Control-plane frames refused, by reason (oversized, truncated, bad_body, ...).");
    for (const auto& [reason, v] : s["control"]["rejected"].items())
      w.sample(v.is_number() ? v.get<double>() : 0.0, {{"reason", reason}});
    w.family("tessera_control_handshakes_refused_total", "counter",
             "Connections refused at the CURVE/ZAP handshake (not of this cluster).");
    w.sample(num(s["control"], "handshakes_refused"));
  }
}

void membership_metrics(family_writer& w, const json& s) {
  if (!s.contains("membership") || !s["membership"].is_array()) return;
  std::map<std::string, int> by_status{{"alive", 0}, {"suspect", 0}, {"dead", 0}, {"left", 0}};
  for (const auto& m : s["membership"])
    ++by_status[text(m, "status")];
  w.family("tessera_members", "gauge", "Members this node knows, by state (itself included).");
  for (const auto& [st, c] : by_status)
    w.sample(c, {{"state", st}});
}

void view_metrics(family_writer& w, const json& s) {
  if (!s.contains("view") || !s["view"].is_object()) return;
  const json& v = s["view"];
  // This peer's own links and memory only: every peer exports its own, so that a sum over the
  // peers' series counts each link and each member once.
  const std::string self = s.contains("node") && s["node"].is_object() ? text(s["node"], "id") : "";
  w.family("tessera_view_version", "gauge", "Version of the topology view in force.");
  w.sample(num(v["epoch"], "version"));
  if (v.contains("links") && v["links"].is_array()) {
    w.family("tessera_link_rtt_seconds", "gauge",
             "Control-plane round-trip time of each directed link from this node (through both "
             "nodes' loops).");
    for (const auto& l : v["links"])
      if (text(l, "from") == self)
        w.sample(
            num(l, "rtt_us") / 1e6,
            {{"from", text(l, "from")}, {"to", text(l, "to")}, {"backend", text(l, "backend")}});
    w.family("tessera_link_bandwidth_bytes_per_second", "gauge",
             "Measured bulk bandwidth of each directed link from this node.");
    for (const auto& l : v["links"])
      if (text(l, "from") == self)
        w.sample(
            num(l, "bandwidth_mbps") * 1e6,
            {{"from", text(l, "from")}, {"to", text(l, "to")}, {"backend", text(l, "backend")}});
    w.family("tessera_link_bulk_rtt_seconds", "gauge",
             "Small-message round trip of each directed bulk link from this node (what a "
             "tensor-parallel step pays per collective).");
    for (const auto& l : v["links"])
      if (text(l, "from") == self && num(l, "bulk_rtt_us") > 0)
        w.sample(
            num(l, "bulk_rtt_us") / 1e6,
            {{"from", text(l, "from")}, {"to", text(l, "to")}, {"backend", text(l, "backend")}});
  }
  if (v.contains("members") && v["members"].is_array()) {
    w.family("tessera_memory_free_bytes", "gauge", "Free memory this node reports to the planner.");
    for (const auto& m : v["members"])
      if (text(m, "id") == self) w.sample(num(m, "memory_free_mb") * 1024 * 1024);
  }
}

void histogram_metric(family_writer& w, std::string_view name, std::string_view help,
                      const json& stats, const char* which) {
  w.family(name, "histogram", help);
  for (const auto& [model, st] : stats.items()) {
    if (!st.contains(which) || !st[which].is_object()) continue;
    const json& h = st[which];
    const auto& bounds = h["bounds"];
    const auto& counts = h["counts"];
    double cumulative = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      cumulative += counts[i].get<double>();
      const std::string le =
          i < bounds.size() ? fmt::format("{}", bounds[i].get<double>()) : "+Inf";
      w.sample_as(fmt::format("{}_bucket", name), cumulative, {{"model", model}, {"le", le}});
    }
    w.sample_as(fmt::format("{}_sum", name), num(h, "sum"), {{"model", model}});
    w.sample_as(fmt::format("{}_count", name), num(h, "count"), {{"model", model}});
  }
}

// What this node measured of the streams it served (mesh/serving/stream_stats.hpp).
void stream_stat_metrics(family_writer& w, const json& e) {
  if (!e.contains("stream_stats") || !e["stream_stats"].is_object()) return;
  const json& st = e["stream_stats"];
  w.family(
      "tessera_prompt_tokens_total", "counter",
      "Prompt tokens of the streams this node accepted (resumed tokens not included), by model.");
  for (const auto& [model, m] : st.items())
    w.sample(num(m, "prompt_tokens"), {{"model", model}});
  w.family("tessera_generated_tokens_total", "counter", "Tokens this node generated, by model.");
  for (const auto& [model, m] : st.items())
    w.sample(num(m, "tokens"), {{"model", model}});
  w.family("tessera_streams_completed_total", "counter",
           "Streams this node took to their end (max_tokens, end of text, stop), by model.");
  for (const auto& [model, m] : st.items())
    w.sample(num(m, "streams"), {{"model", model}});
  histogram_metric(w, "tessera_time_to_first_token_seconds",
                   "From a stream's acceptance on this node (queueing included) to its first "
                   "token, by model.",
                   st, "first_token");
  histogram_metric(w, "tessera_time_between_tokens_seconds",
                   "Between two consecutive tokens of a stream on this node, by model.", st,
                   "token_gap");
  histogram_metric(w, "tessera_stream_duration_seconds",
                   "From a stream's acceptance on this node to its end, by model.", st, "duration");
}

void serving_metrics(family_writer& w, const json& s) {
  if (!s.contains("serving") || !s["serving"].is_object()) return;
  const json& e = s["serving"];
  w.family("tessera_requests_total", "counter",
           "Client requests this node took or answered, by outcome.");
  for (const char* k :
       {"accepted", "completed", "rejected", "superseded", "duplicates", "malformed", "cancelled"})
    w.sample(num(e, k), {{"outcome", k}});
  w.family("tessera_tokens_generated_total", "counter", "Tokens this node generated and streamed.");
  w.sample(num(e, "tokens"));
  w.family("tessera_forward_passes_total", "counter",
           "Forward passes over this node's local streams (continuous batching: one per round).");
  w.sample(num(e, "passes"));
  w.family("tessera_pass_streams_total", "counter",
           "Stream units those passes carried; divided by the passes, the mean batch.");
  w.sample(num(e, "pass_streams"));
  // Per model: streams running and queued, and the KV cache they hold (positions filled of those
  // allocated).
  struct model_streams {
    double running = 0, queued = 0, kv_used = 0, kv_allocated = 0;
  };
  std::map<std::string, model_streams> by_model;
  if (e.contains("stream_stats") && e["stream_stats"].is_object())
    for (const auto& [model, st] : e["stream_stats"].items())
      by_model[model];
  if (e.contains("streams") && e["streams"].is_array())
    for (const auto& st : e["streams"]) {
      auto& m = by_model[text(st, "model")];
      if (st.value("queued", false)) {
        m.queued += 1;
      } else {
        m.running += 1;
        m.kv_used += num(st, "prompt_tokens") + num(st, "tokens");
        m.kv_allocated += num(st, "context");
      }
    }
  w.family("tessera_streams", "gauge",
           "Streams on this node, by model: generating, or waiting for a slot.");
  for (const auto& [model, m] : by_model) {
    w.sample(m.running, {{"model", model}, {"state", "running"}});
    w.sample(m.queued, {{"model", model}, {"state", "queued"}});
  }
  w.family("tessera_kv_cache_tokens", "gauge",
           "KV-cache positions of this node's running streams, by model: filled, and allocated.");
  for (const auto& [model, m] : by_model) {
    w.sample(m.kv_used, {{"model", model}, {"of", "used"}});
    w.sample(m.kv_allocated, {{"model", model}, {"of", "allocated"}});
  }
  stream_stat_metrics(w, e);
  w.family("tessera_inbox_dropped_total", "counter",
           "Requests dropped at the engine's inbox bound (clients re-publish).");
  w.sample(num(e, "inbox_dropped"));
  // The client endpoints' bounds (mesh/serving/connection_guard.hpp, fair_share.hpp).
  if (e.contains("connections") && e["connections"].is_object()) {
    w.family("tessera_client_connections", "gauge",
             "Connections open on this node's client endpoints.");
    w.sample(num(e["connections"], "open"));
    w.family("tessera_client_connections_refused_total", "counter",
             "Client connections shut down on arrival: past the bound per source address or in "
             "all.");
    w.sample(num(e["connections"], "refused"));
  }
  if (e.contains("fair_share") && e["fair_share"].is_object()) {
    w.family("tessera_fair_share_total", "counter",
             "Streams of a client holding more than its share: waiting ones that made way for "
             "another client's request, running ones paused for another client's.");
    w.sample(num(e["fair_share"], "made_way"), {{"action", "made_way"}});
    w.sample(num(e["fair_share"], "preempted"), {{"action", "preempted"}});
  }
  // Model distribution: the parts this node fetches from holders, and what it served to others.
  if (e.contains("fetches") && e["fetches"].is_array() && !e["fetches"].empty()) {
    w.family("tessera_model_fetch_bytes", "gauge",
             "Bytes of a model's parts this node needs from holders, by model and done/total.");
    for (const auto& f : e["fetches"]) {
      w.sample(num(f, "bytes_done"), {{"model", text(f, "model")}, {"of", "done"}});
      w.sample(num(f, "bytes_total"), {{"model", text(f, "model")}, {"of", "total"}});
    }
    w.family("tessera_model_fetch_ready", "gauge",
             "1 when every part of the model this node needs is here and verified.");
    for (const auto& f : e["fetches"])
      w.sample(text(f, "state") == "ready" ? 1 : 0, {{"model", text(f, "model")}});
  }
  if (e.contains("share") && e["share"].is_object()) {
    w.family("tessera_model_share_bytes_total", "counter",
             "Model bytes this node sent to peers fetching them.");
    w.sample(num(e["share"], "bytes"));
  }
}

void fault_metrics(family_writer& w, const json& s) {
  if (!s.contains("faults") || !s["faults"].is_object()) return;
  const json& f = s["faults"];
  w.family("tessera_fault_partitions", "gauge", "Partition cuts in force on this node.");
  w.sample(f.contains("partitions") ? static_cast<double>(f["partitions"].size()) : 0);
  w.family("tessera_fault_rules", "gauge", "Link fault rules in force on this node.");
  w.sample(f.contains("rules") ? static_cast<double>(f["rules"].size()) : 0);
}

void gateway_metrics(family_writer& w, const gateway_counters& c) {
  w.family("tessera_http_requests_total", "counter",
           "HTTP requests answered, by route and status.");
  for (const auto& [k, v] : c.requests)
    w.sample(static_cast<double>(v), {{"route", k.first}, {"code", std::to_string(k.second)}});
  w.family("tessera_http_in_flight", "gauge", "API requests running now.");
  w.sample(static_cast<double>(c.in_flight));
  w.family("tessera_http_streamed_tokens_total", "counter", "Tokens sent to HTTP clients.");
  w.sample(static_cast<double>(c.streamed_tokens));
  w.family("tessera_http_disconnects_total", "counter",
           "Streams whose HTTP client went away before the end.");
  w.sample(static_cast<double>(c.disconnects));
}

void process_metrics(family_writer& w, const process_facts& p) {
  w.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
  w.sample(p.resident_bytes);
  w.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
  w.sample(p.virtual_bytes);
  w.family("process_cpu_seconds_total", "counter", "User and system CPU time spent in seconds.");
  w.sample(p.cpu_seconds);
  w.family("process_start_time_seconds", "gauge",
           "Start time of the process since the Unix epoch in seconds.");
  w.sample(p.start_time_seconds);
  w.family("process_open_fds", "gauge", "Number of open file descriptors.");
  w.sample(p.open_fds);
  w.family("process_max_fds", "gauge", "Maximum number of open file descriptors.");
  w.sample(p.max_fds);
  w.family("process_threads", "gauge", "Number of OS threads in the process.");
  w.sample(p.threads);
  w.family("tessera_build_info", "gauge", "The running build: version and compiler (always 1).");
  w.sample(1, {{"version", TESSERA_VERSION}, {"compiler", __VERSION__}});
}

}  // namespace

process_facts read_process_facts() {
  process_facts p;
  // /proc/self/stat: fields after the command's closing parenthesis (proc(5)).
  std::ifstream stat("/proc/self/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  if (close != std::string::npos) {
    std::istringstream in(line.substr(close + 2));
    std::vector<std::string> f{std::istream_iterator<std::string>(in), {}};
    // f[0] is field 3 (state): utime 14, stime 15, num_threads 20, starttime 22, vsize 23, rss 24.
    const auto field = [&](std::size_t n) { return n - 3 < f.size() ? std::stod(f[n - 3]) : 0.0; };
    const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
    p.cpu_seconds = (field(14) + field(15)) / tick;
    p.threads = field(20);
    p.virtual_bytes = field(23);
    p.resident_bytes = field(24) * page;
    std::ifstream up("/proc/stat");
    std::string key;
    double btime = 0;
    while (up >> key) {
      if (key == "btime") {
        up >> btime;
        break;
      }
      up.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    p.start_time_seconds = btime + field(22) / tick;
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    p.open_fds += 1;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) p.max_fds = static_cast<double>(rl.rlim_cur);
  return p;
}

std::string escape_label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char ch : value) {
    if (ch == '\\')
      out += "\\\\";
    else if (ch == '"')
      out += "\\\"";
    else if (ch == '\n')
      out += "\\n";
    else
      out += ch;
  }
  return out;
}

std::string render_metrics(const json& status, const gateway_counters& counters,
                           const process_facts& process) {
  std::string out;
  family_writer w(out);
  if (status.is_object()) {
    node_metrics(w, status);
    membership_metrics(w, status);
    view_metrics(w, status);
    serving_metrics(w, status);
    fault_metrics(w, status);
  }
  gateway_metrics(w, counters);
  process_metrics(w, process);
  return out;
}

}  // namespace tessera::mesh::http
