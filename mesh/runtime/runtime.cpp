#include "mesh/runtime/runtime.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"
#include "actors/supervisor.hpp"
#include "mesh/discovery/beacon_codec.hpp"
#include "mesh/discovery/beacon_source.hpp"
#include "mesh/discovery/mdns_source.hpp"
#include "mesh/discovery/peer_hint.hpp"
#include "mesh/discovery/seed_source.hpp"
#include "mesh/election/election.hpp"
#include "mesh/http/gateway.hpp"
#include "mesh/membership/membership.hpp"
#include "mesh/node/advertise.hpp"
#include "mesh/node/data_dir.hpp"
#include "mesh/node/identity_conflict.hpp"
#include "mesh/node/node_id.hpp"
#include "mesh/runtime/bandwidth_probe.hpp"
#include "mesh/runtime/control_core.hpp"
#include "mesh/runtime/identity_check.hpp"
#include "mesh/runtime/protocol_clock.hpp"
#include "mesh/serving/engine.hpp"
#include "mesh/serving/planning.hpp"
#include "mesh/topology/topology.hpp"
#include "transport/bulk/link.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/control/control_node.hpp"
#include "transport/control/fault_adapter.hpp"
#include "transport/faults/fault_policy.hpp"

namespace tessera::mesh::runtime {

namespace ctl = transport::control;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

bool is_hex_id(std::string_view s) {
  return is_node_id_text(s);
}

/// Wall-clock milliseconds since the epoch (membership incarnations, the instance's start).
std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The election's durable state in `file`: the initial state when there is no file; an error
/// naming the file when it does not decode.
result<durable_election_state> read_election_state(const fs::path& file) {
  if (!fs::exists(file)) return durable_election_state{};
  std::ifstream in(file, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto d = unpack<durable_election_state>(data);
  if (!d)
    return make_error(errc::corrupt,
                      "{} does not decode as the election state; remove it to start over (this "
                      "node then forgets its term and vote)",
                      file.string());
  return *d;
}

/// Whether two control endpoints ("tcp://host:port") reach the same listener: the same text, or
/// the same port on two addresses of this machine (a seed given as 127.0.0.1 for a node on this
/// host that advertises its LAN address). A seed placeholder for it must then go: the peer's
/// ROUTER takes one connection per routing id (ours), and two would take it from each other.
bool same_listener(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const auto ca = a.rfind(':'), cb = b.rfind(':');
  if (a.rfind("tcp://", 0) != 0 || b.rfind("tcp://", 0) != 0 || ca == std::string::npos ||
      cb == std::string::npos || a.substr(ca) != b.substr(cb))
    return false;
  return is_address_of_this_host(a.substr(6, ca - 6)) &&
         is_address_of_this_host(b.substr(6, cb - 6));
}

std::string tcp_endpoint(const endpoint& e) {
  return "tcp://" + e.to_string();
}

/// Writes `data` to dir/name atomically and durably: temp file, fsync, rename, fsync dir.
result<void> write_durable(const fs::path& dir, const std::string& name, const std::string& data) {
  const fs::path tmp = dir / (name + ".tmp");
  const fs::path dst = dir / name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(errc::io, "cannot write {}: {}", tmp.string(), std::strerror(errno));
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return make_error(errc::io, "cannot write {}: {}", tmp.string(), std::strerror(errno));
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return make_error(errc::io, "fsync {}: {}", tmp.string(), std::strerror(errno));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), dst.c_str()) != 0)
    return make_error(errc::io, "rename {} -> {}: {}", tmp.string(), dst.string(),
                      std::strerror(errno));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return ok();
}

topology::capabilities local_caps(const node_config& cfg, const std::string& hex,
                                  const std::string& version,
                                  const transport::bulk::local_capabilities& bulk) {
  topology::capabilities c;
  c.node_id = hex;
  c.version = version;
  c.cores = std::max(1u, std::thread::hardware_concurrency());
  struct sysinfo si {};
  if (::sysinfo(&si) == 0) {
    c.memory_total_mb = static_cast<std::uint64_t>(si.totalram) * si.mem_unit / (1024 * 1024);
    c.memory_free_mb = static_cast<std::uint64_t>(si.freeram) * si.mem_unit / (1024 * 1024);
  }
  if (cfg.memory_limit_mb != 0) {
    c.memory_total_mb = std::min<std::uint64_t>(c.memory_total_mb, cfg.memory_limit_mb);
    c.memory_free_mb = std::min<std::uint64_t>(c.memory_free_mb, cfg.memory_limit_mb);
  }
  c.host_id = bulk.host_id;
  c.has_rdma = bulk.has_rdma;
  c.pid = ::getpid();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  c.hostname = host;
  c.fetches_models = cfg.fetch_models;
  // Each active port with the GID its links would use (empty without the rdma backend).
  c.rdma_devices = transport::bulk::describe_rdma_ports();
  for (const auto& m : cfg.model_paths)
    c.models.push_back(fs::path(m).filename().string());
  return c;
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// What a node whose client endpoints other hosts reach without authentication
/// (--insecure-clients) says in its log and status; nullopt when they are on loopback or guarded.
std::optional<std::string> insecure_clients_warning(const node_config& cfg) {
  if (is_loopback_address(cfg.listen.client_address) || cfg.client_auth) return std::nullopt;
  return fmt::format(
      "the client endpoints on {} (ports {}, {}) serve anyone who reaches them, without "
      "authentication (--insecure-clients): they may submit requests and cancel or read others'; "
      "--client-auth admits only holders of the cluster's client key",
      cfg.listen.client_address, cfg.listen.client_request_port, cfg.listen.client_response_port);
}

/// Descriptors below this leave too little room: every client, HTTP connection, peer link and
/// model file holds one, and a stranger holding connections must not starve the control plane.
constexpr rlim_t kWantedDescriptors = 65536;
constexpr rlim_t kFewDescriptors = 4096;

/// Raises the soft descriptor limit toward the hard one (at most kWantedDescriptors): Debian's
/// default soft limit of 1024 let 300 idle connections make the control plane unreachable
/// (issue 32). Returns the limit in force.
rlim_t raise_descriptor_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  const rlim_t want = std::min<rlim_t>(lim.rlim_max, kWantedDescriptors);
  if (lim.rlim_cur < want) {
    rlimit raised = lim;
    raised.rlim_cur = want;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return want;
  }
  return lim.rlim_cur;
}

/// How the node's `limit` descriptors are shared among what strangers can open (issue 32: 300
/// idle client connections once left a node of 256 descriptors none for its control plane). Half
/// of them, up to 4096, are reserved: a quarter of the reserve for HTTP handler threads and as
/// many for accepted HTTP connections waiting for one (beyond, connections wait in the kernel's
/// backlog), the rest for the control plane, peer links and model files. The client endpoints'
/// connections may use what is not reserved.
struct descriptor_budget {
  std::uint32_t client_connections = 1u << 20;
  std::uint32_t http_threads = 1024;
};
descriptor_budget budget_of(rlim_t limit) {
  if (limit == 0 || limit == RLIM_INFINITY) return {};
  const rlim_t reserved = std::min<rlim_t>(limit / 2, 4096);
  descriptor_budget b;
  b.client_connections = static_cast<std::uint32_t>(std::min<rlim_t>(limit - reserved, 1u << 20));
  b.http_threads = static_cast<std::uint32_t>(std::clamp<rlim_t>(reserved / 4, 4, 1024));
  return b;
}

/// The warning a node with few descriptors gives in its log and status, if any.
std::optional<std::string> descriptor_warning(rlim_t limit) {
  if (limit == 0 || limit >= kFewDescriptors) return std::nullopt;
  return fmt::format(
      "only {} file descriptors (hard limit): connections held open by clients or strangers "
      "can exhaust them and cut this node off; raise it (ulimit -Hn, systemd LimitNOFILE) to "
      "{} or more",
      limit, kFewDescriptors);
}

