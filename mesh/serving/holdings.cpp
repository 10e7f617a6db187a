#include "mesh/serving/holdings.hpp"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"
#include "transport/faults/faulty_link.hpp"

namespace tessera::mesh::serving {

namespace inf = tessera::inference;
namespace mdl = tessera::inference::model;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

// A group that failed (to form, a peer being late; or later, a rank lost) is formed again after
// this long, if the plan still names it.
constexpr auto kReformAfter = std::chrono::seconds(5);
// group_link messages held for groups not formed here yet: per group, and groups.
constexpr std::size_t kMaxEarlyLinks = 64, kMaxEarlyGroups = 16;

/// share_setup messages packed and shipped over the control plane (`send`: the node's
/// engine_options::send_share; empty: nothing is sent). The share server and every fetch use it.
share_sender packed_share_sender(std::function<void(const std::string&, std::string)> send) {
  return [send = std::move(send)](const std::string& to, const share_setup& m) {
    if (!send) return;
    msgpack::sbuffer buf;
    msgpack::pack(buf, m);
    send(to, std::string(buf.data(), buf.size()));
  };
}

}  // namespace

result<placement::model_spec> spec_of_gguf(const std::string& path, const std::string& name) {
  auto f = inf::gguf::file::open(path, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  auto hp = mdl::read_hparams(*f);
  if (!hp) return hp.error();
  placement::model_spec s;
  s.name = name;
  s.n_layers = static_cast<std::uint32_t>(hp->n_layer);
  s.n_heads = static_cast<std::uint32_t>(hp->n_head);
  s.n_kv_heads = static_cast<std::uint32_t>(hp->n_head_kv);
  s.dim = static_cast<std::uint32_t>(hp->dim);
  s.ffn_size = static_cast<std::uint32_t>(hp->ffn);
  // Of a mixture of experts the FFN axis is the experts' hidden units side by side, and a rank's
  // range must hold whole experts: splitting it is expert parallelism.
  // (A multiple of the column block too, as every FFN split: lcm, for widths no real model has.)
  if (hp->is_moe()) {
    s.ffn_block =
        static_cast<std::uint32_t>(std::lcm<std::int64_t>(hp->expert_ffn, s.column_block));
    s.n_experts = static_cast<std::uint32_t>(hp->n_expert);
    s.n_experts_used = static_cast<std::uint32_t>(hp->n_expert_used);
  }
  s.n_vocab = static_cast<std::uint32_t>(hp->n_vocab);
  std::uint64_t blocks = 0;
  for (const auto& t : f->tensors()) {
    if (t.name.starts_with("blk."))
      blocks += t.size;
    else if (t.name == "token_embd.weight")
      s.bytes_embeddings = t.size;
    else if (t.name == "output.weight")
      s.bytes_output = t.size;
  }
  s.bytes_per_layer = s.n_layers ? blocks / s.n_layers : 0;
  s.tied_embeddings = hp->tied_output;
  // The KV cache as F16: K and V, every layer, every KV head. (A peer with `--kv-cache q8_0` uses
  // about half of that; the spec is the model's, the same from every holder, so the planner keeps
  // room for the larger cache.)
  s.kv_bytes_per_token = 2ULL * 2ULL * static_cast<std::uint64_t>(hp->n_layer) *
                         static_cast<std::uint64_t>(hp->kv_dim());
  s.context_tokens = static_cast<std::uint32_t>(std::min<std::int64_t>(hp->n_ctx_train, 4096));
  if (auto v = placement::validate_model_spec(s); !v) return v.error();
  return s;
}

const char* weights_name(loaded::weights w) {
  switch (w) {
    case loaded::weights::none:
      return "none";
    case loaded::weights::loading:
      return "loading";
    case loaded::weights::ready:
      return "ready";
    case loaded::weights::failed:
      return "failed";
  }
  return "?";
}

/// Reads a model's header, tokenizer and hyper-parameters and checks its tensors (no weights).
static result<std::unique_ptr<loaded>> open_model(const std::string& path,
                                                  const std::string& name) {
  auto l = std::make_unique<loaded>();
  l->info.path = path;
  l->info.name = name;
  auto spec = spec_of_gguf(path, name);
  if (!spec) return spec.error();
  l->info.spec = *spec;
  auto f = inf::gguf::file::open(path, {inf::gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  std::error_code ec;
  l->info.file_bytes = fs::file_size(path, ec);
  auto tok = inf::tokenizer::tokenizer::from_gguf(*f);
  if (!tok) return tok.error();
  l->tok = std::make_unique<inf::tokenizer::tokenizer>(std::move(*tok));
  l->chat = inf::tokenizer::chat_template_for(*f, *l->tok);
  auto hp = mdl::read_hparams(*f);
  if (!hp) return hp.error();
  l->hp = *hp;
  // Every tensor present with its shape and type: a broken file stops the node now, naming the
  // tensor, rather than when a plan first asks this peer for a replica.
  auto bytes = mdl::model::check(*f);
  if (!bytes) return bytes.error();
  l->total_bytes = *bytes;
  l->file = std::make_unique<inf::gguf::file>(std::move(*f));
  return l;
}

holdings::holdings(const engine_options& opt, inference::thread_pool& pool,
                   std::shared_ptr<inference::compute_gate> gate, hooks h)
    : opt_(opt), pool_(pool), gate_(std::move(gate)), hooks_(std::move(h)) {
  server_ =
      std::make_unique<share_server>(opt_.link_addresses(), packed_share_sender(opt_.send_share));
}

holdings::~holdings() {
  stop_groups();
  stop_sharing();
}

result<void> holdings::add_own(const std::string& path) {
  const std::string name = fs::path(path).stem().string();
  for (const auto& other : models_)
    if (other->info.name == name)
      return make_error(errc::invalid_argument, "two models are named '{}' ({} and {})", name,
                        other->info.path, path);
  auto opened = open_model(path, name);
  if (!opened) return opened.error();
  auto l = std::move(*opened);
  // A cache type the model cannot use stops the node now, naming the file, rather than failing
  // every request later.
  if (opt_.kv_cache != inf::kv_cache_type::f16) {
    auto f = inf::gguf::file::open(path, {inf::gguf::load_mode::headers_only, {}});
    if (!f) return f.error();
    auto hp = mdl::read_hparams(*f);
    if (!hp) return hp.error();
    if (!inf::kv_cache_supports(opt_.kv_cache, hp->head_dim))
      return make_error(errc::unsupported,
                        "{}: --kv-cache {} needs head_dim a multiple of 32 (at most 1024); this "
                        "model's is {} (use --kv-cache f16)",
                        path, inf::to_string(opt_.kv_cache), hp->head_dim);
  }
  // The content id: peers plan together over equal bytes only, and fetchers verify by it.
  const auto t0 = clock_type::now();
  auto table = hash_model_file(path);
  if (!table) return table.error();
  l->info.spec.content = content_root(*table);
  server_->add(name, path, std::move(*table));
  spdlog::info(
      "serving: model '{}' from {} ({} layers, {} MiB, content {}, hashed in {} ms; weights "
      "loaded when planned here; {} KV cache)",
      name, path, l->info.spec.n_layers, l->info.file_bytes >> 20,
      l->info.spec.content.substr(0, 16),
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count(),
      inf::to_string(opt_.kv_cache));
  own_.push_back(l->info);
  model_names_.push_back(l->info.name);
  std::lock_guard lock(models_mu_);
  models_.push_back(std::move(l));
  return ok();
}

bool holdings::refresh() {
  return fetch_changed_.exchange(false) | drop_unformed();
}

bool holdings::needs_tending() const {
  return fetch_changed_.load() || std::any_of(models_.begin(), models_.end(), [](const auto& m) {
           return m->state == loaded::weights::loading && m->load_finished.load();
         });
}

void holdings::stop_groups() {
  hosts_.clear();  // rank 0 hosts tell their followers; links close
  for (auto& lm : models_)
    if (lm->loader.joinable()) lm->loader.join();  // a load in progress finishes first
}

void holdings::stop_sharing() {
  if (server_) server_->stop();
  std::lock_guard lock(models_mu_);
  for (auto& [name, f] : fetches_)
    f->stop();
}

loaded* holdings::find(const std::string& name) {
  for (auto& m : models_)
    if (m->info.name == name) return m.get();
  return nullptr;
}

std::vector<std::string> holdings::fetching() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : fetches_)
    if (std::find(model_names_.begin(), model_names_.end(), name) == model_names_.end())
      out.push_back(name);
  return out;
}

group_host* holdings::host(const std::string& key) {
  auto it = hosts_.find(key);
  return it == hosts_.end() ? nullptr : it->second.get();
}

std::vector<placement::model_spec> holdings::held_specs() const {
  std::vector<placement::model_spec> out;
  std::lock_guard lock(models_mu_);
  for (const auto& l : models_)
    if (l->fetch == nullptr || l->fetch->complete()) out.push_back(l->info.spec);
  return out;
}

void holdings::on_share(const std::string& from_hex, const share_setup& m) {
  if (m.kind == share_setup::offer) {
    server_->on_offer(from_hex, m);
    return;
  }
  std::lock_guard lock(models_mu_);
  for (const auto& [name, f] : fetches_)
    if (f->fetch_id() == m.fetch_id) f->on_answer(from_hex, m);
}

void holdings::status(json& j) const {
  json ms = json::array();
  json fs_ = json::array();
  {
    std::lock_guard lock(models_mu_);
    for (const auto& l : models_) {
      const auto& m = l->info;
      ms.push_back({{"name", m.name},
                    {"path", m.path},
                    {"bytes", m.file_bytes},
                    {"layers", m.spec.n_layers},
                    {"heads", m.spec.n_heads},
                    {"content", m.spec.content},
                    {"fetched", l->fetch != nullptr},
                    {"weights", weights_name(l->state.load())},
                    {"weights_loaded_bytes", l->loaded_bytes.load()},
                    {"weights_bytes", l->total_bytes.load()}});
    }
    for (const auto& [name, f] : fetches_) {
      const auto s = f->snapshot();
      fs_.push_back({{"model", name},
                     {"state", to_string(s.st)},
                     {"from", s.from},
                     {"bytes_done", s.bytes_done},
                     {"bytes_total", s.bytes_total},
                     {"fetched_bytes", s.fetched_bytes},
                     {"seconds", s.seconds},
                     {"error", s.error}});
    }
  }
  j["models"] = ms;
  j["fetches"] = fs_;
  const auto c = server_->counters();
  j["share"] = {{"sessions", c.sessions},
                {"running", c.running},
                {"refused", c.refused},
                {"chunks", c.chunks},
                {"bytes", c.bytes}};
}

std::vector<json> holdings::replicas_view() const {
  std::vector<json> replicas;
  std::lock_guard models_lock(models_mu_);  // the list; each one's weights are this thread's
  for (const auto& l : models_)
    if (l->m && l->m->params().is_moe())
      replicas.push_back(
          {{"model", l->info.name}, {"experts", {{"first", 0}, {"load", l->m->expert_load()}}}});
  return replicas;
}

// ------------------------------------------------------------------ groups over several peers
/// Makes a host for every group of the plan that splits a model this peer holds over several
/// peers including this one, and drops the hosts the plan no longer has (their streams end
/// "unavailable" and resume elsewhere).
void holdings::reconcile(const placement::plan* p, const std::map<member_id, peer_facts>& facts) {
  fetch_missing(p, facts);
  // Replicas: the models the plan gives this peer a group of its own for get their weights.
  for (auto& lm : models_) {
    lm->wanted = false;
    if (p != nullptr)
      for (const auto& mp : p->models)
        if (mp.spec.name == lm->info.name)
          for (const auto& g : mp.groups)
            if (g.ranks.size() == 1 && g.ranks[0].node == opt_.self) lm->wanted = true;
    // A fetched model loads once all its bytes are here (reconcile runs again when they are).
    if (lm->wanted && lm->state == loaded::weights::none &&
        (lm->fetch == nullptr || lm->fetch->ready_for(mdl::shard_spec::full())))
      start_load(*lm);
  }
  form_groups(p, facts);
}

void holdings::form_groups(const placement::plan* p, const std::map<member_id, peer_facts>& facts) {
  std::set<std::string> wanted;
  if (p != nullptr)
    for (const auto& mp : p->models) {
      const auto local = std::find_if(models_.begin(), models_.end(),
                                      [&](const auto& m) { return m->info.name == mp.spec.name; });
      if (local == models_.end()) continue;
      for (const auto& g : mp.groups) {
        if (g.ranks.size() < 2) continue;
        std::uint32_t me = 0;
        while (me < g.ranks.size() && g.ranks[me].node != opt_.self)
          ++me;
        if (me == g.ranks.size()) continue;
        const auto key = group_key(mp.spec.name, g);
        wanted.insert(key);
        if (hosts_.contains(key)) continue;
        if ((*local)->fetch != nullptr) {  // its slice's bytes first
          auto shard = shard_of(g, me);
          if (!shard || !(*local)->fetch->ready_for(*shard)) continue;
        }
        std::map<member_id, transport::bulk::local_capabilities> caps;
        std::map<member_id, std::string> hex;
        for (const auto& [id, f] : facts) {
          caps[id] = f.bulk_caps;
          hex[id] = f.hex;
        }
        auto send = opt_.send_group_link;
        group_host::sender sender = [send, hex](member_id to, const group_link_message& m) {
          auto it = hex.find(to);
          if (!send || it == hex.end()) return;
          msgpack::sbuffer buf;
          msgpack::pack(buf, m);
          send(it->second, std::string(buf.data(), buf.size()));
        };
        spdlog::info("serving {}: forming group {} as rank {} of {}", opt_.node_hex, key, me,
                     g.ranks.size());
        group_host::link_wrapper wrap;
        if (opt_.faults) {
          wrap = [faults = opt_.faults, self = opt_.node_hex, hex](
                     std::unique_ptr<transport::bulk::link> l,
                     member_id peer) -> std::unique_ptr<transport::bulk::link> {
            auto it = hex.find(peer);
            if (it == hex.end()) return l;
            // A cut tensor link loses writes (vanish), as a cable would: the collectives'
            // timeout fails the group and the plan moves on.
            return std::make_unique<transport::faults::faulty_link>(std::move(l), faults, self,
                                                                    it->second);
          };
        }
        unformed_since_.erase(key);
        auto h = std::make_unique<group_host>(
            key, (*local)->info.path, g, me, opt_.link_addresses(), std::move(caps), opt_.bulk_caps,
            std::move(sender), opt_.threads, std::move(wrap), &registry_, opt_.compute_nice, gate_,
            opt_.kv_cache);
        if (auto e = early_links_.find(key); e != early_links_.end()) {
          for (const auto& m : e->second)
            h->on_link_message(m);
          early_links_.erase(e);
        }
        hosts_[key] = std::move(h);
      }
    }
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    it = erase_host(it, "the plan dropped its group");
  }
}

