// What one peer holds for the plan in force: its models (their files, tokenizers, and the weights
// of the ones the plan gives it a replica of), the split groups it is a rank of (group hosts),
// the parts of models it fetches from peers, and the share server that hands its own files on.
//
// One concern: bringing this peer's weights and groups in line with the plan. The engine's
// streams use what is here (a loaded model, a ready host) and are told when something they use
// goes away (hooks::host_dropped). Engine thread only, except the members marked otherwise; a
// model's weights load on a "model-load" thread of their own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/base/result.hpp"
#include "inference/gguf/gguf.hpp"
#include "inference/kernels/thread_pool.hpp"
#include "inference/model/model.hpp"
#include "inference/tokenizer/chat.hpp"
#include "inference/tokenizer/json_grammar.hpp"
#include "inference/tokenizer/tokenizer.hpp"
#include "mesh/serving/engine.hpp"
#include "mesh/serving/group_host.hpp"
#include "mesh/serving/model_share.hpp"

namespace tessera::mesh::serving {

/// A model this peer has the file of. Its tokenizer and hyper-parameters are read at start (and its
/// tensors checked); its weights are loaded only while the plan gives this peer a group of its own
/// for it (a replica), on a loader thread, and dropped when the plan moves it elsewhere: a peer
/// that serves a slice of the model holds only the slice (in its group_host).
struct loaded {
  enum class weights : std::uint8_t { none, loading, ready, failed };

  local_model info;
  std::unique_ptr<inference::gguf::file> file;  // headers only: the loader reads the ranges
  std::unique_ptr<inference::tokenizer::tokenizer> tok;
  inference::model::hparams hp;
  inference::tokenizer::chat_template chat;  // the file's Jinja template, else a built-in family
  // The vocabulary as JSON-constrained sampling sees it: made by the engine thread at the first
  // request that asks for a JSON answer.
  std::unique_ptr<inference::tokenizer::json_vocab> json_vocab;
  // A model fetched from peers (its file holds only the parts fetched): every use of a part waits
  // until fetch->ready_for() it. Null for a file of our own.
  model_fetch* fetch = nullptr;
  // Written by the engine thread only; atomic so that status() may read it from another thread.
  std::atomic<weights> state{weights::none};
  // --- engine thread ---
  bool wanted = false;                              // the plan gives this peer a replica of it
  std::unique_ptr<inference::model::model> m;       // state == ready
  std::unique_ptr<inference::model::workspace> ws;  // scratch of the batched passes
  std::string failure;                              // state == failed: why
  std::thread loader;
  // --- written by the loader thread, read by the engine thread and status() ---
  std::atomic<bool> load_finished{false};
  std::unique_ptr<inference::model::model> loaded_model;  // valid once load_finished
  std::string load_error;                                 // valid once load_finished
  std::atomic<std::uint64_t> loaded_bytes{0}, total_bytes{0};

  loaded() = default;
  loaded(const loaded&) = delete;
  loaded& operator=(const loaded&) = delete;
  ~loaded() {
    if (loader.joinable()) loader.join();
  }
};

[[nodiscard]] const char* weights_name(loaded::weights w);

class holdings {
 public:
  using clock_type = std::chrono::steady_clock;
  struct hooks {
    /// A load or a fetch finished: the engine thread should look again (any thread).
    std::function<void()> wake;
    /// The plan dropped a group, or it failed and forms again: the streams on it end (engine
    /// thread; the host is erased right after).
    std::function<void(group_host& host, std::string_view why)> host_dropped;
    /// Whether a local stream still uses the model's whole weights (engine thread).
    std::function<bool(const loaded& model)> in_use;
  };

  /// `pool` and `gate`: the engine's compute (a replica's workspace is sized by the pool; split
  /// groups share the gate). Both outlive this.
  holdings(const engine_options& opt, inference::thread_pool& pool,
           std::shared_ptr<inference::compute_gate> gate, hooks h);
  ~holdings();
  holdings(const holdings&) = delete;
  holdings& operator=(const holdings&) = delete;

  /// At start: one of this peer's own files (its header, tokenizer, tensors and content hash).
  /// Errors name the file; two models of one name are refused.
  [[nodiscard]] result<void> add_own(const std::string& path);

