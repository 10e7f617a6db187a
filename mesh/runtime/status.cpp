// The status protocol for operators: one request, one reply (query_status, over a status_client),
// and the status document rendered as a table (format_status).
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "actors/base/msgpack_bounded.hpp"
#include "mesh/discovery/peer_hint.hpp"
#include "mesh/runtime/runtime.hpp"
#include "mesh/runtime/status_client.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::mesh::runtime {

namespace ctl = transport::control;

result<std::string> query_status(const std::string& endpoint_text, const std::string& key_file,
                                 std::uint32_t timeout_ms,
                                 const std::vector<std::string>& fault_commands) {
  std::string text = endpoint_text;
  if (text.rfind("tcp://", 0) == 0) text = text.substr(6);
  auto ep = parse_endpoint(text);
  if (!ep) return make_error(errc::invalid_argument, "--connect: {}", ep.error().message);

  std::optional<std::string> file;
  if (!key_file.empty()) file = key_file;
  auto secret = ctl::load_cluster_secret(file);
  if (!secret) {
    if (secret.error().code == errc::not_found)
      return make_error(errc::unauthorized, "no cluster secret: pass --cluster-key FILE or set {}",
                        ctl::kClusterKeyEnv);
    return secret.error();
  }
  auto keys = ctl::derive_cluster_keys(*secret);
  if (!keys) return keys.error();
  auto local = local_address_towards(ep->host, ep->port);
  if (!local) return local.error();

  std::mutex mu;
  std::condition_variable cv;
  std::optional<std::string> reply;
  status_client_options so;
  so.keys = *keys;
  so.bind_address = *local;
  so.id_seed = std::random_device{}();
  so.id_seed = (so.id_seed << 32) ^ std::random_device{}();
  auto client = status_client::start(std::move(so), [&](const std::string&, std::string doc) {
    std::lock_guard lock(mu);
    if (!reply) reply = std::move(doc);
    cv.notify_all();
  });
  if (!client) return client.error();
  TESSERA_TRY((*client)->ask(ep->to_string(), fault_commands));
  std::unique_lock lock(mu);
  cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return reply.has_value(); });
  std::optional<std::string> got = reply;
  lock.unlock();
  const auto refused = (*client)->handshakes_refused();
  (*client)->stop();
  if (!got) {
    if (refused > 0)
      return make_error(errc::unauthorized,
                        "the node at {} refused our cluster key (not the same cluster secret)",
                        ep->to_string());
    return make_error(errc::timeout, "no tessera node answered at {} within {} ms", ep->to_string(),
                      timeout_ms);
  }
  return *got;
}