/// Drops a group's host; the engine ends its streams (running or queued) with `unavailable`, and
/// their clients resume them on the group that replaces it.
std::map<std::string, std::unique_ptr<group_host>>::iterator holdings::erase_host(
    std::map<std::string, std::unique_ptr<group_host>>::iterator it, std::string_view why) {
  hooks_.host_dropped(*it->second, why);
  last_ping_.erase(it->first);
  return hosts_.erase(it);
}

// ------------------------------------------------------------------ models fetched from peers
/// For every model the plan gives this peer a part of and that it has no file of (fetch_models):
/// asks the model's fetch for those parts, from the live holders of the plan's content, and
/// adopts the model (header, tokenizer) once they are here. Reconcile runs again whenever a
/// fetch finishes or fails (fetch_changed).
void holdings::fetch_missing(const placement::plan* p,
                             const std::map<member_id, peer_facts>& facts) {
  if (p == nullptr || !opt_.fetch_models) return;
  for (const auto& mp : p->models) {
    const std::string& name = mp.spec.name;
    const auto local = std::find_if(models_.begin(), models_.end(),
                                    [&](const auto& m) { return m->info.name == name; });
    if (local != models_.end() && (*local)->fetch == nullptr) continue;  // a file of our own
    if (mp.spec.content.empty()) continue;
    std::vector<mdl::shard_spec> shards;
    for (const auto& g : mp.groups)
      for (std::uint32_t r = 0; r < g.ranks.size(); ++r)
        if (g.ranks[r].node == opt_.self)
          if (auto s = shard_of(g, r)) shards.push_back(*s);
    if (shards.empty()) continue;  // bytes fetched before stay on disk
    auto it = fetches_.find(name);
    if (it != fetches_.end() && it->second->root() != mp.spec.content) {
      if (local != models_.end()) {
        spdlog::warn(
            "serving {}: the plan names other content for model '{}' than the one "
            "fetched here; restart this peer to fetch it",
            opt_.node_hex, name);
        continue;
      }
      std::lock_guard lock(models_mu_);
      fetches_.erase(it);
      it = fetches_.end();
    }
    if (it == fetches_.end()) {
      model_fetch::options o;
      o.model = name;
      o.root = mp.spec.content;
      o.dir = opt_.fetch_dir;
      o.addresses = opt_.link_addresses();
      o.send = packed_share_sender(opt_.send_share);
      o.fetch_id = next_fetch_id_++;
      o.on_change = [this] {
        fetch_changed_ = true;
        hooks_.wake();
      };
      o.on_progress = [this, name](std::uint64_t done, std::uint64_t total) {
        if (opt_.on_fetch_progress) opt_.on_fetch_progress(name, done, total);
      };
      spdlog::info("serving {}: model '{}' (content {}) is not here: fetching its parts",
                   opt_.node_hex, name, mp.spec.content.substr(0, 16));
      std::lock_guard lock(models_mu_);
      it = fetches_.emplace(name, std::make_unique<model_fetch>(std::move(o))).first;
    }
    model_fetch* f = it->second.get();
    std::vector<share_source> sources;
    const std::string held = name + "@" + mp.spec.content;
    for (const auto& [id, pf] : facts)
      if (std::find(pf.holds.begin(), pf.holds.end(), held) != pf.holds.end())
        sources.push_back({pf.hex, transport::bulk::choose_backend(opt_.bulk_caps, pf.bulk_caps)});
    // The fastest kind of link first (rdma, shm, tcp); member order among equals.
    std::stable_sort(sources.begin(), sources.end(), [](const auto& a, const auto& b) {
      return static_cast<int>(a.backend) > static_cast<int>(b.backend);
    });
    f->want(std::move(sources), shards);
    if (auto t = f->complete_table(); t && !served_on_.contains(name)) {
      server_->add(name, f->path(), std::move(*t));  // every byte here: serve it on
      served_on_.insert(name);
    }
    if (local != models_.end()) continue;
    if (!std::all_of(shards.begin(), shards.end(), [&](const auto& s) { return f->ready_for(s); }))
      continue;
    auto opened = open_model(f->path(), name);
    if (!opened) {
      spdlog::error("serving {}: model '{}' fetched but does not open: {}", opt_.node_hex, name,
                    opened.error().describe());
      continue;
    }
    auto l = std::move(*opened);
    l->info.spec = mp.spec;  // the content it was verified against
    l->fetch = f;
    spdlog::info("serving {}: model '{}' fetched ({} of {} here)", opt_.node_hex, name,
                 inf::gguf::human_bytes(f->snapshot().bytes_total),
                 inf::gguf::human_bytes(l->info.file_bytes));
    model_names_.push_back(name);
    std::lock_guard lock(models_mu_);
    models_.push_back(std::move(l));
  }
}

