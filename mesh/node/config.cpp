#include "mesh/node/config.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <set>

#include <toml++/toml.h>

#include "actors/base/log.hpp"
#include "mesh/discovery/peer_hint.hpp"
#include "mesh/node/advertise.hpp"
#include "mesh/node/config_keys.hpp"

namespace tessera::mesh {

std::string default_data_dir() {
  if (::geteuid() == 0) return "/var/lib/tessera";
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/tessera";  // XDG: absolute only
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.local/share/tessera";
  return "/var/lib/tessera";
}
namespace {

using detail::key_spec;
using detail::value_kind;

result<void> check_seed(std::string_view text) {
  auto e = parse_endpoint(text);
  if (!e) return std::move(e).error();
  return ok();
}

/// A browser origin the HTTP API answers (CORS): "*" or scheme://host[:port], nothing more.
result<void> check_origin(std::string_view text) {
  if (text == "*") return ok();
  const auto scheme = text.find("://");
  const bool ok_scheme = scheme != std::string_view::npos &&
                         (text.substr(0, scheme) == "http" || text.substr(0, scheme) == "https");
  const auto rest = ok_scheme ? text.substr(scheme + 3) : std::string_view{};
  if (!ok_scheme || rest.empty() || rest.find_first_of("/?# ,") != std::string_view::npos)
    return make_error(errc::invalid_argument,
                      "'{}' is not an origin (\"*\" or scheme://host[:port], e.g. "
                      "http://localhost:3000)",
                      text);
  return ok();
}

result<void> check_ipv4(std::string_view text) {
  in_addr addr{};
  if (::inet_pton(AF_INET, std::string(text).c_str(), &addr) != 1) {
    return make_error(errc::invalid_argument, "'{}' is not an IPv4 address", text);
  }
  return ok();
}

/// Empty (choose), a numeric IPv4 address, or a host name (resolved once when the node starts).
result<void> check_advertise(std::string_view text) {
  if (text.empty() || check_ipv4(text)) return ok();
  if (text.size() > 253 ||
      text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                             "0123456789.-") != std::string_view::npos) {
    return make_error(errc::invalid_argument, "'{}' is neither an IPv4 address nor a host name",
                      text);
  }
  return ok();
}

result<void> check_ifname(std::string_view text) {
  if (text.size() >= IFNAMSIZ) {
    return make_error(errc::invalid_argument, "'{}' is longer than an interface name ({} chars)",
                      text, IFNAMSIZ - 1);
  }
  return ok();
}

result<void> check_cluster_name(std::string_view text) {
  if (!is_cluster_id_text(text)) {
    return make_error(errc::invalid_argument,
                      "'{}': 1..{} printable characters without spaces, '=' or ','", text,
                      max_cluster_id_bytes);
  }
  return ok();
}

result<void> check_non_empty(std::string_view text) {
  if (text.empty()) return make_error(errc::invalid_argument, "must not be empty");
  return ok();
}

// clang-format 14 mangles lambdas inside designated initializers; the table is laid out by hand.
// clang-format off
const std::vector<key_spec> key_table = {
    {.key = "data_dir", .flag = "--data-dir", .help = "directory for node.id and state",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.data_dir; },
     .check = check_non_empty},
    {.key = "cluster_key_file", .flag = "--cluster-key", .help = "file holding the cluster secret",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.cluster_key_file; }},
    {.key = "cluster_name", .flag = "--cluster-name",
     .help = "cluster id announced by discovery; peers of other clusters are ignored",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.cluster_name; },
     .check = check_cluster_name},
    {.key = "reset_identity", .flag = "--reset-identity",
     .help = "discard node.id (e.g. of a copied data dir) and create a new identity",
     .kind = value_kind::boolean,
     .boolean = [](node_config& c) -> auto& { return c.reset_identity; }, .in_file = false},
    {.key = "listen.address", .flag = "--listen", .help = "address to bind (IPv4)",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.listen.address; },
     .check = check_ipv4},
    {.key = "listen.advertise", .flag = "--advertise",
     .help = "address peers reach this node at (IPv4 or a name; default: chosen, see status)",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.listen.advertise; },
     .check = check_advertise},
    {.key = "listen.control_port", .flag = "--control-port", .help = "control plane port",
     .kind = value_kind::port,
     .port = [](node_config& c) -> auto& { return c.listen.control_port; }},
    {.key = "listen.bulk_port", .flag = "--bulk-port",
     .help = "bulk plane port: tcp bulk links listen here (0 = an ephemeral port per link)",
     .kind = value_kind::port, .port = [](node_config& c) -> auto& { return c.listen.bulk_port; }},
    {.key = "listen.client_request_port", .flag = "--client-request-port",
     .help = "client request (pub/sub) port", .kind = value_kind::port,
     .port = [](node_config& c) -> auto& { return c.listen.client_request_port; }},
    {.key = "listen.client_response_port", .flag = "--client-response-port",
     .help = "client response (pub/sub) port", .kind = value_kind::port,
     .port = [](node_config& c) -> auto& { return c.listen.client_response_port; }},
    {.key = "listen.client_address", .flag = "--client-address",
     .help = "address the client endpoints bind (IPv4; default 127.0.0.1, or --listen's address "
             "when that is given); off this host it needs --client-auth or --insecure-clients",
     .kind = value_kind::text,
     .text = [](node_config& c) -> auto& { return c.listen.client_address; },
     .check = check_ipv4},
    {.key = "listen.http_port", .flag = "--http-port",
     .help = "HTTP port: OpenAI-compatible API, /metrics, dashboard (0 = any free port)",
     .kind = value_kind::port, .port = [](node_config& c) -> auto& { return c.listen.http_port; }},
    {.key = "listen.http_address", .flag = "--http-address",
     .help = "address the HTTP API binds (IPv4; loopback unless set)", .kind = value_kind::text,
     .text = [](node_config& c) -> auto& { return c.listen.http_address; },
     .check = check_ipv4},
    {.key = "http.enabled", .flag = "--http", .help = "serve the HTTP API, metrics and dashboard",
     .kind = value_kind::boolean, .boolean = [](node_config& c) -> auto& { return c.http.enabled; }},
    {.key = "http.api_key_file", .flag = "--http-api-key-file",
     .help = "file holding the bearer token the HTTP API requires (empty: none)",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.http.api_key_file; }},
    {.key = "http.cors_origins", .flag = "--http-cors-origin",
     .help = "a browser origin allowed to call the HTTP API (CORS; repeatable; \"*\": any). None: "
             "browsers on other origins are refused",
     .kind = value_kind::list,
     .list = [](node_config& c) -> auto& { return c.http.cors_origins; }, .check = check_origin,
     .max_items = 64},
    {.key = "discovery.mdns", .flag = "--mdns", .help = "mDNS/DNS-SD discovery through avahi",
     .kind = value_kind::boolean,
     .boolean = [](node_config& c) -> auto& { return c.discovery.mdns; }},
    {.key = "discovery.beacon", .flag = "--beacon", .help = "UDP beacon discovery",
     .kind = value_kind::boolean,
     .boolean = [](node_config& c) -> auto& { return c.discovery.beacon; }},
    {.key = "discovery.beacon_interface", .flag = "--beacon-interface",
     .help = "network interface for beacons", .kind = value_kind::text,
     .text = [](node_config& c) -> auto& { return c.discovery.beacon_interface; },
     .check = check_ifname},
    {.key = "discovery.beacon_address", .flag = "--beacon-address",
     .help = "multicast group or broadcast address for beacons", .kind = value_kind::text,
     .text = [](node_config& c) -> auto& { return c.discovery.beacon_address; },
     .check = check_ipv4},
    {.key = "discovery.beacon_port", .flag = "--beacon-port", .help = "UDP port for beacons",
     .kind = value_kind::port,
     .port = [](node_config& c) -> auto& { return c.discovery.beacon_port; }, .min = 1},
    {.key = "discovery.beacon_interval_ms", .flag = "--beacon-interval-ms",
     .help = "time between beacons", .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.discovery.beacon_interval_ms; }, .min = 50,
     .max = 60000},
    {.key = "discovery.seeds", .flag = "--seed",
     .help = "host:port of a peer's control endpoint (repeatable)", .kind = value_kind::list,
     .list = [](node_config& c) -> auto& { return c.discovery.seeds; }, .check = check_seed,
     .max_items = 256},
    {.key = "timeouts.heartbeat_interval_ms", .flag = "--heartbeat-interval-ms",
     .help = "membership heartbeat period", .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.timeouts.heartbeat_interval_ms; }, .min = 1,
     .max = 600000},
    {.key = "timeouts.suspect_timeout_ms", .flag = "--suspect-timeout-ms",
     .help = "how long a suspected peer has to refute before it is declared dead", .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.timeouts.suspect_timeout_ms; }, .min = 1,
     .max = 600000},
    {.key = "timeouts.dead_timeout_ms", .flag = "--dead-timeout-ms",
     .help = "how long a dead peer keeps its place in the leader election's member set", .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.timeouts.dead_timeout_ms; }, .min = 1,
     .max = 3600000},
    {.key = "timeouts.election_timeout_min_ms", .flag = "--election-timeout-min-ms",
     .help = "lower bound of the randomized election timeout", .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.timeouts.election_timeout_min_ms; },
     .min = 1, .max = 600000},
    {.key = "timeouts.election_timeout_max_ms", .flag = "--election-timeout-max-ms",
     .help = "upper bound of the randomized election timeout", .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.timeouts.election_timeout_max_ms; },
     .min = 1, .max = 600000},
    {.key = "model_paths", .flag = "--model", .help = "GGUF model file (repeatable)",
     .kind = value_kind::list, .list = [](node_config& c) -> auto& { return c.model_paths; },
     .check = check_non_empty, .max_items = 64},
    {.key = "threads", .flag = "--threads", .help = "compute threads (0 = one per core)",
     .kind = value_kind::count, .count = [](node_config& c) -> auto& { return c.threads; },
     .max = 1024},
    {.key = "max_batch_streams", .flag = "--max-batch-streams",
     .help = "most streams of one model sharing a forward pass (1 = one pass per stream)",
     .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.max_batch_streams; }, .min = 1, .max = 64},
    {.key = "kv_cache", .flag = "--kv-cache",
     .help = "KV cache of the streams served: f16, or q8_0 (half the memory and the bytes a long "
             "context reads per token; models with head_dim a multiple of 32)",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.kv_cache; },
     .choices = {"f16", "q8_0"}},
    {.key = "memory_limit_mb", .flag = "--memory-limit-mb",
     .help = "memory (MiB) the planner may give this peer's shards (0 = what is free)",
     .kind = value_kind::count, .count = [](node_config& c) -> auto& { return c.memory_limit_mb; },
     .max = 1u << 30},
    {.key = "max_tp_ranks", .flag = "--max-tp-ranks",
     .help = "most tensor-parallel ranks per pipeline stage; 1 = pipeline only (cluster-wide)",
     .kind = value_kind::count, .count = [](node_config& c) -> auto& { return c.max_tp_ranks; },
     .min = 1, .max = 8},
    {.key = "tp_max_rtt_us", .flag = "--tp-max-rtt-us",
     .help = "links with a round trip up to this (us) may carry tensor parallelism; shm and rdma "
             "always may (cluster-wide)",
     .kind = value_kind::count, .count = [](node_config& c) -> auto& { return c.tp_max_rtt_us; },
     .max = 10'000'000},
    {.key = "compute_nice", .flag = "--compute-nice",
     .help = "nice value of compute threads, so protocol threads preempt them (0 = same priority)",
     .kind = value_kind::count, .count = [](node_config& c) -> auto& { return c.compute_nice; },
     .max = 19},
    {.key = "fetch_models", .flag = "--fetch-models",
     .help = "serve models this peer has no file of: fetch its shard's bytes from peers that do",
     .kind = value_kind::boolean, .boolean = [](node_config& c) -> auto& { return c.fetch_models; }},
    {.key = "client_auth", .flag = "--client-auth",
     .help = "admit only clients holding the cluster's client access key (tessera keygen --client-key)",
     .kind = value_kind::boolean, .boolean = [](node_config& c) -> auto& { return c.client_auth; }},
    {.key = "insecure_clients", .flag = "--insecure-clients",
     .help = "serve the client endpoints to other hosts without --client-auth: anyone who reaches "
             "them may submit, cancel and read requests (a warning in the log and status)",
     .kind = value_kind::boolean,
     .boolean = [](node_config& c) -> auto& { return c.insecure_clients; }},
    {.key = "client_connections_per_address", .flag = "--client-connections-per-address",
     .help = "open connections one address may hold on each client endpoint (more are refused)",
     .kind = value_kind::count,
     .count = [](node_config& c) -> auto& { return c.client_connections_per_address; },
     .min = 1, .max = 1u << 20},
    {.key = "log.level", .flag = "--log-level", .help = "trace, debug, info, warn, error or off",
     .kind = value_kind::text, .text = [](node_config& c) -> auto& { return c.log_level; },
     .choices = {"trace", "debug", "info", "warn", "error", "off"}},
    {.key = "log.format", .flag = "--log-format", .help = "text or json", .kind = value_kind::text,
     .text = [](node_config& c) -> auto& { return c.log_format; },
     .choices = {"text", "json"}},
};
// clang-format on

