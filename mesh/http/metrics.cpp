#include "mesh/http/metrics.hpp"

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
    out_ += name_;
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
  w.family("tessera_view_version", "gauge", "Version of the topology view in force.");
  w.sample(num(v["epoch"], "version"));
  if (v.contains("links") && v["links"].is_array()) {
    w.family("tessera_link_rtt_seconds", "gauge",
             "Measured round-trip time of each directed link.");
    for (const auto& l : v["links"])
      w.sample(num(l, "rtt_us") / 1e6,
               {{"from", text(l, "from")}, {"to", text(l, "to")}, {"backend", text(l, "backend")}});
    w.family("tessera_link_bandwidth_bytes_per_second", "gauge",
             "Measured bulk bandwidth of each directed link.");
    for (const auto& l : v["links"])
      w.sample(num(l, "bandwidth_mbps") * 1e6 / 8,
               {{"from", text(l, "from")}, {"to", text(l, "to")}, {"backend", text(l, "backend")}});
  }
  if (v.contains("members") && v["members"].is_array()) {
    w.family("tessera_member_memory_free_bytes", "gauge", "Free memory each member reports.");
    for (const auto& m : v["members"])
      w.sample(num(m, "memory_free_mb") * 1024 * 1024, {{"node", text(m, "id")}});
  }
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
  std::size_t running = 0, queued = 0;
  if (e.contains("streams") && e["streams"].is_array())
    for (const auto& st : e["streams"])
      (st.value("queued", false) ? queued : running) += 1;
  w.family("tessera_streams", "gauge", "Streams on this node: generating, or waiting for a slot.");
  w.sample(static_cast<double>(running), {{"state", "running"}});
  w.sample(static_cast<double>(queued), {{"state", "queued"}});
  w.family("tessera_inbox_dropped_total", "counter",
           "Requests dropped at the engine's inbox bound (clients re-publish).");
  w.sample(num(e, "inbox_dropped"));
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

}  // namespace

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

std::string render_metrics(const json& status, const gateway_counters& counters) {
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
  return out;
}

}  // namespace tessera::mesh::http
