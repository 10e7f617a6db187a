// Topology: what each peer measured about its links, merged by the leader into one published
// view of the cluster. A pure state machine (no sockets, no clocks): the node runtime feeds it
// reports, membership/election facts and the time, and ships what it returns.
//
//   every peer                              leader                      every peer
//   probes its links (rtt, backend)         topology_state              on_view(view):
//   row_report ───────────────────────────► on_report ──► publish ────► adopts views with a
//   (its capabilities + measured links)     on_members      (view with    higher epoch only
//                                           on_leader       epoch)
//
// Epoch = (term, version), ordered lexicographically. A leader publishes with its own term and a
// version that only grows within the term, so any two views are ordered and every peer converges
// on the newest one. A new leader starts at version 1 of its (higher) term: its first view
// supersedes everything its predecessor published.
//
// When to publish (the view must change when members or links change, but measurement noise must
// not flood the cluster): a *structural* change — members joining or going dead/left, the leader,
// the set of directed links, a link's backend, a member's address or capabilities — publishes at
// the next maybe_publish; a change in measurements only (rtt, bandwidth moved by more than
// `significant_change`, relative) or alive <-> suspect flips publish at most once per refresh_ms.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "mesh/membership/ids.hpp"
#include "mesh/placement/placement.hpp"

namespace tessera::mesh::topology {

/// What a peer can do, exchanged with every other peer and carried in the view.
struct capabilities {
  std::string node_id;  ///< 32 hex digits
  std::string version;  ///< tessera version string
  std::uint32_t cores = 0;
  std::uint64_t memory_total_mb = 0;
  std::uint64_t memory_free_mb = 0;
  std::string host_id;  ///< boot id: equal hosts may use shm
  bool has_rdma = false;
  std::vector<std::string> rdma_devices;           ///< "device/port gid" entries
  std::vector<std::string> models;                 ///< model paths/names from the configuration
  std::vector<placement::model_spec> model_specs;  ///< the models loaded, for the leader's plan
  std::string client_endpoint;  ///< "host:request_port:response_port" clients connect to
  std::int64_t pid = 0;         ///< the node's process, for `tessera fault` on the same host
  std::string hostname;
  bool fetches_models = false;  ///< may be planned for models it has no file of (fetch_models)
  MSGPACK_DEFINE_MAP(node_id, version, cores, memory_total_mb, memory_free_mb, host_id, has_rdma,
                     rdma_devices, models, model_specs, client_endpoint, pid, hostname,
                     fetches_models);
  bool operator==(const capabilities&) const = default;
};

/// One directed link as measured by its source.
struct link_measure {
  member_id from = no_member;
  member_id to = no_member;
  std::uint64_t rtt_us = 0;   ///< median of the last probes; 0 = not measured yet
  double bandwidth_mbps = 0;  ///< MB/s, the best of the last probe's bursts; 0 = not measured
  std::uint8_t backend = 0;   ///< transport::bulk::backend_kind (1 tcp, 2 shm, 3 rdma)
  /// The bulk link's own small-message round trip (what a tensor-parallel all-reduce pays per
  /// step), median of the last probe's pings, in µs; 0 = not measured. rtt_us is the control
  /// plane's, through both nodes' loops.
  double bulk_rtt_us = 0;
  MSGPACK_DEFINE_MAP(from, to, rtt_us, bandwidth_mbps, backend, bulk_rtt_us);
  bool operator==(const link_measure&) const = default;
};

/// What one peer sends the leader: itself and its outgoing links.
struct row_report {
  member_id from = no_member;
  capabilities caps;
  std::vector<link_measure> links;  ///< every link has from == this report's from
  MSGPACK_DEFINE_MAP(from, caps, links);
};

/// One member in the view.
struct view_member {
  member_id id = no_member;
  std::uint8_t status = 0;  ///< member_status (alive, suspect, dead, left)
  std::string address;      ///< "hexid@tcp://host:port"
  capabilities caps;        ///< empty until the member reported
  MSGPACK_DEFINE_MAP(id, status, address, caps);
  bool operator==(const view_member&) const = default;
};

struct epoch {
  std::uint64_t term = 0;
  std::uint64_t version = 0;
  MSGPACK_DEFINE_MAP(term, version);
  auto operator<=>(const epoch&) const = default;
};

/// The cluster as published by the leader.
struct view {
  epoch at;
  member_id leader = no_member;
  std::vector<view_member> members;  ///< sorted by id, self (the leader) included
  std::vector<link_measure> links;   ///< sorted by (from, to); only between listed live members
  MSGPACK_DEFINE_MAP(at, leader, members, links);
  bool operator==(const view&) const = default;
};

struct topology_config {
  member_id self = no_member;
  std::uint32_t refresh_ms = 2'000;        ///< measurement-only changes publish at most this often
  double significant_change = 0.5;         ///< relative rtt/bandwidth change that counts
  std::size_t max_members = 128;           ///< members beyond are ignored (counted)
  std::size_t max_links_per_report = 128;  ///< a report with more links is refused (counted)
};

struct topology_counters {
  std::uint64_t reports_refused = 0;  ///< malformed or from a non-member
  std::uint64_t views_published = 0;
  std::uint64_t views_adopted = 0;
  std::uint64_t views_stale = 0;  ///< received with an epoch not newer than ours
  std::uint64_t members_refused = 0;
};

/// A member as membership reports it to the topology.
struct member_fact {
  member_id id = no_member;
  std::uint8_t status = 0;
  std::string address;
};

class topology_state {
 public:
  explicit topology_state(topology_config cfg);

  /// Leadership as election knows it now. Becoming leader at `term` starts a fresh version
  /// sequence (and a publication) from the view in force: its members' capabilities and links
  /// count as their rows until they report; losing it stops publishing.
  void on_leader(std::uint64_t term, member_id leader);
  /// Membership's current table (self included by the caller). Replaces the previous one.
  void on_members(std::vector<member_fact> members);
  /// A row from a peer (or our own). Refused (false) when malformed or not from a member.
  bool on_report(const row_report& report);
  /// Leader only: the view to publish now, if any (then it is also our current view).
  [[nodiscard]] std::optional<view> maybe_publish(std::uint64_t now_ms);
  /// A view from the leader. Adopted (true) when its epoch is newer than ours.
  bool on_view(const view& v);

  [[nodiscard]] const std::optional<view>& current() const { return current_; }
  [[nodiscard]] bool is_leader() const { return leader_ == cfg_.self && cfg_.self != no_member; }
  [[nodiscard]] const topology_counters& counters() const { return counters_; }

 private:
  [[nodiscard]] view build() const;
  [[nodiscard]] static bool same_structure(const view& a, const view& b);
  [[nodiscard]] bool measurements_moved(const view& a, const view& b) const;

  topology_config cfg_;
  std::uint64_t term_ = 0;
  member_id leader_ = no_member;
  bool fresh_term_ = false;  // became leader: publish at once
  std::uint64_t next_version_ = 1;
  std::uint64_t last_publish_ms_ = 0;
  std::vector<member_fact> members_;
  std::map<member_id, row_report> rows_;
  std::optional<view> current_;
  topology_counters counters_;
};

/// Live = alive or suspect (suspect members still have their links).
[[nodiscard]] bool is_live_status(std::uint8_t status) noexcept;

}  // namespace tessera::mesh::topology