const key_spec* find_key(std::string_view key) {
  for (const auto& k : key_table) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

bool is_section(std::string_view prefix) {
  return std::any_of(key_table.begin(), key_table.end(), [&](const key_spec& k) {
    return k.key.size() > prefix.size() && k.key.substr(0, prefix.size()) == prefix &&
           k.key[prefix.size()] == '.';
  });
}

error located(std::string_view where, const key_spec& k, const error& e) {
  return make_error(errc::invalid_argument, "{}: key '{}': {}", where, k.key, e.message);
}

result<void> check_scalar_text(const key_spec& k, std::string_view text) {
  if (!k.choices.empty() &&
      std::find(k.choices.begin(), k.choices.end(), text) == k.choices.end()) {
    std::string list;
    for (auto c : k.choices)
      list += fmt::format("{}{}", list.empty() ? "" : ", ", c);
    return make_error(errc::invalid_argument, "'{}' is not one of: {}", text, list);
  }
  if (k.check) return k.check(text);
  return ok();
}

result<void> set_number(const key_spec& k, node_config& c, std::uint64_t v) {
  std::uint64_t max = k.kind == value_kind::port ? std::min<std::uint64_t>(k.max, 65535) : k.max;
  if (v < k.min || v > max) {
    return make_error(errc::invalid_argument, "{} is out of range {}..{}", v, k.min, max);
  }
  if (k.kind == value_kind::port)
    k.port(c) = static_cast<std::uint16_t>(v);
  else
    k.count(c) = static_cast<std::uint32_t>(v);
  return ok();
}

result<void> set_list(const key_spec& k, node_config& c, std::vector<std::string> items) {
  if (items.size() > k.max_items) {
    return make_error(errc::invalid_argument, "{} items, at most {} allowed", items.size(),
                      k.max_items);
  }
  for (const auto& item : items) {
    if (k.check) {
      auto r = k.check(item);
      if (!r) return r;
    }
  }
  k.list(c) = std::move(items);
  return ok();
}

}  // namespace

