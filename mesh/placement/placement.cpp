#include "mesh/placement/placement.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "mesh/placement/spec_math.hpp"

namespace tessera::mesh::placement {
using namespace detail;
namespace {

// Splits `units` into one count per weight, proportional to the weights (largest remainder, ties
// to the lower index), each at least `min_each` and at most caps[i] when caps are given.
// nullopt when impossible.
std::optional<std::vector<std::uint64_t>> apportion(std::uint64_t units,
                                                    std::vector<std::uint64_t> weights,
                                                    std::uint64_t min_each,
                                                    const std::vector<std::uint64_t>* caps) {
  const std::size_t n = weights.size();
  if (n == 0 || u128{n} * min_each > units) return std::nullopt;
  if (std::all_of(weights.begin(), weights.end(), [](std::uint64_t w) { return w == 0; })) {
    std::fill(weights.begin(), weights.end(), 1);
  }
  if (caps != nullptr) {
    u128 total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if ((*caps)[i] < min_each) return std::nullopt;
      total += (*caps)[i];
    }
    if (total < units) return std::nullopt;
  }
  std::vector<std::uint64_t> count(n, 0);
  std::vector<bool> fixed(n, false);
  for (;;) {
    u128 rest = units;
    u128 weight_sum = 0;
    std::vector<std::size_t> active;
    for (std::size_t i = 0; i < n; ++i) {
      if (fixed[i]) {
        rest -= count[i];
      } else {
        active.push_back(i);
        weight_sum += weights[i];
      }
    }
    if (active.empty()) return rest == 0 ? std::optional(count) : std::nullopt;
    if (weight_sum == 0) {
      for (std::size_t i : active)
        weights[i] = 1;
      weight_sum = active.size();
    }
    // Exact comparison of quotas: quota_i = rest * w_i / weight_sum, compared as numerators.
    u128 assigned = 0;
    for (std::size_t i : active) {
      count[i] = std::max<std::uint64_t>(
          min_each, static_cast<std::uint64_t>(rest * weights[i] / weight_sum));
      assigned += count[i];
    }
    auto deficit = [&](std::size_t i) -> __int128 {  // quota - count, scaled by weight_sum
      return static_cast<__int128>(rest * weights[i]) -
             static_cast<__int128>(u128{count[i]} * weight_sum);
    };
    while (assigned > rest) {
      std::size_t best = n;
      for (std::size_t i : active) {
        if (count[i] > min_each && (best == n || deficit(i) < deficit(best))) best = i;
      }
      if (best == n) return std::nullopt;
      --count[best];
      --assigned;
    }
    while (assigned < rest) {
      std::size_t best = n;
      for (std::size_t i : active) {
        if (best == n || deficit(i) > deficit(best)) best = i;
      }
      ++count[best];
      ++assigned;
    }
    bool capped = false;
    if (caps != nullptr) {
      for (std::size_t i : active) {
        if (count[i] > (*caps)[i]) {
          count[i] = (*caps)[i];
          fixed[i] = true;
          capped = true;
        }
      }
    }
    if (!capped) return count;
  }
}

// ---------------------------------------------------------------------------------------------
// The view, indexed
// ---------------------------------------------------------------------------------------------

struct view {
  std::vector<member_caps> members;  // sorted by id
  std::map<std::pair<member_id, member_id>, link_info> links;
  planner_config config;

  const member_caps* find(member_id id) const {
    auto it = std::lower_bound(members.begin(), members.end(), id,
                               [](const member_caps& m, member_id v) { return m.id < v; });
    return it != members.end() && it->id == id ? &*it : nullptr;
  }

  bool fast_one_way(member_id a, member_id b) const {
    auto it = links.find({a, b});
    if (it == links.end()) return false;
    const link_info& l = it->second;
    return l.backend == link_backend::shm || l.backend == link_backend::rdma ||
           l.rtt_us <= config.tp_max_rtt_us;
  }
  bool fast(member_id a, member_id b) const { return fast_one_way(a, b) && fast_one_way(b, a); }
  /// Both directions are in the view: each side hears the other directly. Every pair of ranks of
  /// a group needs it (the ranks connect a bulk link to each other); a pair that lost its direct
  /// link while both stay members (a bridge partition) must not share a group.
  bool connected(member_id a, member_id b) const {
    return links.contains({a, b}) && links.contains({b, a});
  }

