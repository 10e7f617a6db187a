#include "mesh/sim/checkers.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tessera::mesh::sim {

const mesh_node* mesh_node_of(const world& w, member_id id) {
  return dynamic_cast<const mesh_node*>(w.node(id));
}

const client_node* client_node_of(const world& w, member_id id) {
  return dynamic_cast<const client_node*>(w.node(id));
}

request_report check_requests(const world& w, std::uint32_t vocab) {
  request_report r;
  for (member_id id : w.ids()) {
    const client_node* c = client_node_of(w, id);
    if (c == nullptr) continue;
    if (!c->all_done()) r.violations.push_back(fmt::format("client {}: requests still open", id));
    if (c->undecodable() != 0)
      r.violations.push_back(fmt::format("client {}: {} undecodable responses", id, c->undecodable()));
    for (const auto& [rid, rec] : c->records()) {
      ++r.requests;
      r.publications += rec.publications;
      const auto bad = [&](std::string what) {
        r.violations.push_back(fmt::format("client {} request {}: {}", id, rid, what));
      };
      if (rec.outcomes != 1 || !rec.outcome) {
        bad(fmt::format("{} outcomes", rec.outcomes));
        continue;
      }
      for (std::size_t i = 0; i < rec.indices.size(); ++i)
        if (rec.indices[i] != i) {
          bad(fmt::format("index {} handed on as the {}th token", rec.indices[i], i));
          break;
        }
      if (!*rec.outcome) {
        bad(fmt::format("ended in an error: {}", rec.outcome->error().describe()));
        continue;
      }
      const auto& out = **rec.outcome;
      const auto ref = sim_reference(rec.req, vocab);
      if (out.tokens != ref || rec.tokens != ref)
        bad(fmt::format("tokens {} differ from the single-peer reference {}", out.tokens, ref));
      ++r.completed;
      r.tokens += out.tokens.size();
      if (out.attempts > 1) ++r.resumed;
      r.max_attempts = std::max(r.max_attempts, out.attempts);
      r.latency_ms.push_back(rec.ended_ms - rec.issued_ms);
    }
  }
  return r;
}

election_checker::election_checker(world& w, std::uint64_t step_down_bound_ms)
    : world_(w), step_down_bound_ms_(step_down_bound_ms) {}

bool election_checker::side_has_majority(member_id id, const member_config& cfg) const {
  for (const auto& group : partition_) {
    if (std::find(group.begin(), group.end(), id) == group.end()) continue;
    std::size_t n = 0;
    for (member_id m : cfg.members)
      n += std::find(group.begin(), group.end(), m) != group.end();
    return n >= cfg.majority();
  }
  return true;  // not in any group: talks to everyone
}

void election_checker::observe() {
  if (world_.clean_partition() != partition_) {
    partition_ = world_.clean_partition();
    minority_since_ms_.clear();
  }
  for (member_id id : world_.ids()) {
    const mesh_node* n = mesh_node_of(world_, id);
    const bool leads = n && n->election().role() == election_role::leader;
    const std::uint64_t term = leads ? n->election().term() : 0;
    if (!leads) minority_since_ms_.erase(id);
    const std::uint64_t before = leader_term_[id];
    leader_term_[id] = term;
    if (!leads) continue;
    auto [it, fresh] = leaders_.emplace(term, id);
    if (!fresh && it->second != id)
      violations_.push_back(fmt::format("t={} two leaders in term {}: {} and {}", world_.now_ms(),
                                        term, it->second, id));
    const bool majority = side_has_majority(id, n->election().config());
    if (majority || world_.is_paused(id)) {
      minority_since_ms_.erase(id);
    } else {
      minority_since_ms_.emplace(id, world_.now_ms());
    }
    if (before != term && !majority)
      violations_.push_back(
          fmt::format("t={} node {} became leader of term {} on a minority side "
                      "of {} (its config {})",
                      world_.now_ms(), id, term, partition_, n->election().config().members));
    auto since = minority_since_ms_.find(id);
    if (since != minority_since_ms_.end() && world_.now_ms() > since->second + step_down_bound_ms_)
      violations_.push_back(
          fmt::format("t={} node {} still leads term {} on a minority side for {} ms "
                      "(partition {}, its config {})",
                      world_.now_ms(), id, term, world_.now_ms() - since->second, partition_,
                      n->election().config().members));
  }
}