/// Descriptors this process has open now (entries of /proc/self/fd), -1 when unreadable.
long open_descriptors() {
  std::error_code ec;
  long n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  return ec ? -1 : n;
}

/// The host part of the client endpoint this node tells clients (in peer lists): the advertised
/// address when the endpoints are bound where other hosts reach them, 127.0.0.1 when they are on
/// loopback (only clients on this host can reach them; peers on other hosts leave them out of
/// the lists they send, control_core::hand_to_engine).
std::string client_host_for_peers(const node_config& cfg, const std::string& adv_host) {
  return is_loopback_address(cfg.listen.client_address) ? std::string("127.0.0.1") : adv_host;
}

}  // namespace

struct node_runtime::impl final : control_port {
  // --- set at start, read-only afterwards ---
  runtime_options opt;
  std::optional<data_dir> dir;
  std::shared_ptr<void> bulk_port_hold;  // the shared bulk listener (listen.bulk_port), if any
  rlim_t descriptor_limit = 0;  // RLIMIT_NOFILE in force (raised at start)
  std::string hex;  // our node id, 32 hex digits (control-plane id)
  member_id self = no_member;
  std::string endpoint;  // advertised control endpoint, tcp://address:port
  std::string self_address;
  advertised_address advertise;  // the one address peers reach us at (control, bulk, clients)
  topology::capabilities caps;
  transport::bulk::local_capabilities bulk_caps;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  node_instance instance;  // for the run-time duplicate-identity rule (identity_check.hpp)

  std::unique_ptr<ctl::control_node> control;
  std::unique_ptr<bandwidth_prober> prober;
  std::vector<std::unique_ptr<discovery_source>> sources;
  std::unique_ptr<serving::engine> engine;  // client endpoints, models, token streams
  std::unique_ptr<http::gateway> gateway;   // OpenAI API, metrics, dashboard (may be null)

  // The status document as the control actor last wrote it, for the HTTP gateway's threads (the
  // state machines are the actor's alone; readers get a copy at most kSnapshotMs old).
  static constexpr std::uint64_t kSnapshotMs = 250;
  mutable std::mutex snapshot_mu;
  std::string snapshot;  // JSON text; empty until the control actor's first tick
  std::uint64_t next_snapshot_ms = 0;

  [[nodiscard]] nlohmann::json status_snapshot() const {
    std::lock_guard lock(snapshot_mu);
    if (snapshot.empty()) return nullptr;
    return nlohmann::json::parse(snapshot, nullptr, false);
  }

  /// Every live member's status document by node id, for the dashboard: ours from the snapshot,
  /// the others as the control actor last heard them. Asking (status_request over each member's
  /// own authenticated link, once a second) runs only while someone reads this — no thread and
  /// no connection per poll. A member whose answer is older than 3 s shows as null.
  static constexpr std::uint64_t kClusterAskMs = 1000, kClusterWantMs = 5000,
                                 kClusterStaleMs = 3000;
  mutable std::mutex cluster_mu;
  mutable std::condition_variable cluster_cv;                                 // an answer arrived
  std::map<std::string, std::pair<std::string, std::uint64_t>> cluster_docs;  // hex -> (doc, at)
  mutable std::atomic<std::uint64_t> cluster_wanted_until{0};                 // real ms
  std::uint64_t next_cluster_ask = 0;  // real ms; the control actor's turns only

  [[nodiscard]] nlohmann::json cluster_status() const {
    nlohmann::json out = nlohmann::json::object();
    const bool was_wanted = real_ms() < cluster_wanted_until.load();
    cluster_wanted_until = real_ms() + kClusterWantMs;
    const nlohmann::json self_doc = status_snapshot();
    if (!self_doc.is_object()) return out;
    out[hex] = self_doc;
    if (!self_doc.contains("view") || !self_doc["view"].is_object()) return out;
    std::vector<std::string> ids;
    for (const auto& m : self_doc["view"]["members"]) {
      const std::string id = m.value("id", "");
      if (id != hex && m.value("status", "") == "alive") ids.push_back(id);
    }
    std::unique_lock lock(cluster_mu);
    const auto fresh = [&] {
      const auto now = real_ms();
      return std::all_of(ids.begin(), ids.end(), [&](const std::string& id) {
        auto it = cluster_docs.find(id);
        return it != cluster_docs.end() && now - it->second.second <= kClusterStaleMs;
      });
    };
    // The first read after a quiet spell waits (800 ms at most) for the answers the control
    // actor now asks for; later reads take what is there.
    if (!was_wanted) cluster_cv.wait_for(lock, std::chrono::milliseconds(800), fresh);
    const auto now = real_ms();
    for (const auto& id : ids) {
      auto it = cluster_docs.find(id);
      out[id] = it == cluster_docs.end() || now - it->second.second > kClusterStaleMs
                    ? nlohmann::json(nullptr)
                    : nlohmann::json::parse(it->second.first, nullptr, false);
    }
    return out;
  }

  /// The control actor's side: asks every live member while the dashboard reads.
  void ask_cluster_status() {
    const auto now = real_ms();
    if (now >= cluster_wanted_until.load() || now < next_cluster_ask) return;
    next_cluster_ask = now + kClusterAskMs;
    const std::string body = pack(endpoint);
    for (member_id id : core->live_members())
      if (auto k = known.find(id); k != known.end())
        (void)control->send(k->second.hex, static_cast<std::uint16_t>(runtime_msg::status_request),
                            bytes_of(body));
  }

  // --- events (any thread -> the control actor) ---
  struct ev_message {
    ctl::inbound_message msg;
  };
  struct ev_peer {
    ctl::peer_event ev;
  };
  struct ev_hint {
    peer_hint hint;
  };
  struct ev_leave {};
  struct ev_subscribe {
    actors::actor_system* system;  // null: unsubscribe
    actors::actor_ref who;
  };
  using event = std::variant<ev_message, ev_peer, ev_hint, ev_leave, ev_subscribe>;
  /// An event on its way to the control actor. Node-local: the control actor's system has no
  /// router, so these never leave the process, and their msgpack form (which every actor message
  /// has) carries nothing.
  struct node_event {
    TESSERA_MESSAGE("tessera.node.event");
    event e;
    bool frame = false;  // an inbound frame: counts against kMaxQueuedEvents
    std::uint8_t local_only = 0;
    MSGPACK_DEFINE(local_only);
  };
  struct node_tick {
    TESSERA_MESSAGE("tessera.node.tick");
    std::uint8_t unused = 0;
    MSGPACK_DEFINE(unused);
  };
  std::size_t member_subscriptions = 0;  // subscribed or on their way (under mu)
  mutable std::mutex mu;                 // guards the flags below; cv: leave done, or stopped
  std::condition_variable cv;
  bool stopping = false;
  bool left = false;  // leave processed by the control actor
  std::string fatal;
  std::atomic<bool> failed{false};
  // The control actor's system: one worker thread (`actor-0`). Inbound frames wait in the
  // actor's data lane, at most kMaxQueuedEvents of them (beyond: dropped, counted); peer events,
  // hints and subscriptions are never dropped below the mailbox's own bound above that.
  std::unique_ptr<actors::actor_system> actors;
  actors::actor_ref control_actor;  // under mu: the running instance (a restart replaces it)
  std::atomic<std::int64_t> queued_frames{0};
  core_options core_base;  // what the core was made from (a restart remakes it from the disk)
  std::atomic<std::uint64_t> control_restarts{0};
  std::uint64_t control_instances = 0;    // the control actor's turns only
  std::uint64_t crash_requests_seen = 0;  // the control actor's turns only (survives restarts)
  std::atomic<std::uint64_t> dropped_events{0};
  bool actor_running = false;     // under mu: its first turn took `early`
  std::vector<node_event> early;  // under mu; frames in it count against kMaxQueuedEvents too

