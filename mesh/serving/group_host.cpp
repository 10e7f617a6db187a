#include "mesh/serving/group_host.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/base/thread.hpp"
#include "inference/gguf/gguf.hpp"

namespace tessera::mesh::serving {

namespace bulk = transport::bulk;
namespace inf = tessera::inference;

namespace {

// Bounds of forming a group: every wait ends, and a group that cannot form is failed (explicit
// errors to its requests) instead of hanging.
constexpr auto kFormTimeout = std::chrono::seconds(30);
constexpr auto kResendEvery = std::chrono::milliseconds(500);

}  // namespace

std::string group_key(const std::string& model, const placement::serving_group& g) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, g);
  return fmt::format("{}/{:016x}", model, fnv1a64(std::string_view(buf.data(), buf.size())));
}

result<inf::sharded::layout> layout_of(const placement::serving_group& g) {
  std::set<std::uint32_t> stages;
  std::uint32_t max_tp = 1;
  for (const auto& r : g.ranks) {
    stages.insert(r.stage);
    max_tp = std::max(max_tp, r.tp_size);
  }
  if (stages.size() == g.ranks.size() && max_tp == 1) return inf::sharded::layout::pipeline;
  if (stages.size() == 1) return inf::sharded::layout::tensor;
  // Stages of tensor-parallel teams: the ranks must come in stage order (placement writes them
  // so; validate_group checks plans from the wire).
  for (std::size_t i = 1; i < g.ranks.size(); ++i)
    if (g.ranks[i].stage < g.ranks[i - 1].stage || g.ranks[i].stage > g.ranks[i - 1].stage + 1)
      return make_error(errc::invalid_argument, "the group's ranks are not in stage order");
  return inf::sharded::layout::hybrid;
}

group_host::group_host(std::string key, std::string model_path, placement::serving_group g,
                       std::uint32_t self_rank, bulk::link_addresses addresses,
                       std::map<member_id, bulk::local_capabilities> caps,
                       bulk::local_capabilities own_caps, sender send, std::uint32_t threads,
                       link_wrapper wrap, group_registry* registry, int compute_nice,
                       std::shared_ptr<inf::compute_gate> gate, inf::kv_cache_type kv_cache)
    : key_(std::move(key)),
      path_(std::move(model_path)),
      g_(std::move(g)),
      self_(self_rank),
      addresses_(std::move(addresses)),
      caps_(std::move(caps)),
      own_caps_(std::move(own_caps)),
      send_(std::move(send)),
      wrap_(std::move(wrap)),
      threads_(threads),
      registry_(registry),
      compute_nice_(compute_nice),
      gate_(std::move(gate)),
      kv_cache_(kv_cache) {
  if (registry_ != nullptr) {
    std::lock_guard lock(registry_->mu_);
    registry_->hosts_.push_back(this);
  }
  thread_ = std::thread([this] { run(); });
}

group_host::~group_host() {
  if (registry_ != nullptr) {
    std::lock_guard lock(registry_->mu_);  // waits for an abort_without() in progress
    std::erase(registry_->hosts_, this);
  }
  stopping_ = true;
  cv_.notify_all();
  // Rank 0 of a formed group tells the followers to stop (best effort: the links close anyway).
  if (self_ == 0 && runner() != nullptr) (void)runner_->shutdown();
  // Closing the links ends a follower's follow() (its receive fails) and rank 0's peers' too.
  {
    std::lock_guard lock(mu_);
    for (auto& l : links_)
      if (l) l->close();
  }
  if (thread_.joinable()) thread_.join();
  runner_.reset();
  group_.reset();
  links_.clear();
}

void group_host::on_link_message(const group_link_message& m) {
  if (m.to_rank != self_ || m.from_rank >= g_.ranks.size() || m.from_rank == self_) return;
  // Only the rank's own node speaks for it (the first params count: an impostor's would win).
  if (m.sender != g_.ranks[m.from_rank].node) return;
  {
    std::lock_guard lock(mu_);
    received_.emplace(m.from_rank, m);  // the first params count; re-sends are duplicates
  }
  cv_.notify_all();
}

group_host::state group_host::current() const {
  std::lock_guard lock(mu_);
  return state_;
}

bool group_host::was_ready() const {
  std::lock_guard lock(mu_);
  return was_ready_;
}

bool group_host::may_form_later() const {
  std::lock_guard lock(mu_);
  return state_ == state::failed && !was_ready_ && retry_;
}

std::optional<std::pair<std::int64_t, std::vector<std::uint64_t>>> group_host::expert_load() const {
  {
    std::lock_guard lock(mu_);
    if (!was_ready_) return std::nullopt;  // shard_ is set before the group is first ready
  }
  if (!shard_ || !shard_->params().is_moe()) return std::nullopt;
  return std::pair{shard_->expert_first(), shard_->expert_load()};
}

std::string group_host::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