namespace {

/// A node or member id as a table shows it: its first 12 hex digits ("-" for none).
std::string short_id(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  return v.get<std::string>().substr(0, 12);
}

/// The node's lines: id, endpoint, role, term, address, leader.
void format_node(const nlohmann::json& j, std::string& out) {
  const auto& n = j.at("node");
  out += fmt::format("node    {}  {}  role {}  term {}\n", n.at("id").get<std::string>(),
                     n.at("endpoint").get<std::string>(), n.at("role").get<std::string>(),
                     n.at("term").get<std::uint64_t>());
  if (n.contains("advertise") && n["advertise"].is_object()) {
    out += fmt::format("address {}  ({})\n", n["advertise"].value("address", "?"),
                       n["advertise"].value("source", "?"));
  }
  out += fmt::format("leader  {}\n", n.at("leader").is_null() ? std::string("none")
                                                              : n.at("leader").get<std::string>());
}

/// The leader's view: members, their RDMA ports, links.
void format_view(const nlohmann::json& j, std::string& out) {
  const auto& v = j.at("view");
  if (v.is_null()) {
    out += "view    none yet (no leader has published one to this node)\n";
  } else {
    out += fmt::format("view    epoch {}.{}  leader {}\n\n",
                       v.at("epoch").at("term").get<std::uint64_t>(),
                       v.at("epoch").at("version").get<std::uint64_t>(), short_id(v.at("leader")));
    out += fmt::format("{:<14} {:<8} {:<24} {:>5} {:>10} {:>10} {:<5} {}\n", "MEMBER", "STATE",
                       "ADDRESS", "CORES", "MEM MB", "FREE MB", "RDMA", "MODELS");
    for (const auto& m : v.at("members")) {
      std::string models;
      for (const auto& x : m.at("models"))
        models += (models.empty() ? "" : ",") + x.get<std::string>();
      out += fmt::format(
          "{:<14} {:<8} {:<24} {:>5} {:>10} {:>10} {:<5} {}\n", short_id(m.at("id")),
          m.at("status").get<std::string>(), m.at("address").get<std::string>(),
          m.at("cores").get<std::uint32_t>(), m.at("memory_total_mb").get<std::uint64_t>(),
          m.at("memory_free_mb").get<std::uint64_t>(), m.at("has_rdma").get<bool>() ? "yes" : "no",
          models.empty() ? "-" : models);
    }
    // RDMA ports and the GIDs links use, where a member has any.
    for (const auto& m : v.at("members"))
      if (m.contains("rdma_devices") && m["rdma_devices"].is_array())
        for (const auto& d : m["rdma_devices"])
          if (d.is_string())
            out += fmt::format("{:<14} rdma port {}\n", short_id(m.at("id")), d.get<std::string>());
    out += fmt::format("\n{:<14} {:<14} {:>12} {:>10} {:>14} {}\n", "FROM", "TO", "BULK RTT us",
                       "BW MB/s", "CONTROL RTT us", "BACKEND");
    for (const auto& l : v.at("links")) {
      const auto rtt = l.at("rtt_us").get<std::uint64_t>();
      const auto bw = l.at("bandwidth_mbps").get<double>();
      const double bulk = l.value("bulk_rtt_us", 0.0);  // older peers send none
      out += fmt::format(
          "{:<14} {:<14} {:>12} {:>10} {:>14} {}\n", short_id(l.at("from")), short_id(l.at("to")),
          bulk == 0 ? std::string("-") : fmt::format("{:.2f}", bulk),
          bw == 0 ? std::string("-") : fmt::format("{:.0f}", bw),
          rtt == 0 ? std::string("-") : std::to_string(rtt), l.at("backend").get<std::string>());
    }
  }
}

/// The plan: each model's groups (and their experts).
void format_plan(const nlohmann::json& j, std::string& out) {
  // Older peers send no plan / serving section: print what is there.
  if (j.contains("plan") && !j.at("plan").is_null()) {
    const auto& p = j.at("plan");
    out += fmt::format("\nplan    epoch {}.{}\n", p.at("epoch").at("term").get<std::uint64_t>(),
                       p.at("epoch").at("version").get<std::uint64_t>());
    for (const auto& m : p.at("models")) {
      std::string groups;
      for (const auto& g : m.at("groups")) {
        std::string ranks;
        for (const auto& r : g) {
          if (!ranks.empty()) ranks += '+';
          ranks += short_id(r.at("node"));
          // Expert parallelism: the rank's experts (when the group splits them).
          if (r.contains("experts") && g.size() > 1)
            ranks += fmt::format(" experts {}-{}", r.at("experts")[0].get<std::uint32_t>(),
                                 r.at("experts")[1].get<std::uint32_t>() - 1);
        }
        groups += " [" + ranks + "]";
      }
      out += fmt::format("  {:<20} {}\n", m.at("name").get<std::string>(),
                         m.at("no_capacity").is_null()
                             ? fmt::format("{} group(s):{}", m.at("groups").size(), groups)
                             : "no capacity: " + m.at("no_capacity").get<std::string>());
    }
  } else if (j.contains("plan")) {
    out += "\nplan    none yet\n";
  }
}

/// Serving: models, client ports and counters, client authentication and bounds, fetches,
/// experts' load, shares.
void format_serving(const nlohmann::json& s, std::string& out) {
  std::string models;
  for (const auto& m : s.at("models")) {
    if (!models.empty()) models += ", ";
    models += m.at("name").get<std::string>();
    // Whole-model weights: held for a replica here, loading (with progress), or not held.
    const std::string w = m.value("weights", "");
    if (w == "loading") {
      const auto total = m.value("weights_bytes", std::uint64_t{0});
      const auto done = m.value("weights_loaded_bytes", std::uint64_t{0});
      models += fmt::format(" (loading {}%)", total == 0 ? 0 : done * 100 / total);
    } else if (w == "ready") {
      models += " (replica loaded)";
    } else if (w == "failed") {
      models += " (did not load)";
    }
  }
  // Continuous batching: stream units per forward pass so far (older peers send no counters).
  const auto passes = s.value("passes", std::uint64_t{0});
  const std::string batch =
      passes == 0
          ? std::string("-")
          : fmt::format("{:.2f}", static_cast<double>(s.value("pass_streams", std::uint64_t{0})) /
                                      static_cast<double>(passes));
  out += fmt::format(
      "serving models {}  client ports {}/{}  streams {}  accepted {}  completed {}  "
      "tokens {}  rejected {}  malformed {}  mean batch {}\n",
      models.empty() ? "-" : models, s.at("request_port").get<int>(),
      s.at("response_port").get<int>(), s.at("streams").size(),
      s.at("accepted").get<std::uint64_t>(), s.at("completed").get<std::uint64_t>(),
      s.at("tokens").get<std::uint64_t>(), s.at("rejected").get<std::uint64_t>(),
      s.at("malformed").get<std::uint64_t>(), batch);
  // Client authentication (older peers send nothing: shown as open).
  if (const auto auth = s.value("client_auth", nlohmann::json::object());
      auth.value("required", false)) {
    out += fmt::format("clients authenticated (--client-auth): admitted {}  refused {}\n",
                       auth.value("admitted", std::uint64_t{0}),
                       auth.value("refused", std::uint64_t{0}));
  } else {
    out += "clients open (no --client-auth): anyone reaching the client ports may ask\n";
  }
  // The client ports' bounds and the fair share among clients (older peers send neither).
  if (const auto c = s.value("connections", nlohmann::json::object()); !c.empty()) {
    const auto fair = s.value("fair_share", nlohmann::json::object());
    out += fmt::format(
        "clients connections {} open (bound {}, {} per address)  refused {}  fair share: "
        "{} paused, {} made way\n",
        c.value("open", std::uint64_t{0}), c.value("bound", std::uint64_t{0}),
        c.value("per_address_bound", std::uint64_t{0}), c.value("refused", std::uint64_t{0}),
        fair.value("preempted", std::uint64_t{0}), fair.value("made_way", std::uint64_t{0}));
  }
  // Model distribution: what this peer fetches from holders, and what it served to others.
  for (const auto& f : s.value("fetches", nlohmann::json::array())) {
    const auto total = f.value("bytes_total", std::uint64_t{0});
    const auto done = f.value("bytes_done", std::uint64_t{0});
    const std::string st = f.value("state", "");
    out += fmt::format("fetch   {:<20} {} {}/{} MiB ({}%){}{}\n", f.value("model", ""), st,
                       done >> 20, total >> 20, total == 0 ? 0 : done * 100 / total,
                       f.value("from", "").empty() ? "" : " from " + f.value("from", ""),
                       st == "failed" ? ": " + f.value("error", "") : "");
  }
  // Mixtures of experts: the rows routed to each expert this peer holds (its observed load).
  auto experts_line = [&](const std::string& what, const nlohmann::json& e) {
    std::string load;
    for (const auto& rows : e.at("load"))
      load += fmt::format(" {}", rows.get<std::uint64_t>());
    out +=
        fmt::format("experts {:<20} from {}:{}\n", what, e.at("first").get<std::int64_t>(), load);
  };
  for (const auto& g : s.value("groups", nlohmann::json::array()))
    if (g.contains("experts")) experts_line(g.value("key", ""), g.at("experts"));
  for (const auto& r : s.value("replicas", nlohmann::json::array()))
    if (r.contains("experts")) experts_line(r.value("model", ""), r.at("experts"));
  if (s.contains("share") && s.at("share").value("sessions", std::uint64_t{0}) > 0)
    out += fmt::format("shared  {} fetch(es) served, {} MiB in {} chunks\n",
                       s.at("share").value("sessions", std::uint64_t{0}),
                       s.at("share").value("bytes", std::uint64_t{0}) >> 20,
                       s.at("share").value("chunks", std::uint64_t{0}));
}

}  // namespace

result<std::string> format_status(const std::string& json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    return make_error(errc::corrupt, "status reply is not JSON: {}", e.what());
  }
  try {
    std::string out;
    format_node(j, out);
    format_view(j, out);
    format_plan(j, out);
    if (j.contains("serving") && !j.at("serving").is_null()) format_serving(j.at("serving"), out);
    return out;
  } catch (const std::exception& e) {
    return make_error(errc::corrupt, "status reply lacks a field: {}", e.what());
  }
}

}  // namespace tessera::mesh::runtime