namespace detail {

const std::vector<key_spec>& keys() {
  return key_table;
}

result<void> apply_text(const key_spec& k, node_config& c, std::string_view text) {
  switch (k.kind) {
    case value_kind::text: {
      auto r = check_scalar_text(k, text);
      if (!r) return r;
      k.text(c) = std::string(text);
      return ok();
    }
    case value_kind::port:
    case value_kind::count: {
      std::uint64_t v = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc{} || ptr != text.data() + text.size()) {
        return make_error(errc::invalid_argument, "'{}' is not a non-negative integer", text);
      }
      return set_number(k, c, v);
    }
    case value_kind::boolean: {
      static const std::set<std::string_view> yes = {"true", "1", "yes", "on"};
      static const std::set<std::string_view> no = {"false", "0", "no", "off"};
      if (yes.count(text))
        k.boolean(c) = true;
      else if (no.count(text))
        k.boolean(c) = false;
      else
        return make_error(errc::invalid_argument, "'{}' is not a boolean (true/false)", text);
      return ok();
    }
    case value_kind::list: {
      // Comma-separated in env; empty text clears the list.
      std::vector<std::string> items;
      std::string_view rest = text;
      while (!rest.empty()) {
        auto comma = rest.find(',');
        std::string_view item = rest.substr(0, comma);
        if (item.empty()) return make_error(errc::invalid_argument, "empty item in '{}'", text);
        items.emplace_back(item);
        if (comma == std::string_view::npos) break;
        rest = rest.substr(comma + 1);
        if (rest.empty()) return make_error(errc::invalid_argument, "empty item in '{}'", text);
      }
      return set_list(k, c, std::move(items));
    }
  }
  return make_error(errc::internal, "unhandled value kind");
}

