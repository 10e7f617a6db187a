#include "mesh/serving/planning.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace tessera::mesh::serving {

namespace {

placement::link_backend backend_of(std::uint8_t topology_backend) {
  // topology: 1 tcp, 2 shm, 3 rdma (transport::bulk::backend_kind)
  switch (topology_backend) {
    case 2:
      return placement::link_backend::shm;
    case 3:
      return placement::link_backend::rdma;
    default:
      return placement::link_backend::tcp;
  }
}

}  // namespace

result<placement::plan> plan_from_view(const topology::view& v, const placement::plan* previous,
                                       std::uint64_t term, const placement::planner_config& cfg) {
  // Who holds what: the first (lowest-id) holder's spec is the model's spec.
  std::map<std::string, placement::model_spec> specs;
  std::map<std::string, std::vector<const topology::view_member*>> holders;
  std::vector<const topology::view_member*> live;
  for (const auto& m : v.members)
    if (topology::is_live_status(m.status)) live.push_back(&m);
  std::sort(live.begin(), live.end(), [](auto* a, auto* b) { return a->id < b->id; });
  for (const auto* m : live)
    for (const auto& s : m->caps.model_specs) {
      auto [it, fresh] = specs.emplace(s.name, s);
      if (fresh || it->second == s) holders[s.name].push_back(m);
    }
  // Peers that fetch models they have no file of join every model's candidates, unless they hold
  // a file of that name with other content. Only content-identified models can be fetched.
  for (const auto* m : live) {
    if (!m->caps.fetches_models) continue;
    for (auto& [name, spec] : specs) {
      if (spec.content.empty()) continue;
      const bool has_name = std::any_of(m->caps.model_specs.begin(), m->caps.model_specs.end(),
                                        [&](const auto& s) { return s.name == name; });
      if (!has_name) holders[name].push_back(m);
    }
  }
  for (auto& [name, hs] : holders)
    std::sort(hs.begin(), hs.end(), [](auto* a, auto* b) { return a->id < b->id; });

  placement::plan out;
  for (const auto& [name, spec] : specs) {
    placement::plan_input in;
    for (const auto* m : holders[name]) {
      placement::member_caps c;
      c.id = m->id;
      c.cores = std::max<std::uint32_t>(1, m->caps.cores);
      c.memory_total_bytes = m->caps.memory_total_mb << 20;
      c.memory_free_bytes = m->caps.memory_free_mb << 20;
      in.members.push_back(std::move(c));
    }
    for (const auto& l : v.links) {
      const auto holds = [&](member_id id) {
        return std::any_of(holders[name].begin(), holders[name].end(),
                           [&](auto* m) { return m->id == id; });
      };
      if (!holds(l.from) || !holds(l.to)) continue;
      // The round trip a group's collectives pay is the bulk link's, where it was measured; the
      // control plane's (through both nodes' loops) is an upper bound until then.
      const std::uint64_t rtt =
          l.bulk_rtt_us > 0 ? static_cast<std::uint64_t>(std::ceil(l.bulk_rtt_us)) : l.rtt_us;
      in.links.push_back({l.from, l.to,
                          static_cast<std::uint32_t>(std::min<std::uint64_t>(rtt, UINT32_MAX)),
                          static_cast<std::uint32_t>(l.bandwidth_mbps), backend_of(l.backend)});
    }
    in.models.push_back(spec);
    std::optional<placement::plan> prev_one;
    if (previous) {
      for (const auto& pm : previous->models)
        if (pm.spec.name == name) prev_one = placement::plan{previous->epoch, {pm}};
      if (!prev_one) prev_one = placement::plan{previous->epoch, {}};
    }
    auto p = placement::compute_plan(in, prev_one ? &*prev_one : nullptr,
                                     std::max(term, previous ? previous->epoch.term : 0), cfg);
    if (!p) return p.error();
    for (auto& m : p->models)
      out.models.push_back(std::move(m));
  }
  // Same content: the plan in force stays, epoch and all — unless it was issued in an earlier
  // term. A new leader re-issues it under its own term once: a follower may hold a later plan of
  // the old leader that this leader never received, and only a newer epoch replaces it (the
  // content is the same, so nothing is reloaded: peers reconcile by content, not by epoch).
  if (previous && placement::plan_equal_content(*previous, out) && previous->epoch.term >= term)
    return *previous;
  out.epoch = {std::max(term, previous ? previous->epoch.term : 0),
               previous ? previous->epoch.version + 1 : 1};
  return out;
}

bool ready_to_plan(const topology::view& v, std::uint64_t leading_ms) {
  if (leading_ms >= max_plan_wait_ms) return true;
  return std::all_of(v.members.begin(), v.members.end(), [](const topology::view_member& m) {
    return !topology::is_live_status(m.status) || !(m.caps == topology::capabilities{});
  });
}

result<bool> should_adopt(const placement::plan* current, const placement::plan& incoming) {
  if (current != nullptr && incoming.epoch <= current->epoch) return false;
  for (const auto& m : incoming.models)
    for (const auto& g : m.groups)
      if (auto v = placement::validate_group(m.spec, g); !v)
        return make_error(errc::corrupt, "plan {}.{}: model '{}': {}", incoming.epoch.term,
                          incoming.epoch.version, m.spec.name, v.error().message);
  return true;
}

}  // namespace tessera::mesh::serving
