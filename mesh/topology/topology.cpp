#include "mesh/topology/topology.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

namespace tessera::mesh::topology {

bool is_live_status(std::uint8_t status) noexcept {
  return status <= 1;
}

topology_state::topology_state(topology_config cfg) : cfg_(std::move(cfg)) {}

void topology_state::on_leader(std::uint64_t term, member_id leader) {
  const bool was_leader = is_leader();
  if (term == term_ && leader == leader_) return;
  term_ = term;
  leader_ = leader;
  if (is_leader() && (!was_leader || term != (current_ ? current_->at.term : 0))) {
    fresh_term_ = true;
    // Versions restart per term, but never go back within one (a re-election in the same term
    // cannot happen: at most one leader per term).
    next_version_ = (current_ && current_->at.term == term) ? current_->at.version + 1 : 1;
    // Start from the view in force: its members' capabilities and links stand for their rows
    // until their own reports arrive (within a report period). Publishing a view without them
    // would plan without their models: a plan that serves nothing and drops every group split
    // over several peers — exactly what a leader change must not do (found by the simulator).
    if (current_) {
      rows_.clear();
      for (const auto& m : current_->members) {
        if (m.caps == capabilities{}) continue;
        row_report r{m.id, m.caps, {}};
        for (const auto& l : current_->links)
          if (l.from == m.id) r.links.push_back(l);
        rows_[m.id] = std::move(r);
      }
    }
  }
}

void topology_state::on_members(std::vector<member_fact> members) {
  std::sort(members.begin(), members.end(),
            [](const member_fact& a, const member_fact& b) { return a.id < b.id; });
  members.erase(
      std::unique(members.begin(), members.end(),
                  [](const member_fact& a, const member_fact& b) { return a.id == b.id; }),
      members.end());
  if (members.size() > cfg_.max_members) {
    counters_.members_refused += members.size() - cfg_.max_members;
    members.resize(cfg_.max_members);
  }
  members_ = std::move(members);
  // Forget rows of members that are gone from the table altogether.
  std::erase_if(rows_, [&](const auto& kv) {
    return std::none_of(members_.begin(), members_.end(),
                        [&](const member_fact& m) { return m.id == kv.first; });
  });
}

bool topology_state::on_report(const row_report& report) {
  const bool member = std::any_of(members_.begin(), members_.end(),
                                  [&](const member_fact& m) { return m.id == report.from; });
  bool ok = member && report.from != no_member && report.links.size() <= cfg_.max_links_per_report;
  if (ok) {
    for (const auto& l : report.links) {
      if (l.from != report.from || l.to == no_member || l.to == l.from || l.backend > 3 ||
          !std::isfinite(l.bandwidth_mbps) || l.bandwidth_mbps < 0) {
        ok = false;
        break;
      }
    }
  }
  if (!ok) {
    ++counters_.reports_refused;
    return false;
  }
  rows_[report.from] = report;
  return true;
}

view topology_state::build() const {
  view v;
  v.leader = leader_;
  std::set<member_id> live;
  for (const auto& m : members_) {
    view_member vm{m.id, m.status, m.address, {}};
    if (auto it = rows_.find(m.id); it != rows_.end()) vm.caps = it->second.caps;
    v.members.push_back(std::move(vm));
    if (is_live_status(m.status)) live.insert(m.id);
  }
  for (const auto& [from, row] : rows_) {
    if (!live.contains(from)) continue;
    for (const auto& l : row.links)
      if (live.contains(l.to)) v.links.push_back(l);
  }
  std::sort(v.links.begin(), v.links.end(), [](const link_measure& a, const link_measure& b) {
    return std::pair(a.from, a.to) < std::pair(b.from, b.to);
  });
  return v;
}

bool topology_state::same_structure(const view& a, const view& b) {
  if (a.leader != b.leader || a.members.size() != b.members.size() ||
      a.links.size() != b.links.size())
    return false;
  for (std::size_t i = 0; i < a.members.size(); ++i) {
    const auto& x = a.members[i];
    const auto& y = b.members[i];
    // alive <-> suspect is not structural: suspicion is transient (refuted within a probe round
    // on a loaded host) and must not flood the cluster with views; it is published with the next
    // refresh. Live <-> dead/left, addresses and capabilities are structural.
    const bool same_status =
        x.status == y.status || (is_live_status(x.status) && is_live_status(y.status));
    if (x.id != y.id || !same_status || x.address != y.address || x.caps != y.caps) return false;
  }
  for (std::size_t i = 0; i < a.links.size(); ++i) {
    const auto& x = a.links[i];
    const auto& y = b.links[i];
    if (x.from != y.from || x.to != y.to || x.backend != y.backend) return false;
    // A link that gets its first measurement is a structural change (it was unknown before).
    if ((x.rtt_us == 0) != (y.rtt_us == 0)) return false;
    if ((x.bandwidth_mbps == 0) != (y.bandwidth_mbps == 0)) return false;
  }
  return true;
}

bool topology_state::measurements_moved(const view& a, const view& b) const {
  for (std::size_t i = 0; i < a.members.size() && i < b.members.size(); ++i)
    if (a.members[i].status != b.members[i].status) return true;
  auto moved = [&](double x, double y) {
    const double base = std::max(std::abs(x), 1e-9);
    return std::abs(x - y) / base > cfg_.significant_change;
  };
  for (std::size_t i = 0; i < a.links.size() && i < b.links.size(); ++i) {
    if (moved(static_cast<double>(a.links[i].rtt_us), static_cast<double>(b.links[i].rtt_us)) ||
        moved(a.links[i].bandwidth_mbps, b.links[i].bandwidth_mbps) ||
        moved(a.links[i].bulk_rtt_us, b.links[i].bulk_rtt_us))
      return true;
  }
  return false;
}

std::optional<view> topology_state::maybe_publish(std::uint64_t now_ms) {
  if (!is_leader()) return std::nullopt;
  view next = build();
  bool publish = fresh_term_ || !current_;
  if (!publish) {
    if (!same_structure(*current_, next)) {
      publish = true;
    } else if (now_ms >= last_publish_ms_ + cfg_.refresh_ms &&
               measurements_moved(*current_, next)) {
      publish = true;
    }
  }
  if (!publish) return std::nullopt;
  next.at = epoch{term_, next_version_++};
  fresh_term_ = false;
  last_publish_ms_ = now_ms;
  current_ = next;
  ++counters_.views_published;
  return next;
}

bool topology_state::on_view(const view& v) {
  if (current_ && v.at <= current_->at) {
    ++counters_.views_stale;
    return false;
  }
  current_ = v;
  ++counters_.views_adopted;
  return true;
}

}  // namespace tessera::mesh::topology