result<void> apply_list_items(const key_spec& k, node_config& c, std::vector<std::string> items) {
  return set_list(k, c, std::move(items));
}

}  // namespace detail

namespace {

const char* toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::array:
      return "array";
    case toml::node_type::table:
      return "table";
    default:
      return "date/time";
  }
}

std::string toml_where(const std::string& file, const toml::source_region& src) {
  return fmt::format("{}:{}:{}", file, src.begin.line, src.begin.column);
}

result<void> apply_toml_value(const key_spec& k, node_config& c, const toml::node& node,
                              const std::string& where) {
  auto wrong_type = [&](std::string_view expected) {
    return located(where, k,
                   make_error(errc::invalid_argument, "expected {}, got a TOML {}", expected,
                              toml_type_name(node.type())));
  };
  result<void> r = ok();
  switch (k.kind) {
    case value_kind::text: {
      auto v = node.value_exact<std::string>();
      if (!v) return wrong_type("a string");
      r = check_scalar_text(k, *v);
      if (r) k.text(c) = *v;
      break;
    }
    case value_kind::port:
    case value_kind::count: {
      auto v = node.value_exact<std::int64_t>();
      if (!v) return wrong_type("an integer");
      if (*v < 0)
        return located(where, k, make_error(errc::invalid_argument, "{} is negative", *v));
      r = set_number(k, c, static_cast<std::uint64_t>(*v));
      break;
    }
    case value_kind::boolean: {
      auto v = node.value_exact<bool>();
      if (!v) return wrong_type("true or false");
      k.boolean(c) = *v;
      break;
    }
    case value_kind::list: {
      const auto* arr = node.as_array();
      if (!arr) return wrong_type("an array of strings");
      std::vector<std::string> items;
      for (const auto& item : *arr) {
        auto s = item.value_exact<std::string>();
        if (!s) {
          return located(toml_where(where.substr(0, where.find(':')), item.source()), k,
                         make_error(errc::invalid_argument, "array items must be strings"));
        }
        items.push_back(*s);
      }
      r = set_list(k, c, std::move(items));
      break;
    }
  }
  if (!r) return located(where, k, r.error());
  return ok();
}