  // Islands over all members, computed once per plan (O(n²) link look-ups); a pool uses each
  // island's members that are in the pool, which are still pairwise fast.
  std::vector<std::vector<member_id>> islands;

  std::uint64_t capacity(const member_caps& m) const {
    return m.memory_free_bytes > config.reserve_bytes ? m.memory_free_bytes - config.reserve_bytes
                                                      : 0;
  }
};

using budgets = std::map<member_id, std::uint64_t>;

// Builds a group from stages of members (each stage: members sorted by id; stages in order) for
// `spec`, weighting splits by `weight_of`, within `budget`. nullopt when it does not fit.
template <class WeightOf>
std::optional<serving_group> build_group(const model_spec& spec,
                                         const std::vector<std::vector<member_id>>& stages,
                                         const budgets& budget, WeightOf weight_of) {
  const std::size_t n_stages = stages.size();
  if (n_stages == 0 || n_stages > spec.n_layers) return std::nullopt;
  struct stage_split {
    std::vector<std::uint64_t> heads, ffn, vocab;
  };
  std::vector<stage_split> splits(n_stages);
  std::vector<std::uint64_t> layer_caps(n_stages), stage_weight(n_stages);
  for (std::size_t s = 0; s < n_stages; ++s) {
    const auto& ids = stages[s];
    const bool first = s == 0, last = s + 1 == n_stages;
    std::vector<std::uint64_t> w;
    for (member_id id : ids)
      w.push_back(weight_of(id));
    stage_weight[s] = std::accumulate(w.begin(), w.end(), std::uint64_t{0});
    auto heads = apportion(spec.n_heads, w, 1, nullptr);
    // FFN ties go to the last ranks while head ties go to the first ones, so the rank with an
    // extra head is not also the one with an extra FFN block (16 heads and 11 blocks over 5
    // ranks: 4/3/3/3/3 heads, 2/2/2/2/3 blocks).
    std::vector<std::uint64_t> w_reversed(w.rbegin(), w.rend());
    auto ffn = apportion(ffn_units(spec), w_reversed, 1, nullptr);
    if (ffn) std::reverse(ffn->begin(), ffn->end());
    auto vocab = apportion(spec.n_vocab, w, 1, nullptr);
    if (!heads || !ffn || !vocab) return std::nullopt;
    splits[s] = {*heads, *ffn, *vocab};
    std::uint64_t cap = UINT64_MAX;
    std::uint32_t h = 0, f = 0;
    for (std::size_t r = 0; r < ids.size(); ++r) {
      const auto hl = static_cast<std::uint32_t>(h + (*heads)[r]);
      const auto [kf, kl] = kv_range(spec, h, hl);
      const auto fl =
          std::min(spec.ffn_size, static_cast<std::uint32_t>((f + (*ffn)[r]) * spec.ffn_block));
      const rank_cost c = cost_of(spec, hl - h, kl - kf, fl - f * spec.ffn_block,
                                  static_cast<std::uint32_t>((*vocab)[r]), first, last);
      const std::uint64_t b = budget.at(ids[r]);
      if (c.extras > b) return std::nullopt;
      cap = std::min(
          cap, c.per_layer == 0 ? std::uint64_t{spec.n_layers} : (b - c.extras) / c.per_layer);
      h = hl;
      f += static_cast<std::uint32_t>((*ffn)[r]);
    }
    layer_caps[s] = std::min<std::uint64_t>(cap, spec.n_layers);
  }
  auto layers = apportion(spec.n_layers, stage_weight, 1, &layer_caps);
  if (!layers) return std::nullopt;

  serving_group g;
  std::uint32_t layer = 0;
  for (std::size_t s = 0; s < n_stages; ++s) {
    const auto& ids = stages[s];
    const auto layer_last = static_cast<std::uint32_t>(layer + (*layers)[s]);
    std::uint32_t h = 0, f = 0, v = 0;
    for (std::size_t r = 0; r < ids.size(); ++r) {
      rank_assignment a;
      a.node = ids[r];
      a.stage = static_cast<std::uint32_t>(s);
      a.tp_rank = static_cast<std::uint32_t>(r);
      a.tp_size = static_cast<std::uint32_t>(ids.size());
      a.layer_first = layer;
      a.layer_last = layer_last;
      a.head_first = h;
      a.head_last = h + static_cast<std::uint32_t>(splits[s].heads[r]);
      std::tie(a.kv_head_first, a.kv_head_last) = kv_range(spec, a.head_first, a.head_last);
      a.ffn_first = f * spec.ffn_block;
      f += static_cast<std::uint32_t>(splits[s].ffn[r]);
      a.ffn_last = std::min(spec.ffn_size, f * spec.ffn_block);
      a.first_stage = s == 0;
      a.last_stage = s + 1 == n_stages;
      if (a.first_stage || a.last_stage) {
        a.vocab_first = v;
        a.vocab_last = v + static_cast<std::uint32_t>(splits[s].vocab[r]);
      }
      h = a.head_last;
      v = a.vocab_last;
      // Holds by construction (layer caps); checked so a rounding slip can never overcommit.
      if (rank_memory_bytes(spec, a) > budget.at(a.node)) return std::nullopt;
      g.ranks.push_back(a);
    }
    layer = layer_last;
  }
  return g;
}

// Members of `pool` sorted by capacity (largest first), ties by id.
std::vector<member_id> by_capacity(const std::vector<member_id>& pool, const budgets& budget) {
  std::vector<member_id> out = pool;
  std::stable_sort(out.begin(), out.end(), [&](member_id a, member_id b) {
    const auto ba = budget.at(a), bb = budget.at(b);
    return ba != bb ? ba > bb : a < b;
  });
  return out;
}

// Islands: members that may share a tensor-parallel stage (fast links both ways between every
// pair). Greedy in id order: a member joins the first island it is fast to everyone in.
std::vector<std::vector<member_id>> islands_of(const view& v, const std::vector<member_id>& pool) {
  std::vector<member_id> sorted = pool;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<member_id>> islands;
  for (member_id id : sorted) {
    bool placed = false;
    for (auto& isl : islands) {
      if (std::all_of(isl.begin(), isl.end(), [&](member_id o) { return v.fast(id, o); })) {
        isl.push_back(id);
        placed = true;
        break;
      }
    }
    if (!placed) islands.push_back({id});
  }
  return islands;
}

std::optional<serving_group> try_stages(const view& v, const model_spec& spec,
                                        std::vector<std::vector<member_id>> stages,
                                        const budgets& budget) {
  for (auto& st : stages)
    std::sort(st.begin(), st.end());
  std::sort(stages.begin(), stages.end());  // by lowest member id: deterministic stage order
  // Compute-balanced first (cores); if that overflows someone's memory, memory-balanced.
  auto g = build_group(spec, stages, budget,
                       [&](member_id id) { return std::uint64_t{v.find(id)->cores}; });
  if (g) return g;
  return build_group(spec, stages, budget, [&](member_id id) { return budget.at(id); });
}

std::uint64_t model_bytes(const model_spec& s) {
  const rank_cost c = cost_of(s, s.n_heads, s.n_kv_heads, s.ffn_size, s.n_vocab, true, true);
  return c.extras + c.per_layer * s.n_layers;
}

// The smallest group (fewest members) that holds `spec`, from `pool`. Per size k: one member
// (best fit), then tensor parallelism inside one island, then a pipeline over the k largest
// members (members of one island that may share a stage do, up to max_tp_ranks).
std::optional<serving_group> form_group(const view& v, const model_spec& spec,
                                        const std::vector<member_id>& pool, const budgets& budget) {
  if (pool.empty()) return std::nullopt;
  // Every split holds at least the whole model once (shares round up, KV heads may be
  // replicated): a pool with less cannot hold it, whatever the split.
  u128 pool_bytes = 0;
  for (member_id id : pool)
    pool_bytes += budget.at(id);
  if (pool_bytes < model_bytes(spec)) return std::nullopt;
  const auto& cfg = v.config;
  const bool tp = tp_allowed(spec);
  const std::uint32_t tp_limit = std::max<std::uint32_t>(
      1, std::min({cfg.max_tp_ranks, spec.n_heads, ffn_units(spec), spec.n_vocab}));
  const auto largest = by_capacity(pool, budget);
  std::vector<std::vector<member_id>> islands;
  for (const auto& all : v.islands) {
    std::vector<member_id> in_pool;
    for (member_id id : all) {
      if (std::binary_search(pool.begin(), pool.end(), id)) in_pool.push_back(id);
    }
    if (!in_pool.empty()) islands.push_back(std::move(in_pool));
  }
  const std::size_t max_k = std::min<std::size_t>(
      pool.size(), std::size_t{tp ? tp_limit : 1} * std::max(1u, cfg.max_stages));
  for (std::size_t k = 1; k <= max_k; ++k) {
    if (k == 1) {
      // Best fit: the smallest member that holds it alone, leaving larger ones for others.
      for (auto it = largest.rbegin(); it != largest.rend(); ++it) {
        if (auto g = try_stages(v, spec, {{*it}}, budget)) return g;
      }
      continue;
    }
    if (tp && k <= tp_limit) {
      for (const auto& isl : islands) {
        if (isl.size() < k) continue;
        auto members = by_capacity(isl, budget);
        members.resize(k);
        if (auto g = try_stages(v, spec, {members}, budget)) return g;
      }
    }
    // The k largest members that are pairwise connected: greedy from each start in capacity
    // order (with every link up, simply the k largest).
    std::vector<member_id> chosen;
    for (std::size_t start = 0; start < largest.size() && chosen.size() < k; ++start) {
      chosen = {largest[start]};
      for (std::size_t i = 0; i < largest.size() && chosen.size() < k; ++i) {
        const member_id c = largest[i];
        if (i == start) continue;
        if (std::all_of(chosen.begin(), chosen.end(),
                        [&](member_id o) { return v.connected(c, o); }))
          chosen.push_back(c);
      }
    }
    if (chosen.size() < k) continue;
    std::vector<std::vector<member_id>> stages;
    if (tp) {
      for (const auto& isl : islands_of(v, chosen)) {
        for (std::size_t i = 0; i < isl.size(); i += tp_limit) {
          stages.emplace_back(
              isl.begin() + static_cast<std::ptrdiff_t>(i),
              isl.begin() + static_cast<std::ptrdiff_t>(std::min(isl.size(), i + tp_limit)));
        }
      }
    } else {
      for (member_id id : chosen)
        stages.push_back({id});
    }
    if (stages.size() >= 2 && stages.size() <= cfg.max_stages) {
      if (auto g = try_stages(v, spec, stages, budget)) return g;
    }
    // Head / FFN granularity can make a tensor-parallel stage overflow a member where a layer
    // split would not: last, a pipeline of one member per stage.
    if (stages.size() < k && k <= cfg.max_stages) {
      std::vector<std::vector<member_id>> singles;
      for (member_id id : chosen)
        singles.push_back({id});
      if (auto g = try_stages(v, spec, singles, budget)) return g;
    }
  }
  return std::nullopt;
}

std::string no_capacity_reason(const view& v, const model_spec& spec, const budgets& budget) {
  std::uint64_t total = 0, largest = 0;
  std::size_t usable = 0;
  for (const auto& [id, b] : budget) {
    total += b;
    largest = std::max(largest, b);
    usable += b > 0 ? 1 : 0;
  }
  const std::uint64_t need = model_bytes(spec);
  if (v.members.empty()) return fmt::format("model {}: no members in the view", spec.name);
  if (total < need) {
    return fmt::format(
        "model {}: needs about {} MiB (weights and KV cache for {} tokens); the {} members with "
        "memory left offer {} MiB in total, the largest {} MiB",
        spec.name, need >> 20, spec.context_tokens, usable, total >> 20, largest >> 20);
  }
  return fmt::format(
      "model {}: needs about {} MiB; {} MiB are free across {} members but no split fits (at most "
      "{} stages, {} tensor-parallel ranks over links with rtt <= {} us; largest member {} MiB)",
      spec.name, need >> 20, total >> 20, usable, v.config.max_stages, v.config.max_tp_ranks,
      v.config.tp_max_rtt_us, largest >> 20);
}

// Whether `spec` would fit the members with memory left were every link between them up (and
// fast): a peer that just joined has no links in the view until both sides report theirs, and
// the plan made meanwhile must not turn requests away as the capacity comes back. One extra
// form_group over a copy of the view, only for a model that has no group.
bool fits_once_linked(const view& v, const model_spec& spec, const budgets& budget) {
  std::vector<member_id> pool;
  for (const auto& m : v.members) {
    if (budget.at(m.id) > 0) pool.push_back(m.id);
  }
  view linked = v;
  bool missing = false;
  for (member_id a : pool) {
    for (member_id b : pool) {
      if (a == b || linked.links.contains({a, b})) continue;
      linked.links.emplace(std::pair{a, b}, link_info{a, b, 0, 0, link_backend::tcp});
      missing = true;
    }
  }
  if (!missing) return false;
  std::vector<member_id> all_ids;
  for (const auto& m : linked.members)
    all_ids.push_back(m.id);
  linked.islands = islands_of(linked, all_ids);
  return form_group(linked, spec, pool, budget).has_value();
}

// A previous group may be kept when it is well formed for the spec, every node is still a
// member not already serving this model, tensor-parallel stages still have fast links, and every
// rank still fits the node's remaining budget.
bool still_valid(const view& v, const model_spec& spec, const serving_group& g,
                 const std::set<member_id>& used, const budgets& budget) {
  if (!validate_group(spec, g)) return false;
  std::map<member_id, std::uint64_t> need;
  for (const auto& r : g.ranks) {
    if (v.find(r.node) == nullptr || used.count(r.node) != 0) return false;
    if (r.tp_size > 1 && (!tp_allowed(spec) || r.tp_size > v.config.max_tp_ranks)) return false;
    need[r.node] += rank_memory_bytes(spec, r);
  }
  std::uint32_t stages = g.ranks.back().stage + 1;
  if (stages > v.config.max_stages) return false;
  for (const auto& a : g.ranks) {
    for (const auto& b : g.ranks) {
      if (a.stage == b.stage && a.node < b.node && !v.fast(a.node, b.node)) return false;
      if (a.node < b.node && !v.connected(a.node, b.node)) return false;
    }
  }
  for (const auto& [id, bytes] : need) {
    if (bytes > budget.at(id)) return false;
  }
  return true;
}

void deduct(const model_spec& spec, const serving_group& g, budgets& budget,
            std::set<member_id>& used) {
  for (const auto& r : g.ranks) {
    budget[r.node] -= rank_memory_bytes(spec, r);
    used.insert(r.node);
  }
}

}  // namespace