inf::sharded::runner* group_host::runner() const {
  std::lock_guard lock(mu_);
  return state_ == state::ready && self_ == 0 ? runner_.get() : nullptr;
}

void group_host::fail(std::string why) {
  std::lock_guard lock(mu_);
  if (state_ == state::failed) return;
  state_ = state::failed;
  failure_ = std::move(why);
  spdlog::warn("serving: group {} failed: {}", key_, failure_);
}

void group_host::abort(const std::string& why) {
  std::lock_guard lock(mu_);
  if (!abort_reason_.empty()) return;
  abort_reason_ = why;
  if (group_) group_->abort(why);
}

std::vector<member_id> group_host::members() const {
  std::vector<member_id> out;
  for (const auto& r : g_.ranks)
    out.push_back(r.node);
  return out;
}

void group_registry::abort_without(const std::vector<member_id>& live) {
  std::lock_guard lock(mu_);
  const std::set<member_id> now(live.begin(), live.end());
  std::set<member_id> keep = now;
  for (group_host* h : hosts_) {
    member_id dead = no_member;
    for (member_id m : h->members()) {
      if (!seen_live_.contains(m)) continue;
      keep.insert(m);  // remembered while a listed group has it
      if (dead == no_member && !now.contains(m)) dead = m;
    }
    if (dead != no_member)
      h->abort(fmt::format("member {:016x} of group {} was declared dead", dead, h->key()));
  }
  seen_live_ = std::move(keep);
}

void group_registry::abort_unplanned(const std::set<std::string>& planned,
                                     const std::string& plan_name) {
  std::lock_guard lock(mu_);
  for (group_host* h : hosts_)
    if (!planned.contains(h->key()))
      h->abort(fmt::format("plan {} no longer has group {}", plan_name, h->key()));
}

void group_host::run() {
  // Forms the group, then (ranks > 0) runs its share of every forward pass: the compute class.
  name_this_thread(self_ == 0 ? "group-form" : "group-follow");
  set_this_thread_nice(compute_nice_);
  auto r = form();
  if (!r) {
    {
      std::lock_guard lock(mu_);
      // A peer that did not show up in time (still fetching its shard, busy, restarting) may
      // later, and so may one whose bulk link would not connect (it restarted since it sent its
      // link params: the old process's port is closed; chaos --moe --hosts kill-two refused 8 of
      // 8 requests with no_capacity so): the engine forms the group again. Anything else (a
      // layout this build does not run, a slice that does not load) would fail the same way.
      retry_ = r.error().code == errc::timeout || r.error().code == errc::closed;
    }
    fail(r.error().describe());
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (state_ == state::forming) {
      state_ = state::ready;
      was_ready_ = true;
    }
  }
  spdlog::info("serving: group {} ready (rank {} of {})", key_, self_, g_.ranks.size());
  if (self_ == 0) return;  // the engine thread drives rank 0
  auto f = runner_->follow();
  if (!f)
    fail(f.error().describe());
  else
    fail("rank 0 shut the group down");
}

result<inf::model::shard_spec> shard_of(const placement::serving_group& g, std::uint32_t rank) {
  if (g.ranks.size() < 2) return inf::model::shard_spec::full();
  auto kind = layout_of(g);
  if (!kind) return kind.error();
  const auto& me = g.ranks.at(rank);
  inf::model::shard_spec spec;
  if (*kind != inf::sharded::layout::tensor)
    spec = inf::model::shard_spec::layers(me.layer_first, me.layer_last);
  // A rank in a team of several holds its heads and FFN columns of its stage's layers.
  if (*kind == inf::sharded::layout::tensor ||
      (*kind == inf::sharded::layout::hybrid && me.tp_size > 1)) {
    spec.head_begin = me.head_first;
    spec.head_end = me.head_last;
    spec.ffn_begin = me.ffn_first;
    spec.ffn_end = me.ffn_last;
  }
  return spec;
}