result<void> apply_toml_table(const toml::table& table, const std::string& prefix,
                              const std::string& file, resolved_config& out) {
  for (const auto& [name, node] : table) {
    std::string key =
        prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    std::string where = toml_where(file, node.source());
    std::string key_where = toml_where(file, name.source());
    if (const auto* sub = node.as_table()) {
      if (!is_section(key)) {
        return make_error(errc::invalid_argument, "{}: unknown section [{}]", key_where, key);
      }
      TESSERA_TRY(apply_toml_table(*sub, key, file, out));
      continue;
    }
    const key_spec* k = find_key(key);
    if (!k || !k->in_file) {
      return make_error(errc::invalid_argument, "{}: unknown key '{}'{}", key_where, key,
                        k ? " (allowed only as a flag or environment variable)" : "");
    }
    TESSERA_TRY(apply_toml_value(*k, out.config, node, where));
    out.origin[std::string(k->key)] = "file " + where;
  }
  return ok();
}

result<void> apply_file(const std::string& file, resolved_config& out) {
  try {
    toml::table table = toml::parse_file(file);
    out.config_file = file;
    return apply_toml_table(table, "", file, out);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    if (src.begin.line == 0) {
      return make_error(errc::io, "config file {}: {}", file, e.description());
    }
    return make_error(errc::invalid_argument, "{}:{}:{}: TOML syntax error: {}", file,
                      src.begin.line, src.begin.column, e.description());
  }
}

