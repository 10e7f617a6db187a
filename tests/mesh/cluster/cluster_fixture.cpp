#include "tests/mesh/cluster/cluster_fixture.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <fmt/format.h>

namespace tessera::test {

namespace {

bool port_free(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

result<cluster_fixture> cluster_fixture::create(std::string tessera, std::size_t n,
                                                std::vector<std::string> hosts,
                                                std::vector<std::string> namespaces) {
  cluster_fixture c;
  c.tessera_ = std::move(tessera);
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-cluster-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) return make_error(errc::io, "mkdtemp failed");
  c.dir_ = tmpl;
  c.key_ = c.dir_ + "/cluster.key";
  if (auto k = run_command({c.tessera_, "keygen", "-o", c.key_}); !k) return k.error();
  // Ports: a block of 100 (10 per node) below the kernel's ephemeral range (outgoing connections
  // of any process take ports from it: a node once found its client port taken that way), every
  // port checked free, and the block locked against other fixtures running at the same time.
  std::uint16_t low = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    unsigned lo = 0, hi = 0;
    if (range >> lo >> hi && lo > 20000 && lo < 65536) low = static_cast<std::uint16_t>(lo);
  }
  const unsigned blocks = std::max(1u, (low - 100u - 20000u) / 100u);
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto base = static_cast<std::uint16_t>(20000 + 100 * (rng() % blocks));
    const auto lock_path =
        (std::filesystem::temp_directory_path() / fmt::format("tessera-ports-{}.lock", base))
            .string();
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      continue;
    }
    bool all = true;
    for (std::size_t p = 0; p < 100 && all; ++p)
      all = port_free(static_cast<std::uint16_t>(base + p));
    if (!all) {
      ::close(fd);
      continue;
    }
    c.base_port_ = base;
    c.port_lock_ = port_lock(fd);
    break;
  }
  if (c.base_port_ == 0) return make_error(errc::io, "no free port block found");
  for (std::size_t i = 0; i < n; ++i)
    c.add_node(i < hosts.size() ? hosts[i] : "127.0.0.1",
               i < namespaces.size() ? namespaces[i] : "");
  return c;
}

cluster_fixture::port_lock::~port_lock() {
  if (fd >= 0) ::close(fd);
}