/// Both sides of a pair prepare a link, send their params, and connect with the other's: our
/// side of every pair, prepared, and the message that carries its params.
result<void> group_host::prepare_links(std::vector<std::unique_ptr<bulk::link_setup>>& setups,
                                       std::vector<group_link_message>& mine) {
  const std::size_t n = g_.ranks.size();
  for (std::uint32_t j = 0; j < n; ++j) {
    if (j == self_) continue;
    const auto peer = g_.ranks[j].node;
    const auto it = caps_.find(peer);
    const auto backend =
        it == caps_.end() ? bulk::backend_kind::tcp : bulk::choose_backend(own_caps_, it->second);
    bulk::link_options o;
    addresses_.apply_to(o);
    o.connect_timeout_ms = std::chrono::milliseconds(20'000);
    auto s = bulk::prepare_link(backend, o);
    if (!s) return s.error();
    const auto bytes = bulk::encode((*s)->local_params());
    mine[j] = {key_, self_, j, static_cast<std::uint8_t>(backend), {}};
    for (auto b : bytes)
      mine[j].params.push_back(static_cast<std::uint8_t>(b));
    setups[j] = std::move(*s);
  }
  return ok();
}

/// Sends our params to every peer of the group (again every kResendEvery) until every peer's
/// have arrived, then once more (a peer that got ours late still has them).
result<void> group_host::exchange_params(const std::vector<group_link_message>& mine) {
  const std::size_t n = g_.ranks.size();
  const auto deadline = std::chrono::steady_clock::now() + kFormTimeout;
  for (;;) {
    for (std::uint32_t j = 0; j < n; ++j)
      if (j != self_) send_(g_.ranks[j].node, mine[j]);
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, kResendEvery, [&] { return stopping_ || received_.size() + 1 == n; });
    if (stopping_) return make_error(errc::cancelled, "group {}: dropped while forming", key_);
    if (received_.size() + 1 == n) break;
    if (std::chrono::steady_clock::now() > deadline)
      return make_error(errc::timeout, "group {}: {} of {} peers sent their link params in {} s",
                        key_, received_.size(), n - 1, kFormTimeout.count());
  }
  for (std::uint32_t j = 0; j < n; ++j)
    if (j != self_) send_(g_.ranks[j].node, mine[j]);
  return ok();
}

/// Connects every link at once (one short-lived thread per peer: each connect waits for its
/// peer), and keeps them in links_.
result<void> group_host::connect_links(std::vector<std::unique_ptr<bulk::link_setup>>& setups) {
  const std::size_t n = g_.ranks.size();
  std::vector<std::unique_ptr<bulk::link>> links(n);
  std::vector<std::optional<error>> errors(n);
  {
    std::vector<std::thread> ts;
    for (std::uint32_t j = 0; j < n; ++j) {
      if (j == self_) continue;
      group_link_message theirs;
      {
        std::lock_guard lock(mu_);
        theirs = received_.at(j);
      }
      ts.emplace_back([&, j, theirs] {
        name_this_thread("group-form");  // forming: one connect per peer, for moments
        std::vector<std::byte> bytes;
        for (auto b : theirs.params)
          bytes.push_back(static_cast<std::byte>(b));
        auto p = bulk::decode_connect_params(bytes);
        if (!p) return void(errors[j] = p.error());
        auto l = setups[j]->connect(*p);
        if (!l) return void(errors[j] = l.error());
        links[j] = wrap_ ? wrap_(std::move(*l), g_.ranks[j].node) : std::move(*l);
      });
    }
    for (auto& t : ts)
      t.join();
  }
  for (std::uint32_t j = 0; j < n; ++j)
    if (errors[j])
      return make_error(errors[j]->code, "group {}: link to rank {}: {}", key_, j,
                        errors[j]->message);
  std::lock_guard lock(mu_);
  links_ = std::move(links);
  return ok();
}

result<void> group_host::form() {
  auto kind = layout_of(g_);
  if (!kind) return kind.error();
  auto spec = shard_of(g_, self_);
  if (!spec) return spec.error();
  auto f = inf::gguf::file::open(path_, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  auto m = inf::model::model::load(*f, {*spec});
  if (!m) return m.error();
  shard_ = std::move(*m);
  auto pool = inf::thread_pool::create(static_cast<int>(std::max(1u, threads_)),
                                       {.pin = false, .nice = compute_nice_, .gate = gate_});
  if (!pool) return pool.error();
  pool_ = std::move(*pool);

  std::vector<std::unique_ptr<bulk::link_setup>> setups(g_.ranks.size());
  std::vector<group_link_message> mine(g_.ranks.size());
  TESSERA_TRY(prepare_links(setups, mine));
  TESSERA_TRY(exchange_params(mine));
  TESSERA_TRY(connect_links(setups));
  std::vector<bulk::link*> raw(g_.ranks.size(), nullptr);
  {
    std::lock_guard lock(mu_);
    for (std::uint32_t j = 0; j < raw.size(); ++j)
      raw[j] = links_[j].get();
  }
  inf::collectives::group_options go;
  go.timeout_ms = std::chrono::milliseconds(15'000);
  auto g = inf::collectives::group::create(self_, raw, go);
  if (!g) return g.error();
  {
    std::lock_guard lock(mu_);
    group_ = std::move(*g);
    if (!abort_reason_.empty()) group_->abort(abort_reason_);  // aborted while forming
  }
  std::vector<std::uint32_t> stages;
  for (const auto& r : g_.ranks)
    stages.push_back(r.stage);
  auto ru = *kind == inf::sharded::layout::hybrid
                ? inf::sharded::runner::create(*shard_, *group_, std::move(stages), pool_.get())
                : inf::sharded::runner::create(*shard_, *group_, *kind, pool_.get());
  if (!ru) return ru.error();
  runner_ = std::move(*ru);
  runner_->set_kv_cache(kv_cache_);
  return ok();
}

}  // namespace tessera::mesh::serving