  // --- the control actor's turns only ---
  std::unique_ptr<control_core> core;  // membership, election, topology, plan (control_core.hpp)
  struct known_peer {
    std::string hex;
    std::string endpoint;
  };
  std::map<member_id, known_peer> known;     // from membership addresses
  std::set<std::string> added;               // control peers we added (hex ids)
  std::map<std::string, std::string> seeds;  // placeholder id -> endpoint (node id not known yet)
  std::map<member_id, std::uint64_t> next_bandwidth_ms;  // when to (re)measure a link
  std::uint64_t hints_dropped = 0;                       // hints refused at kMaxKnownPeers
  std::uint64_t undecodable = 0;  // the node's own message types (the core counts its own)
  struct member_subscriber {
    actors::actor_system* system;
    actors::actor_ref who;
  };
  std::vector<member_subscriber> member_subscribers;  // bounded by kMaxMemberSubscribers
  std::uint64_t member_events_sent = 0, member_events_dropped = 0;
  std::uint32_t link_dead_after_ms = 0;  // control links: silence before down (set at start)
  std::shared_ptr<transport::faults::fault_injector> injector;  // shared with the control plane
  mutable std::mutex clock_mu;  // guards pclock and clock_seen (now_ms() is called from any thread)
  mutable protocol_clock pclock;
  mutable transport::faults::clock_rule clock_seen;