std::optional<std::string> env_value(const std::vector<std::string>& env, std::string_view name) {
  std::optional<std::string> found;
  for (const auto& entry : env) {
    if (entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 &&
        entry[name.size()] == '=') {
      found = entry.substr(name.size() + 1);  // the last one wins, as with getenv
    }
  }
  return found;
}

result<void> apply_env(const std::vector<std::string>& env, resolved_config& out) {
  // Unknown TESSERA_* names are errors: a misspelt variable must not be silently ignored.
  for (const auto& entry : env) {
    if (entry.rfind("TESSERA_", 0) != 0) continue;
    std::string name = entry.substr(0, entry.find('='));
    if (name == config_file_env) continue;
    // Variables other parts of tessera read, not node settings: the cluster secret itself (or
    // @file: the node takes it when --cluster-key is not given), the client key `tessera ask`
    // reads, the demo's model, the kernels' ISA override. Exported for those, they must not stop
    // a node from starting.
    static constexpr std::string_view others[] = {"TESSERA_CLUSTER_KEY", "TESSERA_CLIENT_KEY",
                                                  "TESSERA_DEMO_MODEL", "TESSERA_KERNEL_ISA"};
    if (std::find(std::begin(others), std::end(others), name) != std::end(others)) continue;
    bool known = std::any_of(key_table.begin(), key_table.end(),
                             [&](const key_spec& k) { return env_name_of(k.key) == name; });
    if (!known) {
      return make_error(errc::invalid_argument,
                        "env {}: unknown variable (TESSERA_* names a node setting; see "
                        "`tessera node --help`)",
                        name);
    }
  }
  for (const auto& k : key_table) {
    std::string name = env_name_of(k.key);
    auto v = env_value(env, name);
    if (!v) continue;
    auto r = detail::apply_text(k, out.config, *v);
    if (!r) return located("env " + name, k, r.error());
    out.origin[std::string(k.key)] = "env " + name;
  }
  return ok();
}