cluster_fixture::~cluster_fixture() {
  for (auto& n : nodes_)
    if (n.proc) n.proc->terminate(std::chrono::seconds(3));
  if (!dir_.empty() && std::getenv("KEEP_TESSERA_CLUSTER") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::size_t cluster_fixture::add_node(std::string host, std::string ns) {
  const std::size_t i = nodes_.size();
  cluster_node n;
  n.host = std::move(host);
  n.ns = std::move(ns);
  n.port = static_cast<std::uint16_t>(base_port_ + 10 * i);
  n.data_dir = fmt::format("{}/node{}", dir_, i);
  n.log = fmt::format("{}/node{}.log", dir_, i);
  nodes_.push_back(std::move(n));
  return i;
}

std::vector<std::string> cluster_fixture::wrap(const std::string& ns,
                                               std::vector<std::string> argv) const {
  if (ns.empty()) return argv;
  std::vector<std::string> out{"ip", "netns", "exec", ns};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::vector<std::string> cluster_fixture::node_argv(std::size_t i, const std::string& key,
                                                    bool listen) const {
  const auto& n = nodes_.at(i);
  std::vector<std::string> argv{tessera_,   "node",          "--data-dir",
                                n.data_dir, "--cluster-key", key.empty() ? key_ : key};
  if (listen) {
    argv.emplace_back("--listen");
    argv.push_back(n.host);
    // In network namespaces the clients (this process) are on another host: the client endpoints
    // are then open to it on purpose.
    if (n.host.rfind("127.", 0) != 0) argv.emplace_back("--insecure-clients");
  }
  for (const auto& [flag, port] : {std::pair{"--control-port", 0},
                                   {"--bulk-port", 1},
                                   {"--client-request-port", 2},
                                   {"--client-response-port", 3},
                                   {"--http-port", 4}}) {
    argv.emplace_back(flag);
    argv.push_back(std::to_string(n.port + port));
  }
  argv.emplace_back("--no-mdns");
  argv.emplace_back("--no-beacon");
  // Timeouts for a 2-core machine shared with parallel builds (and ASan): the defaults (election
  // 300 ms, probe timeout 40 ms) flap there. The benchmark measures the defaults.
  for (const char* t :
       {"--heartbeat-interval-ms", "200", "--suspect-timeout-ms", "1500", "--dead-timeout-ms",
        "3000", "--election-timeout-min-ms", "1000", "--election-timeout-max-ms", "2000"})
    argv.emplace_back(t);
  return argv;
}

result<void> cluster_fixture::spawn(std::size_t i, const std::vector<std::string>& argv) {
  auto& n = nodes_.at(i);
  std::vector<std::string> full = n.exec_prefix;
  full.insert(full.end(), argv.begin(), argv.end());
  auto p = child_process::spawn(wrap(n.ns, std::move(full)), {}, n.log);
  if (!p) return p.error();
  n.proc.emplace(std::move(p).value());
  return ok();
}

result<void> cluster_fixture::start(std::size_t i, const std::vector<std::string>& extra,
                                    const std::string& key) {
  auto argv = node_argv(i, key, /*listen=*/true);
  for (std::size_t j = 0; j < nodes_.size(); ++j) {
    if (j == i) continue;
    argv.push_back("--seed");
    argv.push_back(nodes_[j].endpoint());
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return spawn(i, argv);
}

result<void> cluster_fixture::start_plain(std::size_t i, const std::vector<std::string>& seeds,
                                          const std::vector<std::string>& extra) {
  auto argv = node_argv(i, "", /*listen=*/false);
  for (const auto& s : seeds) {
    argv.push_back("--seed");
    argv.push_back(s);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return spawn(i, argv);
}

void cluster_fixture::kill9(std::size_t i) {
  auto& n = nodes_.at(i);
  if (!n.proc) return;
  ::kill(n.proc->pid(), SIGKILL);
  n.proc->terminate(std::chrono::milliseconds(100));  // reaps it
  n.proc.reset();
}

int cluster_fixture::term(std::size_t i) {
  auto& n = nodes_.at(i);
  if (!n.proc) return -1;
  const int status = n.proc->terminate(std::chrono::seconds(5));
  n.proc.reset();
  return status;
}

bool cluster_fixture::running(std::size_t i) {
  auto& n = nodes_.at(i);
  return n.proc && n.proc->running();
}

std::optional<nlohmann::json> cluster_fixture::status(std::size_t i) const {
  const auto& n = nodes_.at(i);
  auto out =
      run_command(wrap(n.ns, {tessera_, "--log-level", "warn", "status", "--json", "--connect",
                              n.endpoint(), "--cluster-key", key_, "--timeout-ms", "3000"}),
                  std::chrono::seconds(20));
  if (!out) return std::nullopt;
  // The document is the last line (a log line may precede it).
  auto text = *out;
  while (!text.empty() && text.back() == '\n')
    text.pop_back();
  const auto nl = text.rfind('\n');
  if (nl != std::string::npos) text = text.substr(nl + 1);
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::vector<std::optional<nlohmann::json>> cluster_fixture::status_all(
    const std::vector<std::size_t>& nodes) const {
  std::vector<std::optional<nlohmann::json>> out;
  for (auto i : nodes)
    out.push_back(status(i));
  return out;
}

std::string cluster_fixture::node_id(std::size_t i) const {
  auto text = read_file(nodes_.at(i).data_dir + "/node.id");
  try {
    return nlohmann::json::parse(text).at("node_id").get<std::string>();
  } catch (const std::exception&) {
    return {};
  }
}

bool cluster_fixture::converged(const std::vector<std::size_t>& nodes, std::string* leader_out,
                                std::string* why) const {
  auto say = [&](std::string w) {
    if (why) *why = std::move(w);
    return false;
  };
  std::set<std::string> expected;
  for (auto i : nodes)
    expected.insert(node_id(i));
  std::optional<std::string> leader;
  std::optional<nlohmann::json> epoch;
  for (auto i : nodes) {
    auto s = status(i);
    if (!s) return say(fmt::format("node {} did not answer", i));
    const auto& n = s->at("node");
    if (n.at("leader").is_null()) return say(fmt::format("node {} has no leader", i));
    const auto l = n.at("leader").get<std::string>();
    if (leader && *leader != l) return say(fmt::format("node {} names leader {}", i, l));
    leader = l;
    // The election's committed member set must hold everyone too (the leader adds members one at
    // a time; before that a member is not a voter and a failover could lack a majority).
    if (n.at("config_members").get<std::size_t>() != nodes.size())
      return say(fmt::format("node {}: {} voters in the committed config", i,
                             n.at("config_members").get<std::size_t>()));
    const auto& v = s->at("view");
    if (v.is_null()) return say(fmt::format("node {} has no view", i));
    if (v.at("leader").is_null() || v.at("leader").get<std::string>() != l)
      return say(fmt::format("node {}: view leader differs from its leader", i));
    if (epoch && *epoch != v.at("epoch")) return say(fmt::format("node {}: other epoch", i));
    epoch = v.at("epoch");
    std::set<std::string> live;
    for (const auto& m : v.at("members")) {
      const auto st = m.at("status").get<std::string>();
      if (st == "alive" || st == "suspect") live.insert(m.at("id").get<std::string>());
    }
    if (live != expected)
      return say(fmt::format("node {}: view has {} live members", i, live.size()));
    std::size_t measured = 0;
    for (const auto& l2 : v.at("links"))
      if (l2.at("rtt_us").get<std::uint64_t>() > 0) ++measured;
    if (measured != nodes.size() * (nodes.size() - 1))
      return say(fmt::format("node {}: {} measured links", i, measured));
  }
  if (!expected.contains(*leader)) return say("the leader is not a running node");
  if (leader_out) *leader_out = *leader;
  return true;
}

std::string cluster_fixture::logs() const {
  std::string out;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    auto text = read_file(nodes_[i].log);
    if (text.size() > 3000) text = text.substr(text.size() - 3000);
    out += fmt::format("---- node {} ({}) ----\n{}\n", i, nodes_[i].log, text);
  }
  return out;
}

}  // namespace tessera::test