  std::uint64_t real_ms() const {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count());
  }

  /// The protocols' time: real time unless `tessera fault clock` skews this node's clock.
  std::uint64_t now_ms() const {
    transport::faults::clock_rule r;
    if (injector)
      injector->update([&](const transport::faults::fault_policy& p) {
        if (const auto* c = p.clock_for(hex)) r = *c;
      });
    std::lock_guard g(clock_mu);
    const auto real = real_ms();
    if (!(r == clock_seen)) {
      spdlog::warn("node {}: clock fault: rate {}, bumped {} ms in all", hex, r.rate,
                   r.bump_ns / 1'000'000);
      pclock.apply(r.rate, static_cast<std::uint64_t>(r.bump_ns / 1'000'000), real);
      clock_seen = r;
    }
    return pclock.at(real);
  }

  /// Real milliseconds until the protocols' clock moved `local_ms` (a fast clock: fewer).
  std::uint64_t real_wait_ms(std::uint64_t local_ms) const {
    std::lock_guard g(clock_mu);
    return pclock.real_wait(local_ms);
  }

  void push(event e, bool droppable) {
    if (droppable && queued_frames.fetch_add(1) >= static_cast<std::int64_t>(kMaxQueuedEvents)) {
      --queued_frames;
      ++dropped_events;
      return;
    }
    actors::actor_ref to;
    {
      // Before the control actor runs (the control plane and discovery start first), events
      // wait here; its first turn takes them, in order, under the same lock.
      std::lock_guard lock(mu);
      if (stopping) {
        if (droppable) --queued_frames;
        return;
      }
      if (!actor_running) {
        early.push_back(node_event{std::move(e), droppable, 0});
        return;
      }
      to = control_actor;
    }
    // Between a failure of the control actor and its restart the send fails: the event is lost
    // and counted (the protocols retry).
    if (!actors->send(to, node_event{std::move(e), droppable, 0})) {
      if (droppable) --queued_frames;
      ++dropped_events;
    }
  }

  void fail(std::string why) {
    spdlog::error("node {}: {}", hex, why);
    {
      std::lock_guard lock(mu);
      if (fatal.empty()) fatal = std::move(why);
      stopping = true;
    }
    failed = true;
    cv.notify_all();
  }

  // ------------------------------------------------------------------ control-plane plumbing
  std::string control_peer_endpoint(const std::string& id) const {
    for (const auto& p : control->peers())
      if (p.id == id) return p.endpoint;
    return {};
  }

  /// Makes sure a control link to `peer_hex` exists; `move` re-points an existing one at `ep`.
  void ensure_peer(const std::string& peer_hex, const std::string& ep, bool move) {
    if (peer_hex == hex || ep.empty()) return;
    const bool moved = move && added.contains(peer_hex) && control_peer_endpoint(peer_hex) != ep;
    if (added.contains(peer_hex) && !moved) return;
    // A seed placeholder pointing at the same endpoint must go first: the peer's ROUTER accepts
    // only one connection per routing id (ours).
    for (auto s = seeds.begin(); s != seeds.end();) {
      if (same_listener(s->second, ep)) {
        (void)control->remove_peer(s->first);
        s = seeds.erase(s);
      } else {
        ++s;
      }
    }
    // The control plane may already hold it (the peer introduced itself): re-adding would
    // replace a working connection.
    if (!moved && control_peer_endpoint(peer_hex) == ep) {
      added.insert(peer_hex);
      return;
    }
    if (moved)
      spdlog::info("node {}: peer {} now at {} (was {})", hex, peer_hex, ep,
                   control_peer_endpoint(peer_hex));
    if (auto r = control->add_peer(peer_hex, ep); r) {
      added.insert(peer_hex);
    } else {
      spdlog::warn("node {}: cannot add peer {} at {}: {}", hex, peer_hex, ep,
                   r.error().describe());
    }
  }

  /// Learns where member `id` listens. `first_hand`: the member itself said so in a message
  /// that came over its own authenticated link, which may move our link to it (a peer restarted
  /// on another port or address). Second-hand addresses (gossip, membership events) only fill in
  /// peers we have no address for: a stale or forged rumour must not re-point a working link.
  void learn(member_id id, const std::string& address, bool first_hand) {
    if (id == self || id == no_member) return;
    auto parsed = split_address(address);
    if (!parsed || member_of(parsed->first) != id) return;
    auto it = known.find(id);
    const bool differs = it != known.end() && it->second.endpoint != parsed->second;
    if (differs && !first_hand) return;
    known[id] = known_peer{parsed->first, parsed->second};
    ensure_peer(parsed->first, parsed->second, first_hand);
  }

  void send_to(member_id to, runtime_msg type, const std::string& body) {
    auto it = known.find(to);
    if (it == known.end()) return;  // not met yet: the protocols treat it as loss
    (void)control->send(it->second.hex, static_cast<std::uint16_t>(type), bytes_of(body));
  }

  // ------------------------------------------------------------------ control_port
  void send(member_id to, runtime_msg type, std::string body) override { send_to(to, type, body); }

  void reply(member_id, std::string_view link, runtime_msg type, std::string body) override {
    (void)control->send(std::string(link), static_cast<std::uint16_t>(type), bytes_of(body));
  }

  bool persist(const std::string& bytes) override {
    auto w = write_durable(dir->path(), opt.election_state_file, bytes);
    if (!w) fail(fmt::format("cannot persist the election state: {}", w.error().describe()));
    return w.has_value();
  }

  std::int64_t mono_ns() override { return steady_ns(); }

  void on_member_event(const member_event& ev) override {
    deliver(changed_of(ev.id, ev.status, ev.incarnation, ev.address, false));
  }

  void serving_changed(serving_facts f) override {
    if (engine)
      engine->set_plan(std::move(f.plan), std::move(f.live), std::move(f.endpoints),
                       std::move(f.peers));
  }

  std::uint8_t backend_for(const topology::capabilities& c) override {
    return static_cast<std::uint8_t>(backend_kind_for(c));
  }

  /// The bulk backend a link to a peer with `c` uses (for the topology row and the probe alike).
  [[nodiscard]] transport::bulk::backend_kind backend_kind_for(
      const topology::capabilities& c) const {
    return transport::bulk::choose_backend(bulk_caps, {c.host_id, c.has_rdma});
  }

  void refresh_caps(topology::capabilities& c) override {
    // A model fetched whole from peers makes this peer a holder too (it serves the bytes on):
    // the leader plans over it even when the peers it fetched from are gone.
    if (engine) c.model_specs = engine->held_specs();
  }

  // ------------------------------------------------------------------ membership subscribers
  member_changed changed_of(member_id id, member_status st, std::uint64_t incarnation,
                            const std::string& address, bool initial) const {
    member_changed m;
    m.member = fmt::format("{:016x}", id);
    if (id == self) {
      m.node = hex;
    } else if (auto it = known.find(id); it != known.end()) {
      m.node = it->second.hex;
    }
    m.status = std::string(to_string(st));
    m.incarnation = incarnation;
    m.address = address;
    m.initial = initial;
    return m;
  }

  /// Sends to one subscriber; false when it is gone for good (stopped, or its system is closed).
  bool send_change(const member_subscriber& s, member_changed m) {
    auto r = s.system->send(s.who, std::move(m));
    if (r) {
      ++member_events_sent;
      return true;
    }
    if (r.error().code == errc::not_found || r.error().code == errc::closed) {
      spdlog::debug("node {}: membership subscriber {} dropped: {}", hex, s.who.id(),
                    r.error().describe());
      return false;
    }
    ++member_events_dropped;  // a full mailbox: this change is missed, the next ones still go
    return true;
  }

  void deliver(const member_changed& m) {
    std::size_t gone = 0;
    std::erase_if(member_subscribers, [&](const member_subscriber& s) {
      const bool keep = send_change(s, m);
      gone += keep ? 0 : 1;
      return !keep;
    });
    if (gone > 0) {
      std::lock_guard lock(mu);
      member_subscriptions -= gone;
    }
  }

  void on_subscribe(const ev_subscribe& e) {
    if (e.system == nullptr) {
      const auto n = std::erase_if(member_subscribers,
                                   [&](const member_subscriber& s) { return s.who == e.who; });
      std::lock_guard lock(mu);
      member_subscriptions -= n;
      return;
    }
    member_subscriber s{e.system, e.who};
    bool alive = send_change(s, changed_of(self, member_status::alive,
                                           core->membership().incarnation(), self_address, true));
    for (const auto& [id, m] : core->membership().members()) {
      if (!alive) break;
      alive = send_change(s, changed_of(id, m.status, m.incarnation, m.address, true));
    }
    if (alive) {
      member_subscribers.push_back(std::move(s));
    } else {
      std::lock_guard lock(mu);
      --member_subscriptions;
    }
  }

  // ------------------------------------------------------------------ bandwidth probing
  /// One bandwidth probe at a time, to each live peer in turn: first as soon as its capabilities
  /// are known, then every 30 s (10 s after a failure).
  void bandwidth_round(std::uint64_t now) {
    for (auto& r : prober->take_results()) {
      if (r.mbps > 0) {
        core->set_bandwidth(r.peer, r.mbps, r.backend, r.rtt_us);
        next_bandwidth_ms[r.peer] = now + 30'000;
      } else {
        spdlog::debug("node {}: bandwidth probe to {:016x} failed: {}", hex, r.peer, r.error);
        next_bandwidth_ms[r.peer] = now + 10'000;
      }
    }
    if (prober->busy()) return;
    const auto live = core->live_members();
    std::erase_if(next_bandwidth_ms, [&](const auto& e) {
      return std::find(live.begin(), live.end(), e.first) == live.end();
    });
    for (member_id id : live) {
      const auto* caps_of = core->peer_caps(id);
      auto k = known.find(id);
      auto& next = next_bandwidth_ms[id];
      if (caps_of == nullptr || k == known.end() || now < next) continue;
      next = now + 10'000;  // until the result says otherwise
      if (prober->start(id, k->second.hex, backend_kind_for(*caps_of))) return;
    }
  }

  // ------------------------------------------------------------------ inbound
  void on_message(ctl::inbound_message& m) {
    const auto now = now_ms();
    const member_id from = member_of(m.sender);
    const auto type = static_cast<runtime_msg>(m.type);
    if (core->on_message(from, m.sender, type, std::string_view(m.body.data(), m.body.size()), now))
      return;
    switch (type) {
      case runtime_msg::bulk_offer:
      case runtime_msg::bulk_answer: {
        auto b = unpack<bulk_setup_message>(std::string_view(m.body.data(), m.body.size()));
        if (!b || from == no_member) break;
        if (type == runtime_msg::bulk_offer) {
          if (core->is_member(from)) prober->on_offer(from, m.sender, *b);
        } else {
          prober->on_answer(from, *b);
        }
        return;
      }
      case runtime_msg::group_link:
        if (engine) engine->on_group_link(from, std::string_view(m.body.data(), m.body.size()));
        return;
      case runtime_msg::model_share:
        // Only members share model bytes (an offer names the fetcher by the link it came on).
        if (engine && from != no_member && core->is_member(from))
          engine->on_share(m.sender, std::string_view(m.body.data(), m.body.size()));
        return;
      case runtime_msg::status_request: {
        auto reply_to = unpack<std::string>(std::string_view(m.body.data(), m.body.size()));
        if (!reply_to) break;
        // A member asks over its own link (its dashboard): answer there. A status client is not
        // a member: add it as a control peer for the reply (it is dropped again when its link
        // goes down).
        if (from != no_member && core->is_member(from) && added.contains(m.sender)) {
          // its link is ours already
        } else if (control_peer_endpoint(m.sender) == *reply_to) {
          // introduced itself already
        } else if (auto r = control->add_peer(m.sender, *reply_to); !r) {
          spdlog::warn("node {}: status client {}: {}", hex, m.sender, r.error().describe());
          return;
        }
        const std::string doc = status_json().dump();
        (void)control->send(m.sender, static_cast<std::uint16_t>(runtime_msg::status_reply),
                            bytes_of(pack(doc)));
        return;
      }
      case runtime_msg::status_reply: {
        // A member's answer to ask_cluster_status (nobody else gets our status requests).
        auto doc = unpack<std::string>(std::string_view(m.body.data(), m.body.size()));
        if (!doc || from == no_member || !core->is_member(from)) break;
        const auto at = real_ms();
        std::lock_guard lock(cluster_mu);
        // Bounded by the members that answer within a minute (the answers of gone ones age out).
        std::erase_if(cluster_docs, [&](const auto& e) { return at - e.second.second > 60'000; });
        cluster_docs[m.sender] = {std::move(*doc), at};
        cluster_cv.notify_all();
        return;
      }
      default:
        break;
    }
    ++undecodable;
  }

  void on_peer(const ctl::peer_event& ev) {
    if (!is_hex_id(ev.peer)) {
      // A status client (or a seed placeholder) whose link went down: forget it.
      if (ev.kind == ctl::peer_event_kind::down && !seeds.contains(ev.peer))
        (void)control->remove_peer(ev.peer);
      return;
    }
    if (ev.kind != ctl::peer_event_kind::up) return;
    if (ev.peer == hex) return;
    // A peer introduced itself (we may have dialled it as a seed): learn its endpoint from the
    // control plane and join it through membership.
    const std::string ep = control_peer_endpoint(ev.peer);
    if (ep.empty()) return;
    const member_id id = member_of(ev.peer);
    added.insert(ev.peer);  // the control plane added it itself
    for (auto s = seeds.begin(); s != seeds.end();) {
      if (same_listener(s->second, ep)) {
        (void)control->remove_peer(s->first);
        s = seeds.erase(s);
      } else {
        ++s;
      }
    }
    if (!core->is_member(id)) {
      known[id] = known_peer{ev.peer, ep};
      core->join(id, ev.peer + "@" + ep, now_ms());
    }
  }

  void on_hint(const peer_hint& h) {
    if (h.control.empty()) return;
    const std::string ep = tcp_endpoint(h.control.front());
    if (ep == endpoint) return;
    if (!h.node_id.empty()) {
      if (h.node_id == hex) return;
      const member_id id = member_of(h.node_id);
      if (id == no_member) return;
      // Hints are rumours (mDNS is unauthenticated): a flood of invented ids must not grow the
      // table without bound. Members we already know are always updated.
      if (!known.contains(id) && known.size() >= kMaxKnownPeers) {
        ++hints_dropped;
        return;
      }
      // A rumour never re-points a peer we already reach (learn() has the rule).
      if (auto k = known.find(id); k != known.end() && k->second.endpoint != ep) return;
      known[id] = known_peer{h.node_id, ep};
      ensure_peer(h.node_id, ep, /*move=*/false);
      core->join(id, h.node_id + "@" + ep, now_ms());
      return;
    }
    // A seed: the node id is learnt when the peer introduces itself over the control plane.
    for (const auto& [id, k] : known)
      if (same_listener(k.endpoint, ep)) return;
    std::string placeholder =
        "seed-" + h.control.front().host + "-" + std::to_string(h.control.front().port);
    std::replace_if(
        placeholder.begin(), placeholder.end(),
        [](char c) {
          return !(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_');
        },
        '_');
    if (seeds.contains(placeholder)) return;
    if (auto r = control->add_peer(placeholder, ep); r) {
      seeds[placeholder] = ep;
    } else {
      spdlog::warn("node {}: seed {}: {}", hex, ep, r.error().describe());
    }
  }

  // ------------------------------------------------------------------ the control actor's turns
  /// One event from another thread (control_actor's handler).
  void handle(event& e) {
    if (stopped()) return;
    if (auto* m = std::get_if<ev_message>(&e)) {
      on_message(m->msg);
    } else if (auto* p = std::get_if<ev_peer>(&e)) {
      on_peer(p->ev);
    } else if (auto* h = std::get_if<ev_hint>(&e)) {
      on_hint(h->hint);
    } else if (auto* sub = std::get_if<ev_subscribe>(&e)) {
      on_subscribe(*sub);
    } else {
      core->leave(now_ms());
      std::lock_guard lock(mu);
      left = true;
      stopping = true;
      cv.notify_all();
    }
  }

  /// The core's timers, bandwidth probes and the status snapshot: after every turn whose
  /// deadline passed, and on the actor's timer.
  void tick() {
    if (stopped()) return;
    fail_if_asked();
    const auto now = now_ms();
    core->tick(now);
    if (failed) return;
    bandwidth_round(now);
    ask_cluster_status();
    if (now >= next_snapshot_ms) {
      std::string doc = status_json().dump();
      std::lock_guard lock(snapshot_mu);
      snapshot = std::move(doc);
      next_snapshot_ms = now + kSnapshotMs;
    }
  }

  /// Real milliseconds until tick() has work: the core's next deadline or the snapshot's, and
  /// 100 ms at most (bandwidth results and clock faults are looked at then).
  [[nodiscard]] std::uint64_t next_tick_in_ms() {
    const auto now = now_ms();
    const std::uint64_t wake = std::min(core->next_wake(), next_snapshot_ms);
    return wake <= now ? 0 : std::min<std::uint64_t>(real_wait_ms(wake - now), 100);
  }

  [[nodiscard]] bool stopped() {
    std::lock_guard lock(mu);
    return stopping;
  }

  /// `tessera fault crash <this node> control`: the control actor fails here (its handler
  /// throws), as a bug would make it; its supervisor restarts it.
  void fail_if_asked() {
    std::uint64_t asked = 0;
    injector->update([&](const transport::faults::fault_policy& pol) {
      asked = pol.crashes_requested(hex, "control");
    });
    if (asked <= crash_requests_seen) return;
    crash_requests_seen = asked;
    throw std::runtime_error("tessera fault crash: the control actor fails on request");
  }

  /// A restarted control actor's core: the election's durable state read back from the data
  /// directory (what a crash leaves), a new membership incarnation (the cluster's record of the
  /// old one is refuted at once), and every peer it knew joined again.
  void remake_core() {
    core_options o = core_base;
    auto restored = read_election_state(dir->path() / opt.election_state_file);
    if (!restored) {
      fail(
          fmt::format("the restarted control actor cannot go on: {}", restored.error().describe()));
      return;
    }
    o.restored = *restored;
    o.incarnation = static_cast<std::uint64_t>(unix_ms());
    o.membership_seed ^= o.incarnation;
    o.election_seed ^= o.incarnation;
    o.caps = caps;
    auto c = control_core::create(std::move(o), *this);
    if (!c) {
      fail(fmt::format("cannot remake the control core: {}", c.error().describe()));
      return;
    }
    core = std::move(c).value();
    core->start(now_ms());
    for (const auto& [id, k] : known)
      core->join(id, k.hex + "@" + k.endpoint, now_ms());
  }

  // ------------------------------------------------------------------ status document
  /// The control plane's counters: what arrived, and every frame refused by reason (malformed,
  /// truncated, oversized, ... from any peer, the cluster's own included), so an operator sees a
  /// hostile or broken peer.
  json control_json() const {
    const auto st = control->stats();
    json rejected = json::object();
    for (std::size_t r = 1; r < transport::control::kRejectReasonCount; ++r)
      rejected[std::string(transport::control::to_string(
          static_cast<transport::control::reject_reason>(r)))] = st.rejected[r];
    return {{"frames_received", st.frames_received},
            {"frames_sent", st.frames_sent},
            {"rejected", rejected},
            {"handshakes_refused", st.zap_denied + st.handshake_failed_inbound}};
  }

  /// The fault layer's state (what `tessera fault` changed) and what it did to our frames.
  json faults_json() const {
    const auto st = control->stats();
    json f = {{"commands_applied", st.fault_commands},
              {"commands_refused", st.fault_commands_refused},
              {"frames_dropped", st.fault_dropped},
              {"frames_delayed", st.fault_delayed},
              {"frames_duplicated", st.fault_duplicated}};
    json cuts = json::array();
    json rules = json::array();
    json clocks = json::array();
    injector->update([&](const transport::faults::fault_policy& pol) {
      for (const auto& [node, c] : pol.clocks())
        clocks.push_back({{"node", node}, {"rate", c.rate}, {"bump_ms", c.bump_ns / 1'000'000}});
      for (const auto& [from, to] : pol.cuts())
        cuts.push_back({{"from", from}, {"to", to}});
      for (const auto& [pair, r] : pol.rules())
        rules.push_back({{"from", pair.first},
                         {"to", pair.second},
                         {"drop", r.drop},
                         {"delay_ms", static_cast<double>(r.delay.count()) / 1e6},
                         {"jitter_ms", static_cast<double>(r.jitter.count()) / 1e6},
                         {"duplicate", r.duplicate},
                         {"reorder", r.reorder}});
    });
    f["partitions"] = cuts;
    f["rules"] = rules;
    f["clocks"] = clocks;
    {
      std::lock_guard g(clock_mu);
      const auto real = real_ms();
      f["clock"] = {{"rate", pclock.rate()}, {"offset_ms", pclock.offset_ms(real)}};
    }
    return f;
  }

  json status_json() const {
    json j;
    j["format"] = 1;
    j["node"] = {{"id", hex},
                 {"endpoint", endpoint},
                 {"advertise", {{"address", advertise.address}, {"source", advertise.source}}},
                 {"started_unix_ms", instance.started_unix_ms},
                 {"instance_nonce", fmt::format("{:016x}", instance.nonce)},
                 {"pid", caps.pid},
                 {"hostname", caps.hostname},
                 {"host_id", caps.host_id},
                 {"link_dead_after_ms", link_dead_after_ms}};
    {
      const auto& cfg = opt.config;
      j["node"]["client_endpoints"] = {
          {"address", cfg.listen.client_address},
          {"auth", cfg.client_auth},
          {"reachable_from_other_hosts", !is_loopback_address(cfg.listen.client_address)}};
      json warnings = json::array();
      if (auto w = insecure_clients_warning(cfg)) warnings.push_back(*w);
      if (auto w = descriptor_warning(descriptor_limit)) warnings.push_back(*w);
      j["node"]["warnings"] = warnings;
      j["node"]["descriptors"] = {{"limit", static_cast<std::uint64_t>(descriptor_limit)},
                                  {"open", open_descriptors()}};
    }
    j["faults"] = faults_json();
    j["control"] = control_json();
    core->status_into(j, endpoint);
    j["serving"] = engine ? engine->status() : json(nullptr);
    auto& st = j["stats"];
    st["undecodable"] = core->counters().undecodable + undecodable;
    st["dropped_events"] = dropped_events.load();
    st["hints_dropped"] = hints_dropped;
    st["member_subscribers"] = member_subscribers.size();
    st["member_events_sent"] = member_events_sent;
    st["member_events_dropped"] = member_events_dropped;
    json threads = json::object();
    std::size_t total = 0;
    for (const auto& [role, n] : thread_roles()) {
      threads[role] = n;
      total += n;
    }
    j["threads"] = {{"total", total}, {"by_role", threads}};
    json actor_list = json::array();
    for (const auto& a : actors->named_actors()) {
      json one = {{"name", a.name}, {"queued", a.queued}, {"handled", a.handled}};
      if (a.name == "control") one["restarts"] = control_restarts.load();
      actor_list.push_back(std::move(one));
    }
    j["actors"] = actor_list;
    return j;
  }
};

/// The node's control actor: every event of the control plane, discovery and subscriptions is
/// one of its messages, handled one at a time on the actor system's worker, so the core and the
/// node's link tables need no locks. Its one timer is re-armed after each turn for the core's
/// next deadline.
class control_actor_t final : public actors::actor {
 public:
  explicit control_actor_t(node_runtime::impl& p) : p_(p) {}

  void on_start() override {
    on<node_runtime::impl::node_event>([this](node_runtime::impl::node_event& m) {
      if (m.frame) --p_.queued_frames;
      p_.handle(m.e);
      after_turn();
    });
    on<node_runtime::impl::node_tick>([this](node_runtime::impl::node_tick&) {
      armed_.reset();
      p_.tick();
      after_turn();
    });
    if (p_.control_instances++ == 0) {
      p_.core->start(p_.now_ms());
    } else {
      const auto n = ++p_.control_restarts;
      spdlog::warn(
          "node {}: control actor restarted by its supervisor (restart {}): core "
          "remade from the election state on disk",
          p_.hex, n);
      p_.remake_core();
    }
    std::vector<node_runtime::impl::node_event> early;
    {
      std::lock_guard lock(p_.mu);
      early.swap(p_.early);
      p_.actor_running = true;
      p_.control_actor = self();
      p_.queued_frames = 0;  // what the failed instance held is gone
    }
    for (auto& m : early) {
      if (m.frame) --p_.queued_frames;
      p_.handle(m.e);
    }
    after_turn();
  }

 private:
  void after_turn() {
    if (p_.failed || p_.stopped()) return;
    auto in_ms = p_.next_tick_in_ms();
    if (in_ms == 0) {
      p_.tick();
      in_ms = std::max<std::uint64_t>(1, p_.next_tick_in_ms());
    }
    const auto due = now() + std::chrono::milliseconds(in_ms);
    // A tick a second overdue is not on its way (timers go on the control lane, served first):
    // it was refused by a full lane (counted, logged). Without a new one, a node whose peers all
    // fell silent would never tick again.
    if (armed_ && armed_->first + std::chrono::seconds(1) < now()) armed_.reset();
    if (armed_ && armed_->first <= due) return;  // an earlier tick is on its way
    if (armed_) cancel_timer(armed_->second);
    armed_.emplace(due, after(std::chrono::milliseconds(in_ms), node_runtime::impl::node_tick{}));
  }

  void on_stop(const actors::exit_reason& why) override {
    if (why.abnormal()) spdlog::error("node {}: control actor failed: {}", p_.hex, why.describe());
  }

  node_runtime::impl& p_;
  std::optional<std::pair<actors::clock::time_point, actors::timer_id>> armed_;
};

/// Watches the control actor's supervisor: when it gives up (more failures than its restart
/// bound allows), the node stops with the reason instead of running without its control.
class control_watch_t final : public actors::actor {
 public:
  control_watch_t(node_runtime::impl& p, actors::actor_ref supervisor)
      : p_(p), supervisor_(std::move(supervisor)) {}
  void on_start() override {
    on<actors::down>([this](actors::down& d) {
      if (d.reason.abnormal())
        p_.fail(fmt::format("the control actor kept failing; its supervisor gave up: {}",
                            d.reason.describe()));
    });
    (void)monitor(supervisor_);
  }

 private:
  node_runtime::impl& p_;
  actors::actor_ref supervisor_;
};

node_runtime::node_runtime(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

node_runtime::~node_runtime() {
  if (!impl_) return;
  // The gateway's threads read the snapshot and ask the engine's endpoints: it goes first.
  if (impl_->gateway) impl_->gateway->stop(0);
  if (impl_->engine) impl_->engine->stop();
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->actors) impl_->actors->shutdown(std::chrono::nanoseconds(0));
  if (impl_->prober) impl_->prober->stop();
  for (auto& s : impl_->sources)
    s->stop();
  if (impl_->control) impl_->control->stop();
}

namespace {

/// The bearer token in `path`: its first line, surrounding white space trimmed. The error names
/// the file. Read like the cluster secret: a key others may read is refused (anyone on the host
/// could then use the API).
result<std::string> read_api_key(const std::string& path) {
  auto text = ctl::read_private_text_file(path, "http.api_key_file");
  if (!text) return text.error();
  const std::string line = text->substr(0, text->find('\n'));
  const auto first = line.find_first_not_of(" \t\r\n");
  const auto last = line.find_last_not_of(" \t\r\n");
  if (first == std::string::npos)
    return make_error(errc::invalid_argument, "http.api_key_file {}: the first line is empty",
                      path);
  return line.substr(first, last - first + 1);
}

/// The HTTP gateway: API requests go to this peer's own client endpoint (over loopback when it
/// listens on every address), the status comes from the control actor's snapshot.
result<std::unique_ptr<http::gateway>> start_gateway(node_runtime::impl& p,
                                                     const ctl::cluster_keys& keys) {
  const auto& cfg = p.opt.config;
  http::gateway_options go;
  if (cfg.client_auth) go.client_access = keys.access;
  go.bind_address = cfg.listen.http_address;
  go.cors_origins = cfg.http.cors_origins;
  go.port = cfg.listen.http_port;
  go.threads = std::min(go.threads, budget_of(p.descriptor_limit).http_threads);
  if (!cfg.http.api_key_file.empty()) {
    auto key = read_api_key(cfg.http.api_key_file);
    if (!key) return key.error();
    go.api_key = std::move(*key);
  }
  // Our own endpoints: where they are bound (an advertised address may be a NAT's).
  const std::string host =
      cfg.listen.client_address == "0.0.0.0" ? "127.0.0.1" : cfg.listen.client_address;
  go.peers.push_back({host, p.engine->request_port(), p.engine->response_port()});
  const node_runtime::impl* raw = &p;
  go.status = [raw] { return raw->status_snapshot(); };
  go.cluster_status = [raw] { return raw->cluster_status(); };
  return http::gateway::start(std::move(go));
}

}  // namespace

result<std::unique_ptr<node_runtime>> node_runtime::start(runtime_options options) {
  auto p = std::make_unique<impl>();
  p->opt = std::move(options);
  // A config built in code rather than by resolve_config (tests, library users) may leave the
  // client address empty: the endpoints then bind where the control plane does, as they did
  // before the setting existed.
  if (p->opt.config.listen.client_address.empty())
    p->opt.config.listen.client_address = p->opt.config.listen.address;
  const node_config& cfg = p->opt.config;

  // The secret first: without it nothing else may happen (no identity file created either).
  std::optional<std::string> key_file;
  if (!cfg.cluster_key_file.empty()) key_file = cfg.cluster_key_file;
  auto secret = ctl::load_cluster_secret(key_file);
  if (!secret) {
    if (secret.error().code == errc::not_found)
      return make_error(errc::unauthorized,
                        "no cluster secret: pass --cluster-key FILE or set {} (create one with "
                        "`tessera keygen`)",
                        ctl::kClusterKeyEnv);
    return secret.error();
  }
  auto keys = ctl::derive_cluster_keys(*secret);
  if (!keys) return keys.error();

  auto dir = data_dir::open(cfg.data_dir, data_dir_options{cfg.reset_identity});
  if (!dir) return dir.error();
  p->dir.emplace(std::move(dir).value());
  if (!p->dir->warning().empty()) spdlog::warn("{}", p->dir->warning());
  p->descriptor_limit = raise_descriptor_limit();
  if (auto w = descriptor_warning(p->descriptor_limit)) spdlog::warn("{}", *w);
  p->hex = p->dir->id().to_string();
  p->self = p->dir->id().lo;

  // Restore the election's durable state.
  auto restored = read_election_state(p->dir->path() / p->opt.election_state_file);
  if (!restored) return restored.error();

  // Control plane.
  ctl::node_config cc;
  cc.node_id = p->hex;
  cc.transient_prefix = std::string(status_client_prefix);
  cc.bind_endpoint = fmt::format("tcp://{}:{}", cfg.listen.address, cfg.listen.control_port);
  {
    auto adv = choose_advertise_address({.advertise = cfg.listen.advertise,
                                         .listen_address = cfg.listen.address,
                                         .seeds = cfg.discovery.seeds,
                                         .beacon_interface = cfg.discovery.beacon_interface});
    if (!adv) return adv.error();
    p->advertise = std::move(*adv);
  }
  const std::string adv_host = p->advertise.address;
  cc.keys = *keys;
  // The fault layer is always in: `tessera fault` changes a live cluster without restarts. It
  // judges frames between members only: the operator's own channel (status and fault clients,
  // whose ids are not node ids) must keep working inside any partition it sets up.
  p->injector = std::make_shared<transport::faults::fault_injector>(std::random_device{}());
  {
    auto hooks = ctl::make_fault_hooks(p->injector, p->hex);
    auto member_decide = std::move(hooks.decide);
    hooks.decide = [member_decide](std::string_view to, std::int64_t now_ns,
                                   std::array<std::int64_t, 2>& due_ns) -> std::uint8_t {
      if (!is_hex_id(to)) {
        due_ns[0] = now_ns;
        return 1;
      }
      return member_decide(to, now_ns, due_ns);
    };
    cc.faults = std::move(hooks);
  }
  // A control link is declared down (and redialled) after this much silence: never sooner than a
  // suspected peer may still refute (the suspicion timeout), so that clusters configured with long
  // timeouts (slow or lossy networks, sanitizer builds) do not redial links to peers membership
  // still counts; 1 s at least, the link's own liveness floor.
  cc.timing.heartbeat_interval_ms = 100;
  cc.timing.dead_after_ms = std::max<std::uint32_t>(1000, cfg.timeouts.suspect_timeout_ms);
  p->link_dead_after_ms = cc.timing.dead_after_ms;
  cc.timing.backoff_max_ms = 1000;
  impl* raw = p.get();
  ctl::node_handlers handlers;
  handlers.on_message = [raw](ctl::inbound_message&& m) {
    raw->push(impl::ev_message{std::move(m)}, true);
  };
  handlers.on_peer_event = [raw](const ctl::peer_event& e) { raw->push(impl::ev_peer{e}, false); };
  if (cfg.listen.control_port != 0) {
    cc.advertise_endpoint = fmt::format("tcp://{}:{}", adv_host, cfg.listen.control_port);
  }
  auto control = ctl::control_node::start(cc, handlers);
  if (!control) return control.error();
  p->control = std::move(control).value();
  p->endpoint = p->control->endpoint();
  if (cfg.listen.control_port != 0) p->endpoint = cc.advertise_endpoint;
  p->self_address = p->hex + "@" + p->endpoint;

  p->bulk_caps = transport::bulk::probe_capabilities();
  // The bulk port: every tcp bulk link of this node (split groups, model shares, bandwidth
  // probes) listens on it, so a firewall needs one known port. Bound now so that a taken port
  // fails the start with a clear error; 0 keeps a port per link (ephemeral).
  {
    auto held = transport::bulk::reserve_bulk_port(cfg.listen.address, cfg.listen.bulk_port);
    if (!held) return held.error();
    p->bulk_port_hold = std::move(held).value();
  }
  {
    ctl::control_node* cn = p->control.get();
    p->prober = std::make_unique<bandwidth_prober>(
        transport::bulk::link_addresses{cfg.listen.address, adv_host, cfg.listen.bulk_port},
        [cn](const std::string& peer, std::uint16_t type, const std::string& body) {
          (void)cn->send(peer, type, bytes_of(body));
        },
        static_cast<std::uint16_t>(runtime_msg::bulk_offer),
        static_cast<std::uint16_t>(runtime_msg::bulk_answer));
  }
  p->caps = local_caps(cfg, p->hex, p->opt.version, p->bulk_caps);

  // Serving: the models and the client endpoints. A model that does not load stops the node
  // with the error naming the file (better than joining the mesh unable to serve it).
  {
    serving::engine_options so;
    so.node_hex = p->hex;
    so.self = p->self;
    so.model_paths = cfg.model_paths;
    so.threads = cfg.threads != 0 ? cfg.threads : std::max(1u, std::thread::hardware_concurrency());
    so.max_batch_streams = cfg.max_batch_streams;
    so.client_connections_per_address = cfg.client_connections_per_address;
    so.client_connections_total = budget_of(p->descriptor_limit).client_connections;
    so.compute_nice = static_cast<int>(cfg.compute_nice);
    so.bind_address = cfg.listen.address;
    so.advertise_address = adv_host;
    so.bulk_port = cfg.listen.bulk_port;
    so.client_bind_address = cfg.listen.client_address;
    so.request_port = cfg.listen.client_request_port;
    so.response_port = cfg.listen.client_response_port;
    so.bulk_caps = p->bulk_caps;
    so.faults = p->injector;
    so.on_load_progress = p->opt.on_model_load;
    ctl::control_node* cn = p->control.get();
    so.send_group_link = [cn](const std::string& peer_hex, std::string body) {
      (void)cn->send(peer_hex, static_cast<std::uint16_t>(runtime_msg::group_link), bytes_of(body));
    };
    so.send_share = [cn](const std::string& peer_hex, std::string body) {
      (void)cn->send(peer_hex, static_cast<std::uint16_t>(runtime_msg::model_share),
                     bytes_of(body));
    };
    so.fetch_models = cfg.fetch_models;
    so.fetch_dir = (fs::path(cfg.data_dir) / "models").string();
    so.on_fetch_progress = p->opt.on_model_fetch;
    if (cfg.client_auth) {
      so.client_auth = serving::engine_options::client_auth_keys{keys->client_endpoint,
                                                                 keys->access.client.public_key};
    }
    auto eng = serving::engine::start(so);
    if (!eng) return eng.error();
    p->engine = std::move(*eng);
    for (const auto& m : p->engine->models())
      p->caps.model_specs.push_back(m.spec);
    p->caps.client_endpoint = fmt::format("{}:{}:{}", client_host_for_peers(cfg, adv_host),
                                          p->engine->request_port(), p->engine->response_port());
  }
  if (cfg.http.enabled) {
    auto g = start_gateway(*p, *keys);
    if (!g) return g.error();
    p->gateway = std::move(*g);
  }

  // State machines: the control core, configured from the node's settings as the simulator's
  // nodes are (control_settings_for).
  core_options co;
  co.self = p->self;
  co.self_address = p->self_address;
  co.hex = p->hex;
  co.settings = control_settings_for(cfg);
  co.membership_seed = std::random_device{}() ^ p->self;
  co.election_seed = std::random_device{}() ^ (p->self * 31);
  co.incarnation = static_cast<std::uint64_t>(unix_ms());
  co.restored = *restored;
  co.caps = p->caps;
  p->core_base = co;
  auto core = control_core::create(std::move(co), *p);
  if (!core) return core.error();
  p->core = std::move(core).value();

  // Discovery.
  auto seeds = seed_source::create(cfg.discovery.seeds);
  if (!seeds) return seeds.error();
  p->sources.push_back(std::move(seeds).value());
  if (cfg.discovery.beacon) {
    beacon_options bo;
    bo.cluster_id = keys->cluster_id;
    bo.node_id = p->hex;
    bo.control_port =
        static_cast<std::uint16_t>(std::stoi(p->endpoint.substr(p->endpoint.rfind(':') + 1)));
    bo.advertise_host = adv_host;
    bo.interface_name = cfg.discovery.beacon_interface;
    bo.address = cfg.discovery.beacon_address;
    bo.port = cfg.discovery.beacon_port;
    bo.interval_ms = cfg.discovery.beacon_interval_ms;
    bo.key = derive_beacon_key(secret->bytes);
    auto b = beacon_source::create(bo);
    if (!b) return b.error();
    p->sources.push_back(std::move(b).value());
  }
  if (cfg.discovery.mdns) {
    mdns_options mo;
    mo.cluster_id = keys->cluster_id;
    mo.node_id = p->hex;
    mo.control_port =
        static_cast<std::uint16_t>(std::stoi(p->endpoint.substr(p->endpoint.rfind(':') + 1)));
    auto s = mdns_source::create(mo);
    if (!s) return s.error();
    p->sources.push_back(std::move(s).value());
  }

  spdlog::info("node {}: control {} (cluster {}), data dir {}", p->hex, p->endpoint,
               keys->cluster_id, p->dir->path().string());
  if (p->advertise.loopback_only) {
    spdlog::warn(
        "advertising {} ({}): peers on other hosts cannot reach this node; pass "
        "--advertise ADDRESS",
        adv_host, p->advertise.source);
  } else {
    spdlog::info("advertising {} to peers ({}); binding {}", adv_host, p->advertise.source,
                 cfg.listen.address);
  }
  if (auto w = insecure_clients_warning(cfg)) spdlog::warn("{}", *w);
  p->instance.id = p->dir->id();
  p->instance.control_endpoint = p->endpoint;
  p->instance.started_unix_ms = unix_ms();
  p->instance.nonce =
      (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  {
    // The control actor on its own actor system: one worker (`actor-0`), mailbox above the
    // frames' bound so that peer events and hints always fit.
    actors::config ac;
    ac.workers = 1;
    ac.data_capacity = kMaxQueuedEvents + 1024;
    p->actors = std::make_unique<actors::actor_system>(ac);
    // Supervised: a control actor that fails (a handler throws) is restarted with its core
    // remade from the durable election state, at most 3 times in 5 s.
    actors::child_spec child;
    child.name = "control";
    child.make = [raw] { return std::make_unique<control_actor_t>(*raw); };
    child.options.data_capacity = ac.data_capacity;
    auto sup = p->actors->spawn(
        std::make_unique<actors::supervisor>(actors::supervisor_spec{},
                                             std::vector<actors::child_spec>{std::move(child)}),
        actors::spawn_options{.name = "control-supervisor"});
    if (!sup)
      return make_error(sup.error().code, "cannot start the control actor: {}",
                        sup.error().message);
    auto watch = p->actors->spawn(std::make_unique<control_watch_t>(*raw, *sup));
    if (!watch)
      return make_error(watch.error().code, "cannot start the control actor's watch: {}",
                        watch.error().message);
    // The duplicate-identity check: 1 s and 5 s from now, an actor beside the control actor.
    identity_check_options io;
    io.self = p->instance;
    io.hex = p->hex;
    io.endpoint = p->endpoint;
    io.data_dir = p->dir->path().string();
    io.seeds = cfg.discovery.seeds;
    io.client.keys = *keys;
    io.client.bind_address =
        is_address_of_this_host(adv_host) ? adv_host : std::string(cfg.listen.address);
    io.client.reply_address = adv_host;
    io.client.id_seed = p->instance.nonce;
    io.refuse = [raw](std::string why) { raw->fail(std::move(why)); };
    auto identity = p->actors->spawn(make_identity_check(std::move(io)),
                                     actors::spawn_options{.name = "identity"});
    if (!identity)
      return make_error(identity.error().code, "cannot start the duplicate-identity check: {}",
                        identity.error().message);
  }
  for (auto& s : p->sources) {
    auto r = s->start([raw](const peer_hint& h) { raw->push(impl::ev_hint{h}, false); });
    if (!r) {
      auto rt = std::unique_ptr<node_runtime>(new node_runtime(std::move(p)));
      return make_error(r.error().code, "discovery: {}", r.error().message);
    }
  }
  return std::unique_ptr<node_runtime>(new node_runtime(std::move(p)));
}

void node_runtime::leave_and_stop(std::uint32_t flush_ms) {
  // Streams first: each in-flight request ends with "unavailable", and its client resumes it on
  // another peer while this one is still announcing its leave.
  if (impl_->engine) impl_->engine->stop();
  if (!impl_->failed) impl_->push(impl::ev_leave{}, false);
  {
    std::unique_lock lock(impl_->mu);
    impl_->cv.wait_for(lock, std::chrono::milliseconds(flush_ms),
                       [&] { return impl_->left || impl_->stopping; });
  }
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->actors->shutdown(std::chrono::nanoseconds(0));
  // HTTP streams running here were resumed on other peers when the engine stopped (the gateway
  // is a pub-sub client); the mesh knows we left, so let them finish, within a bound.
  if (impl_->gateway) impl_->gateway->stop(kHttpDrainMs);
  impl_->prober->stop();
  for (auto& s : impl_->sources)
    s->stop();
  // Flush: wait (bounded) until the leave messages left the send queues.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(flush_ms);
  while (std::chrono::steady_clock::now() < end) {
    bool empty = true;
    for (const auto& p : impl_->control->peers())
      if (p.queued > 0 && p.state == transport::control::link_state::up) empty = false;
    if (empty) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // libzmq hands frames to the kernel asynchronously: give the I/O thread a moment (linger).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  impl_->control->stop();
}

bool node_runtime::failed() const {
  return impl_->failed;
}

std::string node_runtime::fatal_error() const {
  std::lock_guard lock(impl_->mu);
  return impl_->fatal;
}

result<void> node_runtime::subscribe_members(actors::actor_system& system,
                                             const actors::actor_ref& subscriber) {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopping)
      return make_error(errc::closed, "node {}: the runtime has stopped", impl_->hex);
    if (impl_->member_subscriptions >= kMaxMemberSubscribers)
      return make_error(errc::overloaded, "node {}: {} membership subscriptions already (the bound)",
                        impl_->hex, kMaxMemberSubscribers);
    ++impl_->member_subscriptions;
  }
  impl_->push(impl::ev_subscribe{&system, subscriber}, false);
  return ok();
}

void node_runtime::unsubscribe_members(const actors::actor_ref& subscriber) {
  impl_->push(impl::ev_subscribe{nullptr, subscriber}, false);
}

std::string node_runtime::node_id() const {
  return impl_->hex;
}
std::string node_runtime::endpoint() const {
  return impl_->endpoint;
}

}  // namespace tessera::mesh::runtime