/// Drops, after kReformAfter, the hosts of groups that failed to form because a peer was late
/// (may_form_later) and of groups that failed after they formed (a rank died or a link broke),
/// so that reconcile forms them again if the plan still names them. The latter matters when
/// the plan that replaces the failure names the same group (the same members, the same split):
/// after two of three peers restarted, the survivor's election plan gave the group the key of
/// the one that failed, and a survivor that kept its failed host never joined it (issue 33,
/// chaos --moe --hosts kill-two: every request timed out). True if it dropped one.
bool holdings::drop_unformed() {
  const auto now = clock_type::now();
  bool dropped = false;
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    const bool lost = it->second->current() == group_host::state::failed && it->second->was_ready();
    if (!lost && !it->second->may_form_later()) {
      ++it;
      continue;
    }
    auto [since, fresh] = unformed_since_.emplace(it->first, now);
    if (now - since->second < kReformAfter) {
      ++it;
      continue;
    }
    spdlog::info("serving {}: forming group {} again{}", opt_.node_hex, it->first,
                 lost ? " (it failed after it formed)" : "");
    unformed_since_.erase(since);
    it = erase_host(it, "its group failed");
    dropped = true;
  }
  std::erase_if(unformed_since_, [&](const auto& u) { return !hosts_.contains(u.first); });
  return dropped;
}

