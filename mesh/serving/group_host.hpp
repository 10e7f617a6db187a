// One peer's part in a serving group split over several peers: loads this rank's slice of the
// model, negotiates a bulk link with every other rank over the control plane (both sides prepare,
// exchange connect params as group_link messages, connect), forms the collectives group and the
// sharded runner. Rank 0's runner is then driven by the engine thread; the other ranks run
// follow() on the host's own thread until the group is dropped or fails.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <msgpack.hpp>

#include "inference/collectives/group.hpp"
#include "inference/kernels/thread_pool.hpp"
#include "inference/model/model.hpp"
#include "inference/sharded/runner.hpp"
#include "mesh/membership/ids.hpp"
#include "mesh/placement/placement.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::mesh::serving {

/// Control-plane message carrying one side's bulk connect params for one pair of a group.
struct group_link_message {
  std::string key;  ///< group_key()
  std::uint32_t from_rank = 0, to_rank = 0;
  std::uint8_t backend = 0;
  std::vector<std::uint8_t> params;  ///< transport::bulk::encode(connect_params)
  MSGPACK_DEFINE_MAP(key, from_rank, to_rank, backend, params);
  member_id sender = no_member;  ///< not on the wire: the member the control link says sent it
};

/// A stable name for a group of a model: equal groups (same ranks, same slices) get equal keys on
/// every peer, so sticky plans keep their groups.
[[nodiscard]] std::string group_key(const std::string& model, const placement::serving_group& g);

/// How the group splits the model: pipeline, tensor, or hybrid (stages of tensor-parallel teams).
[[nodiscard]] result<inference::sharded::layout> layout_of(const placement::serving_group& g);

/// The part of the model rank `rank` of `g` loads (the whole model for a group of one).
[[nodiscard]] result<inference::model::shard_spec> shard_of(const placement::serving_group& g,
                                                            std::uint32_t rank);

class group_host;

/// The split groups of one engine, for a thread other than the one that drives them: the node's
/// loop aborts a group whose member left the cluster's view. A paused or cut-off peer's bulk link
/// reports nothing, so without this the ranks waiting on it would sit out the collectives'
/// timeout (15 s) before the streams move on. A host is listed from its construction to the start
/// of its destruction (which waits for an abort in progress).
class group_registry {
 public:
  /// Aborts every listed group with a rank on a member that was in an earlier `live` list and is
  /// not in this one (any thread). A member never seen live is left alone: a node that has not
  /// heard of a member yet (its membership still joining) must not abort that member's groups.
  void abort_without(const std::vector<member_id>& live);
  /// Aborts every listed group whose key is not in `planned` (the split groups of the plan now in
  /// force): the plan moved on — a cut between two ranks that both stay members, say — and the
  /// rank driving the group would otherwise notice only when its collectives time out.
  void abort_unplanned(const std::set<std::string>& planned, const std::string& plan_name);

 private:
  friend class group_host;
  std::mutex mu_;
  std::vector<group_host*> hosts_;
  // Members seen live; bounded by the live list plus the members of the listed groups.
  std::set<member_id> seen_live_;
};

class group_host {
 public:
  using sender = std::function<void(member_id to, const group_link_message& m)>;
  /// Wraps each connected bulk link (the node's fault layer: `tessera fault` reaches tensors).
  using link_wrapper = std::function<std::unique_ptr<transport::bulk::link>(
      std::unique_ptr<transport::bulk::link> link, member_id peer)>;
  enum class state { forming, ready, failed };

  /// Starts forming the group on a thread of its own. `self_rank` indexes g.ranks.
  group_host(std::string key, std::string model_path, placement::serving_group g,
             std::uint32_t self_rank, transport::bulk::link_addresses addresses,
             std::map<member_id, transport::bulk::local_capabilities> caps,
             transport::bulk::local_capabilities own_caps, sender send, std::uint32_t threads,
             link_wrapper wrap = {}, group_registry* registry = nullptr, int compute_nice = 0,
             std::shared_ptr<inference::compute_gate> gate = nullptr,
             inference::kv_cache_type kv_cache = inference::kv_cache_type::f16);
  ~group_host();  ///< closes the links (a follower's follow() fails) and joins
  group_host(const group_host&) = delete;
  group_host& operator=(const group_host&) = delete;

  /// A peer's params for our pair (routed here by the engine).
  void on_link_message(const group_link_message& m);

  [[nodiscard]] state current() const;
  /// True once the group was ready: a later failure is a lost peer (the plan moves on), not a
  /// group that can never form.
  [[nodiscard]] bool was_ready() const;
  [[nodiscard]] std::string failure() const;
  /// Failed while forming because a peer did not show up in time, or its bulk link would not
  /// connect (it restarted): forming again may succeed.
  [[nodiscard]] bool may_form_later() const;
  /// Rank 0 once ready: the runner (used by one thread: the engine's).
  [[nodiscard]] inference::sharded::runner* runner() const;
  /// Rank 0: marks the group failed (its runner returned an error).
  void fail(std::string why);
  /// Any thread: the group's collectives fail now (errc::cancelled, `why`) instead of waiting on
  /// a peer that is gone; the rank driving it then fails the group as on any collective error.
  void abort(const std::string& why);
  /// The members of the group's ranks, in rank order (fixed at construction; any thread).
  [[nodiscard]] std::vector<member_id> members() const;
  [[nodiscard]] const std::string& key() const { return key_; }
  [[nodiscard]] std::uint32_t size() const { return static_cast<std::uint32_t>(g_.ranks.size()); }
  /// An MoE model's rank once ready (any thread): the first expert it holds and the rows routed
  /// to each of its experts so far. Empty otherwise.
  [[nodiscard]] std::optional<std::pair<std::int64_t, std::vector<std::uint64_t>>> expert_load()
      const;

 private:
  void run();
  result<void> form();
  result<void> prepare_links(std::vector<std::unique_ptr<transport::bulk::link_setup>>& setups,
                             std::vector<group_link_message>& mine);
  result<void> exchange_params(const std::vector<group_link_message>& mine);
  result<void> connect_links(std::vector<std::unique_ptr<transport::bulk::link_setup>>& setups);

  std::string key_, path_;
  placement::serving_group g_;
  std::uint32_t self_;
  transport::bulk::link_addresses addresses_;
  std::map<member_id, transport::bulk::local_capabilities> caps_;
  transport::bulk::local_capabilities own_caps_;
  sender send_;
  link_wrapper wrap_;
  std::uint32_t threads_;
  group_registry* registry_;
  int compute_nice_;  // of the forming/following thread and the group's compute pool
  std::shared_ptr<inference::compute_gate> gate_;  // the node's compute budget (the engine's)
  inference::kv_cache_type kv_cache_;              // of this rank's sequences

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint32_t, group_link_message> received_;  // by from_rank
  state state_ = state::forming;
  bool was_ready_ = false;
  bool retry_ = false;
  std::string failure_;
  std::string abort_reason_;  // set by abort(); applied to the group as soon as it exists
  std::atomic<bool> stopping_{false};

  std::unique_ptr<inference::thread_pool> pool_;
  std::unique_ptr<inference::model::model> shard_;
  std::vector<std::unique_ptr<transport::bulk::link>> links_;
  std::unique_ptr<inference::collectives::group> group_;
  std::unique_ptr<inference::sharded::runner> runner_;
  std::thread thread_;
};

}  // namespace tessera::mesh::serving
