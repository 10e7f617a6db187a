// Placement: the leader's plan — which peers serve which model, and how each serving group splits
// the model by tensor parallelism (attention heads, FFN columns) and pipeline parallelism (layer
// ranges). Pure logic: no I/O, no clock, no randomness. Rules and a worked example:
// docs/design/010-placement.md.
//
//   view (members + links) ─┐
//   models requested ───────┼─► compute_plan ─► plan{epoch, per model: groups | no_capacity}
//   previous plan ──────────┘          │
//                                      ├─► shard_tensors(model, rank)  (what a rank loads)
//                                      └─► route_request(plan, model, request id) (which group)
//
// Determinism and stability: inputs are sorted by id and name before use; a previous group that is
// still valid is kept exactly (sticky); the epoch version moves only when the content changes, so
// a new leader computing from the same view and the published plan reproduces it bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/result.hpp"
#include "mesh/membership/ids.hpp"

namespace tessera::mesh::placement {

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

/// A model file a member holds on disk.
struct model_file {
  std::string name;
  std::uint64_t size_bytes = 0;
  std::string hash;  ///< content hash as reported by the member (opaque here)
  bool operator==(const model_file&) const = default;
  MSGPACK_DEFINE(name, size_bytes, hash);
};

/// What a member offers. `memory_free_bytes` is the memory available to tessera's shards on that
/// node, counting memory already held by shards of the current plan (the node reports
/// free + its own shard bytes): the planner re-checks kept assignments against it.
struct member_caps {
  member_id id = no_member;
  std::uint32_t cores = 1;
  std::uint64_t memory_total_bytes = 0;
  std::uint64_t memory_free_bytes = 0;
  std::vector<model_file> models;  ///< carried for the view; the planner does not use it yet
  bool operator==(const member_caps&) const = default;
  MSGPACK_DEFINE(id, cores, memory_total_bytes, memory_free_bytes, models);
};

enum class link_backend : std::uint8_t { tcp = 0, shm = 1, rdma = 2 };

/// One directed link as measured by topology.
struct link_info {
  member_id from = no_member;
  member_id to = no_member;
  std::uint32_t rtt_us = 0;
  std::uint32_t bandwidth_mb_s = 0;
  link_backend backend = link_backend::tcp;
  bool operator==(const link_info&) const = default;
  MSGPACK_DEFINE(from, to, rtt_us, bandwidth_mb_s, backend);
};

/// The shape of a llama-family model, enough to split it and to estimate memory per rank.
struct model_spec {
  std::string name;
  std::uint32_t n_layers = 0;
  std::uint32_t n_heads = 0;     ///< attention (query) heads
  std::uint32_t n_kv_heads = 0;  ///< KV heads (GQA when < n_heads; must divide n_heads)
  std::uint32_t dim = 0;         ///< model width (n_embd); head_dim = dim / n_heads
  std::uint32_t ffn_size = 0;    ///< FFN hidden width (columns of ffn_gate/up rows)
  std::uint32_t n_vocab = 0;
  std::uint64_t bytes_per_layer = 0;     ///< all weights of one block
  std::uint64_t bytes_embeddings = 0;    ///< token_embd.weight
  std::uint64_t bytes_output = 0;        ///< output.weight (0 when tied to token_embd)
  std::uint64_t kv_bytes_per_token = 0;  ///< K+V cache of one token, all layers, all KV heads
  std::uint32_t context_tokens = 0;      ///< KV cache sized for this many tokens
  std::uint32_t ffn_block = 32;          ///< FFN column split unit (quantization block rows)
  std::uint32_t column_block = 32;       ///< a column (input-dim) split must be a multiple of it
  bool tied_embeddings = false;          ///< output projection is token_embd
  /// A mixture of experts: n_experts experts of ffn_size / n_experts hidden units each (ffn_block
  /// a multiple of that width, so a rank's FFN range holds whole experts); 0 for a dense FFN.
  std::uint32_t n_experts = 0;
  std::uint32_t n_experts_used = 0;
  /// The file's content id (mesh/serving/model_share: hash of its chunk table); "" when unknown.
  /// Peers plan together only over equal content, and a fetcher verifies what it receives by it.
  std::string content;
  bool operator==(const model_spec&) const = default;
  MSGPACK_DEFINE(name, n_layers, n_heads, n_kv_heads, dim, ffn_size, n_vocab, bytes_per_layer,
                 bytes_embeddings, bytes_output, kv_bytes_per_token, context_tokens, ffn_block,
                 column_block, tied_embeddings, content, n_experts, n_experts_used);
};

/// Everything the planner looks at. Order does not matter: the planner sorts.
struct plan_input {
  std::vector<member_caps> members;
  std::vector<link_info> links;
  std::vector<model_spec> models;
};

/// Planner knobs. Every peer that may lead must use the same values (they come from the cluster
/// config), or two leaders would compute different plans from the same view.
struct planner_config {
  /// A link carries tensor parallelism (an all-reduce per layer) when both directions have
  /// rtt_us ≤ this, or use shm/rdma.
  std::uint32_t tp_max_rtt_us = 100;
  /// Bytes kept free on each member (activations, scratch, the OS).
  std::uint64_t reserve_bytes = 0;
  /// Most ranks in one tensor-parallel stage.
  std::uint32_t max_tp_ranks = 8;
  /// Most pipeline stages in one group.
  std::uint32_t max_stages = 16;
  /// Most serving groups per model.
  std::uint32_t max_replicas = 16;
  /// Ignore the previous plan's assignments (an operator asked to rebalance).
  bool rebalance = false;
};

/// Bounds on inputs; beyond them compute_plan refuses with invalid_argument.
// A full mesh of 256 peers is already 65 280 measured links; topology negotiates a full mesh.
inline constexpr std::size_t max_members = 256;
inline constexpr std::size_t max_models = 64;
inline constexpr std::size_t max_links = max_members * (max_members - 1);

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

/// Plans are ordered by (term, version). version grows by one each time the content changes and
/// stays put otherwise — also across leader changes, so traffic tagged with the epoch keeps
/// flowing when a new leader reproduces the same plan.
struct plan_epoch {
  std::uint64_t term = 0;
  std::uint64_t version = 0;
  auto operator<=>(const plan_epoch&) const = default;
  MSGPACK_DEFINE(term, version);
};

/// One rank of a serving group: one node, one pipeline stage, one tensor-parallel slice.
/// Ranges are half-open [first, last).
struct rank_assignment {
  member_id node = no_member;
  std::uint32_t stage = 0;    ///< pipeline stage index (0 holds the embeddings)
  std::uint32_t tp_rank = 0;  ///< index inside the stage's tensor-parallel set
  std::uint32_t tp_size = 1;  ///< ranks in the stage
  std::uint32_t layer_first = 0, layer_last = 0;
  std::uint32_t head_first = 0, head_last = 0;        ///< query heads
  std::uint32_t kv_head_first = 0, kv_head_last = 0;  ///< KV heads held (GQA-consistent)
  std::uint32_t ffn_first = 0, ffn_last = 0;          ///< FFN hidden columns
  std::uint32_t vocab_first = 0, vocab_last = 0;  ///< token_embd / output rows (first, last stage)
  bool first_stage = false;
  bool last_stage = false;
  bool operator==(const rank_assignment&) const = default;
  MSGPACK_DEFINE(node, stage, tp_rank, tp_size, layer_first, layer_last, head_first, head_last,
                 kv_head_first, kv_head_last, ffn_first, ffn_last, vocab_first, vocab_last,
                 first_stage, last_stage);
};

/// A serving group (replica): ranks ordered by (stage, tp_rank).
struct serving_group {
  std::vector<rank_assignment> ranks;
  bool operator==(const serving_group&) const = default;
  MSGPACK_DEFINE(ranks);
};

/// The plan of one model: groups, or why there are none.
struct model_plan {
  model_spec spec;  ///< the spec the groups were computed for (a changed spec invalidates them)
  std::vector<serving_group> groups;
  std::string no_capacity;  ///< non-empty ⇔ groups is empty: the reason, for client errors
  /// No group only for want of links the view does not hold yet (a peer joining, before both
  /// sides report their link): a group would fit were they up. Intake then holds requests (the
  /// client re-publishes) instead of refusing them as the capacity comes back.
  bool links_pending = false;
  bool operator==(const model_plan&) const = default;
  MSGPACK_DEFINE(spec, groups, no_capacity, links_pending);
};

struct plan {
  plan_epoch epoch;
  std::vector<model_plan> models;  ///< sorted by spec.name
  bool operator==(const plan&) const = default;
  MSGPACK_DEFINE(epoch, models);
};

// ---------------------------------------------------------------------------------------------
// Planner
// ---------------------------------------------------------------------------------------------

/// Checks a model spec: non-empty name (≤ 256 bytes), n_heads a multiple of n_kv_heads, dim a
/// multiple of n_heads, ffn_block a multiple of column_block, sizes in bounds. invalid_argument
/// naming the model and the field otherwise.
[[nodiscard]] result<void> validate_model_spec(const model_spec& spec);

/// Computes the plan for `input` as leader of `term`. With `previous`, groups still valid (every
/// node present, memory still sufficient, tensor-parallel links still fast, same spec) are kept
/// unchanged; the rest are re-planned from unused members, one replica per model per round in
/// model-name order. If the content equals `previous`'s, `previous` is returned unchanged (same
/// epoch); otherwise the epoch is {term, previous.version + 1} (version 1 without previous).
/// Errors (invalid_argument): duplicate or zero member ids, members with 0 cores, duplicate
/// links or model names, inconsistent model shapes (validate_model_spec), bounds exceeded, `term`
/// below previous's term. Links naming non-members are ignored. A malformed previous group is
/// dropped (re-planned), never an error.
[[nodiscard]] result<plan> compute_plan(const plan_input& input, const plan* previous,
                                        std::uint64_t term, const planner_config& config = {});

/// True when a and b assign the same work (epochs ignored).
[[nodiscard]] bool plan_equal_content(const plan& a, const plan& b);

/// A 64-bit hash of the content (epoch excluded): equal content ⇔ equal hash (up to collisions).
/// Stable across processes and builds: FNV-1a over the msgpack encoding of `models`.
[[nodiscard]] std::uint64_t plan_content_hash(const plan& p);

/// Checks a plan against a model spec: ranges in bounds, stages cover every layer once, each
/// stage's heads / FFN columns / vocab rows split exactly once, KV heads GQA-consistent.
/// Used by tests and by peers receiving a plan from the wire.
[[nodiscard]] result<void> validate_group(const model_spec& spec, const serving_group& group);

/// Estimated bytes a rank needs (weights of its slices + its KV cache share).
[[nodiscard]] std::uint64_t rank_memory_bytes(const model_spec& spec, const rank_assignment& r);

// ---------------------------------------------------------------------------------------------
// Shards
// ---------------------------------------------------------------------------------------------

enum class slice_axis : std::uint8_t {
  whole = 0,    ///< the entire tensor
  rows = 1,     ///< rows [first, last) of a [rows][cols] tensor (GGUF ne[1]): contiguous bytes
  columns = 2,  ///< columns [first, last) (GGUF ne[0], the input dim): a strided slice per row
};

/// One piece of one GGUF tensor a rank loads.
struct tensor_slice {
  std::string name;  ///< llama.cpp name, e.g. "blk.3.attn_q.weight"
  slice_axis axis = slice_axis::whole;
  std::uint64_t first = 0, last = 0;  ///< rows or columns; whole: [0, rows)
  bool operator==(const tensor_slice&) const = default;
};

/// The tensors a model has and their [rows][cols] shape, in GGUF name order per layer.
struct tensor_shape {
  std::string name;
  std::uint64_t rows = 0, cols = 0;
};
[[nodiscard]] std::vector<tensor_shape> model_tensors(const model_spec& spec);

/// The slices of the GGUF tensors `rank` needs. Convention (llama.cpp names, head_dim =
/// dim/n_heads): attn_q rows [head_first·hd, head_last·hd); attn_k / attn_v rows [kv_first·hd,
/// kv_last·hd); attn_output columns [head_first·hd, head_last·hd) and ffn_down columns [ffn_first,
/// ffn_last) → each rank computes a partial sum, the stage all-reduces; ffn_gate / ffn_up rows
/// [ffn_first, ffn_last); attn_norm / ffn_norm whole; token_embd rows [vocab_first, vocab_last)
/// on first-stage ranks (a rank looks up the tokens it holds, zeros otherwise, the stage
/// all-reduces); output rows [vocab_first, vocab_last) on last-stage ranks (token_embd rows when
/// tied) plus output_norm whole → logits all-gathered. Errors when the assignment is out of the
/// model's bounds or a column split is not a multiple of spec.column_block.
[[nodiscard]] result<std::vector<tensor_slice>> shard_tensors(const model_spec& spec,
                                                              const rank_assignment& rank);

// ---------------------------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------------------------

/// Picks the group of `model` that takes `request_id`: weighted rendezvous hashing over the
/// groups keyed by their node ids, integer-only, so every peer holding the same plan agrees and
/// adding or removing one group moves only the requests that group gains or loses. `weights`
/// (optional, one per group, clamped to [1, 64]) are capacity / load hints; default 1 each. A
/// weight of 0 takes the group out (it cannot serve now: a member is down) — the request goes
/// where it would go if the group were not in the plan, as it will once the plan drops it — unless
/// every group has 0, when all count as 1.
/// Errors: not_found (model not in the plan), no_capacity (the model's no_capacity reason),
/// invalid_argument (weights size mismatch).
[[nodiscard]] result<std::size_t> route_request(const plan& p, std::string_view model,
                                                std::string_view request_id,
                                                const std::vector<std::uint32_t>& weights = {});

}  // namespace tessera::mesh::placement

MSGPACK_ADD_ENUM(tessera::mesh::placement::link_backend);