// ------------------------------------------------------------------ whole-model weights
void holdings::start_load(loaded& lm) {
  lm.state = loaded::weights::loading;
  lm.loaded_bytes = 0;
  lm.load_finished = false;
  spdlog::info("serving {}: loading model '{}' ({} MiB of weights) for a replica here",
               opt_.node_hex, lm.info.name, lm.total_bytes.load() >> 20);
  lm.loader = std::thread([this, &lm] {
    name_this_thread("model-load");
    set_this_thread_nice(opt_.compute_nice);
    mdl::load_options lo;
    lo.on_progress = [this, &lm](std::uint64_t done, std::uint64_t total) {
      lm.loaded_bytes = done;
      lm.total_bytes = total;
      if (opt_.on_load_progress) opt_.on_load_progress(lm.info.name, done, total);
    };
    auto m = mdl::model::load(*lm.file, lo);
    if (m) {
      lm.loaded_model = std::move(*m);
    } else {
      lm.load_error = m.error().describe();
    }
    lm.load_finished = true;
    hooks_.wake();  // takes the engine's lock: its wait sees the flag or this wake-up
  });
}

/// Takes finished loads in, and drops the weights of models the plan no longer gives this peer
/// a replica of once no stream uses them.
void holdings::tend_weights() {
  for (auto& lm : models_) {
    if (lm->state == loaded::weights::loading && lm->load_finished) {
      lm->loader.join();
      if (lm->loaded_model) {
        // A pass holds one stream's prefill chunk and the others' next tokens (more prefill
        // chunks in one round take more passes: prefill is bound by compute, not by streaming
        // the weights).
        auto ws = mdl::workspace::create(
            *lm->loaded_model,
            std::min<std::int64_t>(4096, std::int64_t{opt_.prefill_chunk} + opt_.max_batch_streams),
            std::min<std::int64_t>(lm->hp.n_ctx_train, opt_.max_context), pool_.size());
        if (ws) {
          lm->m = std::move(lm->loaded_model);
          lm->ws = std::move(*ws);
          lm->state = loaded::weights::ready;
          spdlog::info("serving {}: model '{}' loaded", opt_.node_hex, lm->info.name);
        } else {
          lm->loaded_model.reset();
          lm->load_error = ws.error().describe();
        }
      }
      if (lm->state != loaded::weights::ready) {
        lm->failure = lm->load_error;
        lm->state = loaded::weights::failed;
        spdlog::error("serving {}: model '{}' did not load: {}", opt_.node_hex, lm->info.name,
                      lm->failure);
      }
    }
    if (lm->state == loaded::weights::ready && !lm->wanted) {
      if (!hooks_.in_use(*lm)) {
        lm->ws.reset();
        lm->m.reset();
        lm->state = loaded::weights::none;
        spdlog::info("serving {}: model '{}' unloaded (the plan serves it elsewhere)",
                     opt_.node_hex, lm->info.name);
      }
    }
  }
}

void holdings::route_links(std::deque<group_link_message>&& batch) {
  for (auto& m : batch) {
    if (auto it = hosts_.find(m.key); it != hosts_.end()) {
      it->second->on_link_message(m);
      continue;
    }
    auto& q = early_links_[m.key];
    // Bounded; the sender re-sends.
    if (early_links_.size() > kMaxEarlyGroups || q.size() >= kMaxEarlyLinks) continue;
    q.push_back(std::move(m));
  }
}

/// Rank 0 of an idle group tells its followers it is alive (they bound their waits).
void holdings::ping_groups() {
  const auto now = clock_type::now();
  for (auto& [key, h] : hosts_) {
    auto* ru = h->runner();
    if (ru == nullptr) continue;
    auto& last = last_ping_[key];
    if (now - last < std::chrono::seconds(1)) continue;
    last = now;
    if (auto r = ru->ping(); !r) h->fail(r.error().describe());
  }
}

}  // namespace tessera::mesh::serving