void plan_checker::observe() {
  for (member_id id : world_.ids()) {
    const mesh_node* n = mesh_node_of(world_, id);
    if (!n) {
      seen_.erase(id);
      continue;
    }
    if (n->plans_refused() != 0 && violations_.empty())
      violations_.push_back(fmt::format("t={}: node {} refused a plan as invalid", world_.now_ms(), id));
    const auto& p = n->plan();
    if (!p) continue;
    const auto e = std::make_pair(p->epoch.term, p->epoch.version);
    node_seen& seen = seen_[id];
    if (seen.hashed != p) {
      seen.hashed = p;
      seen.hash = placement::plan_content_hash(*p);
    }
    auto [it, fresh] = contents_.emplace(e, seen.hash);
    if (!fresh && it->second != seen.hash)
      violations_.push_back(fmt::format("t={}: node {} holds plan {}.{} with other content than "
                                        "another node's plan of that epoch",
                                        world_.now_ms(), id, e.first, e.second));
    if (seen.node == n && e < seen.epoch)
      violations_.push_back(fmt::format("t={}: node {}'s plan went back from {}.{} to {}.{}",
                                        world_.now_ms(), id, seen.epoch.first, seen.epoch.second,
                                        e.first, e.second));
    seen.node = n;
    seen.epoch = e;
  }
}

std::optional<std::string> plans_converged(const world& w) {
  std::vector<member_id> up;
  member_id leader = no_member;
  for (member_id id : w.ids())
    if (const mesh_node* n = mesh_node_of(w, id)) {
      up.push_back(id);
      if (n->election().role() == election_role::leader) leader = id;
    }
  if (leader == no_member) return std::string("no leader");
  const auto& lp = mesh_node_of(w, leader)->plan();
  if (!lp) return fmt::format("leader {} has no plan", leader);
  if (lp->models.size() != 1 || lp->models[0].groups.empty())
    return fmt::format("leader {}'s plan {}.{} serves no model", leader, lp->epoch.term,
                       lp->epoch.version);
  std::set<member_id> ranks;
  for (const auto& g : lp->models[0].groups)
    for (const auto& r : g.ranks)
      ranks.insert(r.node);
  if (ranks != std::set<member_id>(up.begin(), up.end()))
    return fmt::format("plan {}.{} ranks {} != up nodes {}", lp->epoch.term, lp->epoch.version,
                       std::vector<member_id>(ranks.begin(), ranks.end()), up);
  for (member_id id : up) {
    const auto& p = mesh_node_of(w, id)->plan();
    if (!p || p->epoch != lp->epoch)
      return fmt::format("node {} holds plan {} not the leader's {}.{}", id,
                         p ? fmt::format("{}.{}", p->epoch.term, p->epoch.version) : "none",
                         lp->epoch.term, lp->epoch.version);
  }
  return std::nullopt;
}

std::string describe(const world& w) {
  std::string s;
  for (member_id id : w.ids()) {
    const mesh_node* n = mesh_node_of(w, id);
    if (!n) {
      if (const client_node* c = client_node_of(w, id))
        s += fmt::format("[{}: client, {} requests{}] ", id, c->records().size(),
                         c->all_done() ? "" : " open");
      else
        s += fmt::format("[{}: down] ", id);
      continue;
    }
    const auto& e = n->election();
    s += fmt::format("[{}: {} t{} leader {} cfg v{}/t{} {} commit {}{}] ", id, to_string(e.role()),
                     e.term(), e.leader(), e.config().version, e.config().term, e.config().members,
                     e.commit_version(), w.is_paused(id) ? " paused" : "");
  }
  return s;
}

std::optional<std::string> converged(const world& w) {
  std::vector<member_id> up;
  member_id leader = no_member;
  for (member_id id : w.ids()) {
    const mesh_node* n = mesh_node_of(w, id);
    if (!n) continue;
    if (w.is_paused(id)) return fmt::format("node {} is paused", id);
    up.push_back(id);
    if (n->election().role() == election_role::leader) {
      if (leader != no_member) return fmt::format("two leaders: {} and {}", leader, id);
      leader = id;
    }
  }
  if (leader == no_member) return std::string("no leader");
  const auto& le = mesh_node_of(w, leader)->election();
  if (le.config().members != up)
    return fmt::format("leader config {} != up nodes {}", le.config().members, up);
  if (le.commit_version() != le.config().version) return std::string("config not committed");
  for (member_id id : up) {
    const auto& e = mesh_node_of(w, id)->election();
    if (e.leader() != leader || e.term() != le.term() || e.config() != le.config() ||
        e.commit_version() != le.commit_version())
      return fmt::format("node {} disagrees with leader {}", id, leader);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> run_until_converged(world& w, std::uint64_t bound_ms,
                                                 std::uint64_t poll_ms) {
  const std::uint64_t start = w.now_ms();
  while (w.now_ms() - start <= bound_ms) {
    if (!converged(w)) return w.now_ms() - start;
    w.run_for(poll_ms);
  }
  return std::nullopt;
}

}  // namespace tessera::mesh::sim