result<void> apply_flags(const std::vector<std::pair<std::string, std::string>>& flags,
                         resolved_config& out) {
  std::map<std::string, std::vector<std::string>> lists;
  for (const auto& [key, value] : flags) {
    const key_spec* k = find_key(key);
    if (!k) return make_error(errc::invalid_argument, "unknown configuration key '{}'", key);
    std::string where = fmt::format("flag {}", k->flag);
    if (k->kind == value_kind::list) {
      lists[key].push_back(value);  // a repeated flag accumulates; it replaces lower layers
      continue;
    }
    auto r = detail::apply_text(*k, out.config, value);
    if (!r) return located(where, *k, r.error());
    out.origin[key] = where;
  }
  for (auto& [key, items] : lists) {
    const key_spec* k = find_key(key);
    auto r = detail::apply_list_items(*k, out.config, std::move(items));
    if (!r) return located(fmt::format("flag {}", k->flag), *k, r.error());
    out.origin[key] = fmt::format("flag {}", k->flag);
  }
  return ok();
}

result<void> validate(const resolved_config& rc) {
  const node_config& c = rc.config;
  auto from = [&](const char* key) {
    auto it = rc.origin.find(key);
    return fmt::format("{} ({})", key, it == rc.origin.end() ? "default" : it->second);
  };
  const std::pair<const char*, std::uint16_t> ports[] = {
      {"listen.control_port", c.listen.control_port},
      {"listen.bulk_port", c.listen.bulk_port},
      {"listen.client_request_port", c.listen.client_request_port},
      {"listen.client_response_port", c.listen.client_response_port},
      {"listen.http_port", c.listen.http_port}};
  for (std::size_t i = 0; i < std::size(ports); ++i) {
    for (std::size_t j = i + 1; j < std::size(ports); ++j) {
      if (ports[i].second != 0 && ports[i].second == ports[j].second) {
        return make_error(errc::invalid_argument, "{} and {} are both {}; listen ports must differ",
                          from(ports[i].first), from(ports[j].first), ports[i].second);
      }
    }
  }
  // The client endpoints: off this host only with authentication, or on purpose.
  const std::string& ca = c.listen.client_address;
  if (!is_loopback_address(ca) && !c.client_auth && !c.insecure_clients) {
    const std::string why =
        rc.origin.count("listen.client_address") &&
                rc.origin.at("listen.client_address") != "default"
            ? from("listen.client_address")
            : fmt::format("listen.client_address, from {}", from("listen.address"));
    return make_error(
        errc::invalid_argument,
        "the client endpoints would bind {} ({}), where anyone who reaches them could "
        "submit requests and cancel or read others': add --client-auth (clients "
        "then present the cluster's client key: tessera keygen --client-key), or "
        "--insecure-clients to serve them openly on a trusted network, or "
        "--client-address 127.0.0.1 to keep them on this host",
        ca, why);
  }
  const auto& t = c.timeouts;
  if (t.election_timeout_min_ms >= t.election_timeout_max_ms) {
    return make_error(errc::invalid_argument, "{} = {} must be less than {} = {}",
                      from("timeouts.election_timeout_min_ms"), t.election_timeout_min_ms,
                      from("timeouts.election_timeout_max_ms"), t.election_timeout_max_ms);
  }
  if (t.heartbeat_interval_ms >= t.suspect_timeout_ms) {
    return make_error(errc::invalid_argument, "{} = {} must be less than {} = {}",
                      from("timeouts.heartbeat_interval_ms"), t.heartbeat_interval_ms,
                      from("timeouts.suspect_timeout_ms"), t.suspect_timeout_ms);
  }
  return ok();
}

void set_json(nlohmann::ordered_json& root, std::string_view key, nlohmann::ordered_json value) {
  nlohmann::ordered_json* at = &root;
  std::string_view rest = key;
  for (auto dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
    at = &(*at)[std::string(rest.substr(0, dot))];
    rest = rest.substr(dot + 1);
  }
  (*at)[std::string(rest)] = std::move(value);
}

}  // namespace

std::string env_name_of(std::string_view key) {
  std::string name = "TESSERA_";
  for (char ch : key) {
    name += ch == '.' ? '_' : static_cast<char>(ch >= 'a' && ch <= 'z' ? ch - 'a' + 'A' : ch);
  }
  return name;
}