result<plan> compute_plan(const plan_input& input, const plan* previous, std::uint64_t term,
                          const planner_config& config) {
  if (input.members.size() > max_members || input.models.size() > max_models ||
      input.links.size() > max_links) {
    return make_error(
        errc::invalid_argument,
        "plan input: {} members / {} models / {} links exceed the bounds {} / {} / {}",
        input.members.size(), input.models.size(), input.links.size(), max_members, max_models,
        max_links);
  }
  if (previous != nullptr && term < previous->epoch.term) {
    return make_error(errc::invalid_argument, "plan: term {} is below the previous plan's term {}",
                      term, previous->epoch.term);
  }
  view v;
  v.config = config;
  v.members = input.members;
  std::sort(v.members.begin(), v.members.end(),
            [](const member_caps& a, const member_caps& b) { return a.id < b.id; });
  for (std::size_t i = 0; i < v.members.size(); ++i) {
    const auto& m = v.members[i];
    if (m.id == no_member) return make_error(errc::invalid_argument, "plan input: member id 0");
    if (i > 0 && v.members[i - 1].id == m.id) {
      return make_error(errc::invalid_argument, "plan input: member {:016x} listed twice", m.id);
    }
    if (m.cores == 0) {
      return make_error(errc::invalid_argument, "plan input: member {:016x} has 0 cores", m.id);
    }
  }
  for (const auto& l : input.links) {
    if (v.find(l.from) == nullptr || v.find(l.to) == nullptr) continue;  // a member just gone
    if (!v.links.emplace(std::pair{l.from, l.to}, l).second) {
      return make_error(errc::invalid_argument, "plan input: link {:016x} -> {:016x} listed twice",
                        l.from, l.to);
    }
  }
  std::vector<model_spec> models = input.models;
  std::sort(models.begin(), models.end(),
            [](const model_spec& a, const model_spec& b) { return a.name < b.name; });
  for (std::size_t i = 0; i < models.size(); ++i) {
    TESSERA_TRY(validate_model_spec(models[i]));
    if (i > 0 && models[i - 1].name == models[i].name) {
      return make_error(errc::invalid_argument, "plan input: model {} requested twice",
                        models[i].name);
    }
  }

  std::vector<member_id> all_ids;
  for (const auto& m : v.members)
    all_ids.push_back(m.id);
  v.islands = islands_of(v, all_ids);
  budgets budget;
  for (const auto& m : v.members)
    budget[m.id] = v.capacity(m);
  std::vector<model_plan> out(models.size());
  std::vector<std::set<member_id>> used(models.size());

  // 1. Keep what still holds (sticky): a leader change or an unrelated join changes nothing.
  for (std::size_t i = 0; i < models.size(); ++i) {
    out[i].spec = models[i];
    if (previous == nullptr || config.rebalance) continue;
    auto it = std::find_if(previous->models.begin(), previous->models.end(),
                           [&](const model_plan& p) { return p.spec.name == models[i].name; });
    if (it == previous->models.end() || !(it->spec == models[i])) continue;
    for (const auto& g : it->groups) {
      if (out[i].groups.size() >= config.max_replicas) break;
      if (still_valid(v, models[i], g, used[i], budget)) {
        deduct(models[i], g, budget, used[i]);
        out[i].groups.push_back(g);
      }
    }
  }
  // 2. New groups from what is left: one per model per round, in name order, so no model takes
  // every member before each has one group.
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t i = 0; i < models.size(); ++i) {
      if (out[i].groups.size() >= config.max_replicas) continue;
      std::vector<member_id> pool;
      for (const auto& m : v.members) {
        if (used[i].count(m.id) == 0 && budget[m.id] > 0) pool.push_back(m.id);
      }
      if (auto g = form_group(v, models[i], pool, budget)) {
        deduct(models[i], *g, budget, used[i]);
        out[i].groups.push_back(std::move(*g));
        progress = true;
      }
    }
  }
  for (std::size_t i = 0; i < models.size(); ++i) {
    if (!out[i].groups.empty()) continue;
    out[i].no_capacity = no_capacity_reason(v, models[i], budget);
    if (fits_once_linked(v, models[i], budget)) {
      out[i].links_pending = true;
      out[i].no_capacity +=
          "; links to joining members are not measured yet, and a group fits "
          "once they are: requests wait";
    }
  }

  plan p;
  p.models = std::move(out);
  if (previous != nullptr && plan_equal_content(*previous, p)) return *previous;
  p.epoch = {term, previous != nullptr ? previous->epoch.version + 1 : 1};
  return p;
}

