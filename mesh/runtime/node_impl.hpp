// node_runtime's insides (private to mesh/runtime): what the running node holds, and its parts'
// entry points. Three files define them, one concern each: runtime.cpp starts and stops the node
// (node_runtime's API), node_control.cpp is the control actor's side (events from the control
// plane, discovery and subscribers, the core's ticks, supervision), node_status.cpp writes the
// status document. Only the control actor's turns touch the core, the peer directory and the
// member feed; what other threads read is behind `mu`, `snapshot_mu`, `clock_mu` or atomics.
#pragma once

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
#include "mesh/runtime/cluster_docs.hpp"
#include "mesh/runtime/control_core.hpp"
#include "mesh/runtime/host.hpp"
#include "mesh/runtime/identity_check.hpp"
#include "mesh/runtime/member_feed.hpp"
#include "mesh/runtime/peer_directory.hpp"
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
using json = nlohmann::ordered_json;

struct node_runtime::impl final : control_port {
  // --- set at start, read-only afterwards ---
  runtime_options opt;
  std::optional<data_dir> dir;
  std::shared_ptr<void> bulk_port_hold;  // the shared bulk listener (listen.bulk_port), if any
  rlim_t descriptor_limit = 0;           // RLIMIT_NOFILE in force (raised at start)
  std::string hex;                       // our node id, 32 hex digits (control-plane id)
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

  [[nodiscard]] nlohmann::json status_snapshot() const;

  /// The members' status documents for the dashboard's /cluster (cluster_docs.hpp).
  cluster_docs members_docs{[this] { return real_ms(); }};

  /// The control actor's side: asks every live member while the dashboard reads.
  void ask_cluster_status();

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
  std::optional<peer_directory> directory;  // where peers listen, our links to them (at start)
  std::map<member_id, std::uint64_t> next_bandwidth_ms;  // when to (re)measure a link
  std::uint64_t undecodable = 0;         // the node's own message types (the core counts its own)
  std::optional<member_feed> feed;       // membership changes to subscribing actors (set at start)
  std::uint32_t link_dead_after_ms = 0;  // control links: silence before down (set at start)
  std::shared_ptr<transport::faults::fault_injector> injector;  // shared with the control plane
  mutable std::mutex clock_mu;  // guards pclock and clock_seen (now_ms() is called from any thread)
  mutable protocol_clock pclock;
  mutable transport::faults::clock_rule clock_seen;

  std::uint64_t real_ms() const;

  /// The protocols' time: real time unless `tessera fault clock` skews this node's clock.
  std::uint64_t now_ms() const;

  /// Real milliseconds until the protocols' clock moved `local_ms` (a fast clock: fewer).
  std::uint64_t real_wait_ms(std::uint64_t local_ms) const {
    std::lock_guard g(clock_mu);
    return pclock.real_wait(local_ms);
  }

  void push(event e, bool droppable);

  void fail(std::string why);

  // ------------------------------------------------------------------ control_port
  void send(member_id to, runtime_msg type, std::string body) override {
    (void)directory->send(to, static_cast<std::uint16_t>(type), body);
  }

  void learn(member_id id, const std::string& address, bool first_hand) override {
    directory->learn(id, address, first_hand);
  }

  void reply(member_id, std::string_view link, runtime_msg type, std::string body) override {
    (void)control->send(std::string(link), static_cast<std::uint16_t>(type), bytes_of(body));
  }

  bool persist(const std::string& bytes) override;

  std::int64_t mono_ns() override { return steady_ns(); }

  void on_member_event(const member_event& ev) override {
    deliver(changed_of(ev.id, ev.status, ev.incarnation, ev.address, false));
  }

  void serving_changed(serving_facts f) override;

  std::uint8_t backend_for(const topology::capabilities& c) override {
    return static_cast<std::uint8_t>(backend_kind_for(c));
  }

  /// The bulk backend a link to a peer with `c` uses (for the topology row and the probe alike).
  [[nodiscard]] transport::bulk::backend_kind backend_kind_for(
      const topology::capabilities& c) const {
    return transport::bulk::choose_backend(bulk_caps, {c.host_id, c.has_rdma});
  }

  void refresh_caps(topology::capabilities& c) override;

  // ------------------------------------------------------------------ membership subscribers
  member_changed changed_of(member_id id, member_status st, std::uint64_t incarnation,
                            const std::string& address, bool initial) const;

  void deliver(const member_changed& m);

  void on_subscribe(const ev_subscribe& e);

  // ------------------------------------------------------------------ bandwidth probing
  /// One bandwidth probe at a time, to each live peer in turn: first as soon as its capabilities
  /// are known, then every 30 s (10 s after a failure).
  void bandwidth_round(std::uint64_t now);

  // ------------------------------------------------------------------ inbound
  void on_message(ctl::inbound_message& m);

  void on_peer(const ctl::peer_event& ev) {
    auto j = directory->on_peer(ev, [this](member_id id) { return core->is_member(id); });
    if (j) core->join(j->first, j->second, now_ms());
  }

  void on_hint(const peer_hint& h) {
    if (auto j = directory->on_hint(h)) core->join(j->first, j->second, now_ms());
  }

  // ------------------------------------------------------------------ the control actor's turns
  /// One event from another thread (control_actor's handler).
  void handle(event& e);

  /// The core's timers, bandwidth probes and the status snapshot: after every turn whose
  /// deadline passed, and on the actor's timer.
  void tick();

  /// Real milliseconds until tick() has work: the core's next deadline or the snapshot's, and
  /// 100 ms at most (bandwidth results and clock faults are looked at then).
  [[nodiscard]] std::uint64_t next_tick_in_ms();

  [[nodiscard]] bool stopped() {
    std::lock_guard lock(mu);
    return stopping;
  }

  /// `tessera fault crash <this node> control`: the control actor fails here (its handler
  /// throws), as a bug would make it; its supervisor restarts it.
  void fail_if_asked();

  /// A restarted control actor's core: the election's durable state read back from the data
  /// directory (what a crash leaves), a new membership incarnation (the cluster's record of the
  /// old one is refuted at once), and every peer it knew joined again.
  void remake_core();

  // ------------------------------------------------------------------ status document
  /// The control plane's counters: what arrived, and every frame refused by reason (malformed,
  /// truncated, oversized, ... from any peer, the cluster's own included), so an operator sees a
  /// hostile or broken peer.
  json control_json() const;

  /// The fault layer's state (what `tessera fault` changed) and what it did to our frames.
  json faults_json() const;

  json status_json() const;
};

/// The control actor (hosting the core) and the watch on its supervisor (node_control.cpp).
[[nodiscard]] std::unique_ptr<actors::actor> make_control_actor(node_runtime::impl& p);
[[nodiscard]] std::unique_ptr<actors::actor> make_control_watch(node_runtime::impl& p,
                                                                actors::actor_ref supervisor);

}  // namespace tessera::mesh::runtime