result<resolved_config> resolve_config(const config_layers& layers) {
  resolved_config out;
  for (const auto& k : key_table)
    out.origin[std::string(k.key)] = "default";
  std::optional<std::string> file = layers.file;
  if (!file) file = env_value(layers.environment, config_file_env);
  if (file && !file->empty()) TESSERA_TRY(apply_file(*file, out));
  TESSERA_TRY(apply_env(layers.environment, out));
  TESSERA_TRY(apply_flags(layers.flags, out));
  // The client endpoints follow an explicit --listen; the default (every interface, for the
  // control plane, which admits members only) leaves them on loopback.
  if (out.config.listen.client_address.empty())
    out.config.listen.client_address = out.origin["listen.address"] == "default"
                                           ? std::string("127.0.0.1")
                                           : out.config.listen.address;
  TESSERA_TRY(validate(out));
  return out;
}

nlohmann::ordered_json to_json(const node_config& config) {
  node_config c = config;  // the accessors take a mutable config; read from a copy
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& k : key_table) {
    switch (k.kind) {
      case value_kind::text:
        set_json(j, k.key, k.text(c));
        break;
      case value_kind::port:
        set_json(j, k.key, k.port(c));
        break;
      case value_kind::count:
        set_json(j, k.key, k.count(c));
        break;
      case value_kind::boolean:
        set_json(j, k.key, k.boolean(c));
        break;
      case value_kind::list:
        set_json(j, k.key, k.list(c));
        break;
    }
  }
  return j;
}

namespace {

std::string toml_string(std::string_view v) {
  // JSON's escapes are TOML's too; TOML also wants DEL escaped.
  std::string out = "\"";
  for (char ch : log::json_escape(v)) {
    if (ch == 0x7f)
      out += "\\u007F";
    else
      out += ch;
  }
  return out + "\"";
}

}  // namespace

std::string to_toml(const node_config& config) {
  node_config c = config;  // the accessors take a mutable config; read from a copy
  // TOML puts a key after a [table] header into that table: top-level keys first, then each
  // table's keys under its header, in the key table's order; every key with its help above it.
  std::vector<std::string> tables{""};
  for (const auto& k : key_table) {
    const auto dot = k.key.find('.');
    const std::string table(dot == std::string_view::npos ? std::string_view()
                                                          : k.key.substr(0, dot));
    if (std::find(tables.begin(), tables.end(), table) == tables.end()) tables.push_back(table);
  }
  std::string out =
      "# tessera node configuration (`tessera node --config FILE`). Every key is also a flag and "
      "a\n"
      "# TESSERA_* variable (`tessera node --help`); flags > environment > this file > defaults.\n";
  for (const auto& table : tables) {
    bool header = false;
    for (const auto& k : key_table) {
      if (!k.in_file) continue;
      const auto dot = k.key.find('.');
      const std::string_view in(dot == std::string_view::npos ? std::string_view()
                                                              : k.key.substr(0, dot));
      if (in != table) continue;
      if (!table.empty() && !header) {
        out += fmt::format("\n[{}]\n", table);
        header = true;
      }
      const std::string_view name = dot == std::string_view::npos ? k.key : k.key.substr(dot + 1);
      out += fmt::format("\n# {} ({})\n{} = ", k.help, k.flag, name);
      switch (k.kind) {
        case value_kind::text:
          out += toml_string(k.text(c));
          break;
        case value_kind::port:
          out += std::to_string(k.port(c));
          break;
        case value_kind::count:
          out += std::to_string(k.count(c));
          break;
        case value_kind::boolean:
          out += k.boolean(c) ? "true" : "false";
          break;
        case value_kind::list: {
          out += "[";
          const auto& items = k.list(c);
          for (std::size_t i = 0; i < items.size(); ++i)
            out += (i ? ", " : "") + toml_string(items[i]);
          out += "]";
          break;
        }
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace tessera::mesh