bool plan_equal_content(const plan& a, const plan& b) {
  return a.models == b.models;
}

std::uint64_t plan_content_hash(const plan& p) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, p.models);
  return fnv1a64(std::string_view(buf.data(), buf.size()));
}

result<std::size_t> route_request(const plan& p, std::string_view model,
                                  std::string_view request_id,
                                  const std::vector<std::uint32_t>& weights) {
  auto it = std::find_if(p.models.begin(), p.models.end(),
                         [&](const model_plan& m) { return m.spec.name == model; });
  if (it == p.models.end()) {
    return make_error(errc::not_found, "model {} is not in plan {}.{}", model, p.epoch.term,
                      p.epoch.version);
  }
  if (it->groups.empty()) return error{errc::no_capacity, it->no_capacity};
  if (!weights.empty() && weights.size() != it->groups.size()) {
    return make_error(errc::invalid_argument, "route: {} weights for {} groups of model {}",
                      weights.size(), it->groups.size(), model);
  }
  const std::uint64_t req = fnv1a64(request_id);
  const bool all_out = !weights.empty() &&
                       std::all_of(weights.begin(), weights.end(), [](auto w) { return w == 0; });
  std::size_t best = 0;
  std::uint64_t best_score = 0;
  bool found = false;
  for (std::size_t gi = 0; gi < it->groups.size(); ++gi) {
    if (!weights.empty() && !all_out && weights[gi] == 0) continue;
    std::uint64_t key = 0xcbf29ce484222325ULL;
    for (const auto& r : it->groups[gi].ranks)
      key = mix64(key ^ r.node);
    const std::uint32_t w = weights.empty() ? 1 : std::clamp<std::uint32_t>(weights[gi], 1, 64);
    // Weighted rendezvous without floating point: a group of weight w draws w independent
    // scores and keeps the highest, so it wins with probability w / Σw.
    std::uint64_t score = 0;
    for (std::uint32_t k = 0; k < w; ++k)
      score = std::max(score, mix64(req ^ mix64(key + k)));
    if (!found || score > best_score) {
      best = gi;
      best_score = score;
      found = true;
    }
  }
  return best;
}

}  // namespace tessera::mesh::placement
