// tessera fault: breaks a live cluster on purpose, the way an operator or a chaos runner would.
//
// Network faults (partition, heal, clear, drop, delay, duplicate, reorder, ok, slow) and clock
// faults (clock: the named node's protocol clock) are fault commands (transport/faults) sent to
// every member over the authenticated control plane; each
// node's fault layer judges the frames it sends to other members, so a two-way partition needs
// the command on both sides, and a heal must reach members the others have given up on. The
// reply to each is the node's status, sent after the command over the same link: the command is
// reported applied only when that node's counter of applied commands moved.
//
// Process faults (kill, stop, pause, resume, restart) are signals to the node's process, found
// through the pid and boot id every node publishes; they work on the node's own host only (like
// Jepsen's, run them on the host; there is no remote-exec channel to abuse).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "mesh/runtime/runtime.hpp"
#include "transport/bulk/link.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/control/fault_adapter.hpp"
#include "transport/faults/fault_policy.hpp"

namespace tessera::cli {
namespace {

using json = nlohmann::json;
namespace faults = transport::faults;

struct member {
  std::string id;        ///< 32 hex digits
  std::string endpoint;  ///< host:port of its control plane
  std::string status;    ///< as the answering node sees it
  std::string hostname;
  std::string host_id;  ///< boot id
  std::int64_t pid = 0;
};

struct options {
  std::vector<std::string> connect{"127.0.0.1:7400"};
  std::string key_file;
  std::uint32_t timeout_ms = 3000;
  bool as_json = false;
  std::vector<std::string> words;
};

std::string strip_tcp(std::string s) { return s.rfind("tcp://", 0) == 0 ? s.substr(6) : s; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

result<json> status_at(const options& o, const std::string& endpoint,
                       const std::vector<std::string>& commands = {}) {
  auto doc = mesh::runtime::query_status(endpoint, o.key_file, o.timeout_ms, commands);
  if (!doc) return doc.error();
  try {
    return json::parse(*doc);
  } catch (const std::exception& e) {
    return make_error(errc::corrupt, "{} sent a status that is not JSON: {}", endpoint, e.what());
  }
}

std::string cache_path(const options& o);
void save_members(const std::string& path, const std::vector<member>& ms);
result<std::vector<member>> load_members(const std::string& path);

/// The members as the first answering --connect node sees them (its view, plus itself).
result<std::vector<member>> discover(const options& o) {
  std::string errors;
  for (const auto& ep : o.connect) {
    auto s = status_at(o, ep);
    if (!s) {
      errors += fmt::format("\n  {}: {}", ep, s.error().message);
      continue;
    }
    std::vector<member> out;
    try {
      const auto& n = s->at("node");
      member self;
      self.id = n.at("id").get<std::string>();
      self.endpoint = strip_tcp(n.at("endpoint").get<std::string>());
      self.status = "alive";
      self.pid = n.value("pid", std::int64_t{0});
      self.hostname = n.value("hostname", std::string{});
      self.host_id = n.value("host_id", std::string{});
      out.push_back(self);
      if (s->contains("view") && !s->at("view").is_null()) {
        for (const auto& m : s->at("view").at("members")) {
          member x;
          x.id = m.at("id").get<std::string>();
          if (x.id == self.id) continue;
          x.endpoint = strip_tcp(m.at("address").get<std::string>());
          x.status = m.at("status").get<std::string>();
          x.pid = m.value("pid", std::int64_t{0});
          x.hostname = m.value("hostname", std::string{});
          x.host_id = m.value("host_id", std::string{});
          out.push_back(x);
        }
      }
      // Members its membership knows but the view does not list yet (no pid known).
      for (const auto& m : s->at("membership")) {
        const auto id = m.at("id").get<std::string>();
        bool have = false;
        for (const auto& x : out) have = have || x.id == id;
        if (have) continue;
        member x;
        x.id = id;
        x.endpoint = strip_tcp(m.at("address").get<std::string>());
        x.status = m.at("status").get<std::string>();
        out.push_back(x);
      }
    } catch (const std::exception& e) {
      errors += fmt::format("\n  {}: unexpected status document: {}", ep, e.what());
      continue;
    }
    // A member that dropped out of the view (dead: e.g. paused) has no pid there any more; the
    // cache of earlier commands still knows it, so `resume` can find it.
    const std::string cache = cache_path(o);
    if (auto cached = load_members(cache)) {
      for (auto& m : out) {
        if (m.pid != 0) continue;
        for (const auto& c : *cached)
          if (c.id == m.id && c.pid != 0) {
            m.pid = c.pid;
            m.hostname = c.hostname;
            m.host_id = c.host_id;
          }
      }
    }
    save_members(cache, out);
    return out;
  }
  return make_error(errc::timeout,
                    "no node answered (is one paused? pass another peer with --connect):{}",
                    errors);
}

// The member table of the last successful discovery, so that `resume` (or kill) still finds a
// paused node when the only node the operator named is that one. One table per cluster, named by
// the cluster id (public, derived from the secret): a command given another cluster's key —
// which every node refuses — finds no table to act on either (it paused a peer that way).
// Empty when the key cannot be read.
std::string cache_path(const options& o) {
  auto secret = transport::control::load_cluster_secret(
      o.key_file.empty() ? std::nullopt : std::optional<std::string>(o.key_file));
  if (!secret) return {};
  auto keys = transport::control::derive_cluster_keys(*secret);
  if (!keys) return {};
  const char* dir = std::getenv("TMPDIR");
  return fmt::format("{}/tessera-fault-members-{}-{}.json", dir && *dir ? dir : "/tmp", ::getuid(),
                     keys->cluster_id);
}

void save_members(const std::string& path, const std::vector<member>& fresh) {
  if (path.empty()) return;
  // Fresh entries first, then what the cache knew of other members (other clusters on this
  // host, or members that dropped out of the view), up to a bound.
  constexpr std::size_t kMaxCached = 256;
  std::vector<member> ms = fresh;
  if (auto old = load_members(path))
    for (const auto& c : *old) {
      if (ms.size() >= kMaxCached) break;
      bool have = false;
      for (const auto& m : fresh) have = have || m.id == c.id;
      if (!have) ms.push_back(c);
    }
  json j = json::array();
  for (const auto& m : ms)
    j.push_back({{"id", m.id},
                 {"endpoint", m.endpoint},
                 {"status", m.status},
                 {"hostname", m.hostname},
                 {"host_id", m.host_id},
                 {"pid", m.pid}});
  const auto tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  out << j.dump();
  out.close();
  if (out) std::filesystem::rename(tmp, path);
}

result<std::vector<member>> load_members(const std::string& path) {
  if (path.empty())
    return make_error(errc::not_found, "no member table: the cluster key cannot be read");
  try {
    const auto j = json::parse(read_text(path));
    std::vector<member> ms;
    for (const auto& m : j)
      ms.push_back(member{m.at("id"), m.at("endpoint"), m.at("status"), m.at("hostname"),
                          m.at("host_id"), m.at("pid")});
    return ms;
  } catch (const std::exception& e) {
    return make_error(errc::not_found, "no member table cached at {}: {}", path, e.what());
  }
}

std::string list_members(const std::vector<member>& ms) {
  std::string s;
  for (const auto& m : ms) s += fmt::format("{}{}@{}", s.empty() ? "" : ", ", m.id.substr(0, 8), m.endpoint);
  return s;
}

/// A node named by its id, a unique id prefix (4+ digits), or its control endpoint.
result<const member*> resolve(const std::vector<member>& ms, const std::string& name) {
  const std::string n = strip_tcp(name);
  std::vector<const member*> hits;
  for (const auto& m : ms)
    if (m.id == n || m.endpoint == n) return &m;
  if (n.size() >= 4)
    for (const auto& m : ms)
      if (m.id.rfind(n, 0) == 0) hits.push_back(&m);
  if (hits.size() == 1) return hits[0];
  if (hits.empty())
    return make_error(errc::not_found, "no member is '{}' (members: {})", name, list_members(ms));
  return make_error(errc::invalid_argument, "'{}' matches {} members: give more digits ({})", name,
                    hits.size(), list_members(ms));
}

result<void> resolve_all(const std::vector<member>& ms, std::vector<std::string>& names) {
  for (auto& n : names) {
    if (n == faults::any_node) continue;
    auto m = resolve(ms, n);
    if (!m) return m.error();
    n = (*m)->id;
  }
  return ok();
}

// ------------------------------------------------------------------ network faults

int network_fault(const options& o, std::string text) {
  // A command that does not parse is the operator's mistake: say so at once, whatever the
  // cluster's state.
  auto cmd = faults::parse_fault_command(text);
  if (!cmd) {
    log::say(fmt::format("tessera fault: {}", cmd.error().message), true);
    return 2;
  }
  auto ms = discover(o);
  if (!ms) {
    log::say(fmt::format("tessera fault: {}", ms.error().message), true);
    return 1;
  }
  if (auto r = resolve_all(*ms, cmd->side_a); !r) {
    log::say(fmt::format("tessera fault: {}", r.error().message), true);
    return 2;
  }
  if (auto r = resolve_all(*ms, cmd->side_b); !r) {
    log::say(fmt::format("tessera fault: {}", r.error().message), true);
    return 2;
  }
  const std::string body = transport::control::encode_fault_command(*cmd);
  json report = {{"command", text}, {"members", json::array()}};
  bool all_ok = true;
  for (const auto& m : *ms) {
    // Every member gets it, the ones the others think dead too: a heal must reach the far side
    // of a partition. Only members seen alive must answer for the command to count as done.
    const bool must = m.status == "alive" || m.status == "suspect";
    std::string outcome;
    bool applied = false;
    auto before = status_at(o, m.endpoint);
    if (!before) {
      outcome = fmt::format("no answer: {}", before.error().message);
    } else {
      auto after = status_at(o, m.endpoint, {body});
      if (!after) {
        outcome = fmt::format("sent, but no status came back: {}", after.error().message);
      } else {
        const auto a0 = before->at("faults").value("commands_applied", std::uint64_t{0});
        const auto a1 = after->at("faults").value("commands_applied", std::uint64_t{0});
        applied = a1 > a0;
        outcome = applied ? "applied" : "refused (see the node's log)";
      }
    }
    if (must && !applied) all_ok = false;
    report["members"].push_back({{"id", m.id},
                                 {"endpoint", m.endpoint},
                                 {"seen", m.status},
                                 {"applied", applied},
                                 {"outcome", outcome}});
    if (!o.as_json)
      std::printf("%-8s %-22s %-8s %s\n", m.id.substr(0, 8).c_str(), m.endpoint.c_str(),
                  m.status.c_str(), outcome.c_str());
  }
  report["ok"] = all_ok;
  if (o.as_json) std::printf("%s\n", report.dump(2).c_str());
  return all_ok ? 0 : 1;
}

int list_faults(const options& o) {
  auto ms = discover(o);
  if (!ms) {
    log::say(fmt::format("tessera fault: {}", ms.error().message), true);
    return 1;
  }
  json report = json::array();
  bool all_ok = true;
  for (const auto& m : *ms) {
    auto s = status_at(o, m.endpoint);
    if (!s) {
      all_ok = all_ok && !(m.status == "alive" || m.status == "suspect");
      report.push_back({{"id", m.id}, {"endpoint", m.endpoint}, {"error", s.error().message}});
      if (!o.as_json)
        std::printf("%-8s %-22s no answer: %s\n", m.id.substr(0, 8).c_str(), m.endpoint.c_str(),
                    s.error().message.c_str());
      continue;
    }
    const auto f = s->at("faults");
    report.push_back({{"id", m.id}, {"endpoint", m.endpoint}, {"faults", f}});
    if (o.as_json) continue;
    std::string what;
    for (const auto& c : f.at("partitions"))
      what += fmt::format(" cut->{}", c.at("to").get<std::string>().substr(0, 8));
    if (f.contains("clock") && f["clock"].is_object() && f["clock"].value("rate", 1.0) != 1.0)
      what += fmt::format(" clock[rate {}]", f["clock"].value("rate", 1.0));
    if (f.contains("clock") && f["clock"].is_object() && f["clock"].value("offset_ms", 0LL) != 0)
      what += fmt::format(" clock[{:+} ms]", f["clock"].value("offset_ms", 0LL));
    for (const auto& r : f.at("rules"))
      what += fmt::format(" {}->{}[drop {} delay {}ms jitter {}ms dup {} reorder {}]",
                          r.at("from").get<std::string>().substr(0, 8),
                          r.at("to").get<std::string>().substr(0, 8), r.at("drop").get<double>(),
                          r.at("delay_ms").get<double>(), r.at("jitter_ms").get<double>(),
                          r.at("duplicate").get<double>(), r.at("reorder").get<double>());
    std::printf("%-8s %-22s%s (dropped %llu, delayed %llu, duplicated %llu frames)\n",
                m.id.substr(0, 8).c_str(), m.endpoint.c_str(), what.empty() ? " none" : what.c_str(),
                static_cast<unsigned long long>(f.value("frames_dropped", 0ULL)),
                static_cast<unsigned long long>(f.value("frames_delayed", 0ULL)),
                static_cast<unsigned long long>(f.value("frames_duplicated", 0ULL)));
  }
  if (o.as_json) std::printf("%s\n", report.dump(2).c_str());
  return all_ok ? 0 : 1;
}

// ------------------------------------------------------------------ process faults

/// The process state letter from /proc/PID/stat ('R', 'S', 'T', 'Z', ...), 0 when gone.
char proc_state(std::int64_t pid) {
  const auto stat = read_text(fmt::format("/proc/{}/stat", pid));
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

bool gone(std::int64_t pid) {
  const char s = proc_state(pid);
  return s == 0 || s == 'Z' || s == 'X';
}

bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::vector<std::string> split_nul(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < s.size()) {
    auto end = s.find('\0', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

/// Starts argv again as the node ran it: same environment, directory, network namespace and
/// output file; detached (new session, not our child), so it outlives this command.
result<void> respawn(std::int64_t pid, const std::vector<std::string>& argv,
                     const std::vector<std::string>& env, const std::string& cwd,
                     const std::string& out_path, int netns_fd) {
  const pid_t child = ::fork();
  if (child < 0) return make_error(errc::io, "fork: {}", std::strerror(errno));
  if (child == 0) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) ::_exit(120);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(121);
    const int out = out_path.empty() ? ::open("/dev/null", O_WRONLY)
                                     : ::open(out_path.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    if (in >= 0) ::dup2(in, 0);
    std::vector<char*> a, e;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
    e.push_back(nullptr);
    ::execve(a[0], a.data(), e.data());
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  (void)pid;
  return ok();
}

int process_fault(const options& o, const std::string& verb, const std::string& name) {
  auto ms = discover(o);
  if (!ms) {
    // A paused node answers nobody: the table cached by an earlier command still has its pid.
    const std::string cache = cache_path(o);
    auto cached = load_members(cache);
    if (!cached) {
      log::say(fmt::format("tessera fault: {}", ms.error().message), true);
      return 1;
    }
    log::say(
        fmt::format("tessera fault: no node answered; using the member table cached at {}", cache),
        true);
    ms = std::move(cached);
  }
  auto m = resolve(*ms, name);
  if (!m) {
    log::say(fmt::format("tessera fault: {}", m.error().message), true);
    return 2;
  }
  const member& t = **m;
  // The same identity the node published (boot id, or the hostname where there is none).
  const std::string here = transport::bulk::this_host_id();
  if (t.pid <= 0 || t.host_id.empty()) {
    log::sayf(true,
              "tessera fault: %s has not published its process yet (not in the view); "
              "try again in a moment\n",
              t.id.c_str());
    return 1;
  }
  if (t.host_id != here) {
    log::sayf(true,
              "tessera fault: %s runs on host %s, not on this one: run tessera fault %s "
              "there\n",
              t.id.c_str(), t.hostname.c_str(), verb.c_str());
    return 2;
  }
  const std::int64_t pid = t.pid;
  // A pid from a view or the cache may have been reused since: act only on a tessera node.
  const auto cmdline = split_nul(read_text(fmt::format("/proc/{}/cmdline", pid)));
  const bool is_node = cmdline.size() >= 2 &&
                       std::filesystem::path(cmdline[0]).filename().string().rfind("tessera", 0) == 0 &&
                       std::find(cmdline.begin(), cmdline.end(), "node") != cmdline.end();
  if (!gone(pid) && !is_node) {
    log::sayf(true, "tessera fault: pid %lld (last known for %s) is no longer a tessera node\n",
              static_cast<long long>(pid), t.id.c_str());
    return 1;
  }
  if (gone(pid)) {
    log::sayf(true, "tessera fault: %s (pid %lld) is not running\n", t.id.c_str(),
              static_cast<long long>(pid));
    return 1;
  }
  json report = {{"node", t.id}, {"endpoint", t.endpoint}, {"pid", pid}, {"action", verb}};
  auto fail = [&](const std::string& why) {
    log::sayf(true, "tessera fault: %s %s (pid %lld): %s\n", verb.c_str(), t.id.c_str(),
              static_cast<long long>(pid), why.c_str());
    return 1;
  };
  auto send = [&](int sig) -> bool { return ::kill(static_cast<pid_t>(pid), sig) == 0; };
  if (verb == "kill" || verb == "stop") {
    if (!send(verb == "kill" ? SIGKILL : SIGTERM)) return fail(std::strerror(errno));
    if (!wait_for([&] { return gone(pid); }, std::chrono::seconds(15)))
      return fail("still running after 15 s");
  } else if (verb == "pause") {
    if (!send(SIGSTOP)) return fail(std::strerror(errno));
    if (!wait_for([&] { return proc_state(pid) == 'T'; }, std::chrono::seconds(5)))
      return fail("not stopped after 5 s");
  } else if (verb == "resume") {
    if (!send(SIGCONT)) return fail(std::strerror(errno));
    if (!wait_for([&] { return proc_state(pid) != 'T'; }, std::chrono::seconds(5)))
      return fail("still stopped after 5 s");
  } else {  // restart
    const auto argv = split_nul(read_text(fmt::format("/proc/{}/cmdline", pid)));
    const auto env = split_nul(read_text(fmt::format("/proc/{}/environ", pid)));
    if (argv.empty()) return fail("cannot read its command line (permission?)");
    std::error_code ec;
    const auto cwd = std::filesystem::read_symlink(fmt::format("/proc/{}/cwd", pid), ec).string();
    auto out = std::filesystem::read_symlink(fmt::format("/proc/{}/fd/1", pid), ec).string();
    struct stat st {};
    if (ec || ::stat(out.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) out.clear();
    std::string exe = argv[0];
    if (exe.find('/') == std::string::npos)
      exe = std::filesystem::read_symlink(fmt::format("/proc/{}/exe", pid), ec).string();
    auto run_argv = argv;
    run_argv[0] = exe;
    const int netns = ::open(fmt::format("/proc/{}/ns/net", pid).c_str(), O_RDONLY | O_CLOEXEC);
    if (proc_state(pid) == 'T') send(SIGCONT);  // a paused node cannot leave
    if (!send(SIGTERM)) {
      if (netns >= 0) ::close(netns);
      return fail(std::strerror(errno));
    }
    if (!wait_for([&] { return gone(pid); }, std::chrono::seconds(10))) {
      send(SIGKILL);
      wait_for([&] { return gone(pid); }, std::chrono::seconds(5));
    }
    auto r = respawn(pid, run_argv, env, cwd, out, netns);
    if (netns >= 0) ::close(netns);
    if (!r) return fail(r.error().message);
    std::int64_t new_pid = 0;
    const bool up = wait_for(
        [&] {
          auto s = status_at(o, t.endpoint);
          if (!s) return false;
          new_pid = s->at("node").value("pid", std::int64_t{0});
          return new_pid != 0 && new_pid != pid;
        },
        std::chrono::seconds(30));
    if (!up) return fail("the new process did not answer at " + t.endpoint + " within 30 s");
    report["new_pid"] = new_pid;
  }
  report["ok"] = true;
  if (o.as_json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else if (report.contains("new_pid")) {
    std::printf("%s %s: pid %lld -> %lld\n", verb.c_str(), t.id.c_str(),
                static_cast<long long>(pid),
                static_cast<long long>(report["new_pid"].get<std::int64_t>()));
  } else {
    std::printf("%s %s: pid %lld\n", verb.c_str(), t.id.c_str(), static_cast<long long>(pid));
  }
  return 0;
}

}  // namespace

void register_fault(CLI::App& root, int& exit_code) {
  static options o;
  auto* cmd = root.add_subcommand(
      "fault",
      "inject faults into a live cluster\n"
      "network (sent to every member; names are node ids, unique id prefixes or host:port):\n"
      "  partition A,B '|' C     two-way partition      partition A '->' C   one-way (A's frames "
      "to C "
      "vanish)\n"
      "  (a bridge: partition A '|' C leaves B talking to both)\n"
      "  heal | clear            remove partitions | partitions, rules and clock faults\n"
      "  drop A->B 0.3 | delay A->B 50ms [10ms] | duplicate A->B 0.1 | reorder A->B 0.2 [5ms]\n"
      "  ok A->B                 remove the faults on A->B   (A<->B: both ways; * = any node)\n"
      "  slow A 50ms [10ms]      delay everything A sends\n"
      "  clock A rate 2 | clock A bump 5s | clock A ok\n"
      "                          A's protocol clock runs 0.25-4x as fast | jumps forward | runs\n"
      "                          at the real rate again (timers of membership, election, plans)\n"
      "  crash A control         A's control actor fails once (its supervisor restarts it)\n"
      "  list                    the faults in force on every member\n"
      "process (on the node's own host):\n"
      "  kill A | stop A         SIGKILL | SIGTERM (graceful leave)\n"
      "  pause A | resume A      SIGSTOP | SIGCONT\n"
      "  restart A               SIGTERM, then the same command line again");
  cmd->add_option("--connect", o.connect,
                  "control endpoint(s) of a node to learn the members from, host:port; "
                  "the first that answers is used (repeat the flag for more)")
      ->allow_extra_args(false)
      ->capture_default_str();
  cmd->add_option("--cluster-key", o.key_file,
                  "cluster secret file (default: $TESSERA_CLUSTER_KEY)");
  cmd->add_option("--timeout-ms", o.timeout_ms, "per node: give up when nothing answers in time")
      ->capture_default_str()
      ->check(CLI::Range(1u, 600'000u));
  cmd->add_flag("--json", o.as_json, "print the outcome as JSON");
  // The fault words go unparsed ('->' looks like an option to CLI11): options come first.
  cmd->prefix_command();
  cmd->footer("Options go before the fault; quote '|' and '->' for the shell.");
  cmd->callback([cmd, &exit_code] {
    o.words = cmd->remaining();
    if (o.words.empty()) {
      log::sayf(true, "tessera fault: which fault? (tessera fault --help lists them)\n");
      exit_code = 2;
      return;
    }
    const std::string verb = o.words.at(0);
    std::string text;
    for (const auto& w : o.words) text += (text.empty() ? "" : " ") + w;
    if (verb == "list") {
      exit_code = list_faults(o);
    } else if (verb == "kill" || verb == "stop" || verb == "pause" || verb == "resume" ||
               verb == "restart") {
      if (o.words.size() != 2) {
        log::say(fmt::format("tessera fault: '{}' takes one node", verb), true);
        exit_code = 2;
        return;
      }
      exit_code = process_fault(o, verb, o.words[1]);
    } else if (verb == "slow") {
      if (o.words.size() < 3 || o.words.size() > 4) {
        log::sayf(true, "tessera fault: 'slow' takes a node, a delay and maybe a jitter\n");
        exit_code = 2;
        return;
      }
      std::string t = fmt::format("delay {}->* {}", o.words[1], o.words[2]);
      if (o.words.size() == 4) t += " " + o.words[3];
      exit_code = network_fault(o, t);
    } else {
      exit_code = network_fault(o, text);
    }
  });
}

}  // namespace tessera::cli