  /// Brings the replicas, the group hosts and the fetches in line with `p` (null: none), given
  /// the live members' facts. Reconcile again when the plan changes or refresh() says so.
  void reconcile(const placement::plan* p, const std::map<member_id, peer_facts>& facts);
  /// True when a fetch changed (finished, failed) or a failed group is due to form again: the
  /// engine reconciles even though the plan is the same.
  [[nodiscard]] bool refresh();
  /// Whether a load finished that tend_weights() has not taken in yet (under the engine's lock,
  /// in its wait predicate; any thread).
  [[nodiscard]] bool needs_tending() const;
  /// Takes finished loads in, and drops the weights of models the plan no longer gives this peer
  /// a replica of once no stream uses them.
  void tend_weights();
  /// Delivers group_link messages to their hosts (or holds them, bounded, for a host not made
  /// yet), and lets idle groups' followers know rank 0 is alive.
  void route_links(std::deque<group_link_message>&& batch);
  void ping_groups();
  /// Shutdown: the hosts tell their followers and close their links; loads finish first.
  void stop_groups();
  /// Fetchers see their links go down; fetches in progress stop (their bytes stay on disk).
  void stop_sharing();

  // --- what the engine's streams use (engine thread) ---
  [[nodiscard]] loaded* find(const std::string& name);
  [[nodiscard]] const std::vector<std::unique_ptr<loaded>>& models() const { return models_; }
  [[nodiscard]] const std::vector<std::string>& model_names() const { return model_names_; }
  /// Models whose bytes are still on their way here (intake stays silent for them).
  [[nodiscard]] std::vector<std::string> fetching() const;
  [[nodiscard]] group_host* host(const std::string& key);
  [[nodiscard]] const std::map<std::string, std::unique_ptr<group_host>>& hosts() const {
    return hosts_;
  }
  /// The local models' descriptions (own files; fixed after start).
  [[nodiscard]] const std::vector<local_model>& own() const { return own_; }

  // --- any thread ---
  /// The hosts, for set_plan() on the node's thread (it aborts the groups of a member the view
  /// dropped, which the engine thread cannot do while it waits inside one of them).
  [[nodiscard]] group_registry& registry() { return registry_; }
  [[nodiscard]] std::vector<placement::model_spec> held_specs() const;
  void on_share(const std::string& from_hex, const share_setup& m);
  /// {"models", "fetches", "share"} of the engine's status.
  void status(nlohmann::ordered_json& j) const;
  /// MoE replicas' expert load, for the engine's status (engine thread).
  [[nodiscard]] std::vector<nlohmann::ordered_json> replicas_view() const;

 private:
  void fetch_missing(const placement::plan* p, const std::map<member_id, peer_facts>& facts);
  void form_groups(const placement::plan* p, const std::map<member_id, peer_facts>& facts);
  bool drop_unformed();
  void start_load(loaded& lm);
  std::map<std::string, std::unique_ptr<group_host>>::iterator erase_host(
      std::map<std::string, std::unique_ptr<group_host>>::iterator it, std::string_view why);

  const engine_options& opt_;
  inference::thread_pool& pool_;
  std::shared_ptr<inference::compute_gate> gate_;
  hooks hooks_;
  std::vector<local_model> own_;
  std::vector<std::string> model_names_;

  // Guards `models_` growing (the engine thread adopts a fetched model) and `fetches_` against
  // status() and on_share() on other threads; the engine thread reads both without it.
  mutable std::mutex models_mu_;
  std::vector<std::unique_ptr<loaded>> models_;
  std::unique_ptr<share_server> server_;                         // our files, to fetchers
  std::map<std::string, std::unique_ptr<model_fetch>> fetches_;  // by model name
  std::uint64_t next_fetch_id_ = 1;
  std::atomic<bool> fetch_changed_{false};  // a fetch finished or failed: reconcile again
  std::set<std::string> served_on_;         // fetched models the share server serves on

  group_registry registry_;
  std::map<std::string, std::unique_ptr<group_host>> hosts_;  // groups split over peers, by key
  std::map<std::string, std::deque<group_link_message>> early_links_;  // for hosts not made yet
  std::map<std::string, clock_type::time_point> last_ping_;
  std::map<std::string, clock_type::time_point> unformed_since_;  // failed hosts: since when
};

}  // namespace tessera::mesh::serving
