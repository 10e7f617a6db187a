// A model's shape: the checks of a model_spec and of a serving group against it, the memory one
// rank's share costs, the model's tensors and the slices of them a rank holds. Planning
// (placement.cpp) uses these; so do the peers that load a rank's slices.
#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "mesh/placement/placement.hpp"
#include "mesh/placement/spec_math.hpp"

namespace tessera::mesh::placement {
using namespace detail;
namespace {

constexpr std::uint32_t max_dim = 1u << 20;
constexpr std::uint32_t max_layers = 4096;
constexpr std::uint32_t max_vocab = 1u << 24;
constexpr std::size_t max_name_bytes = 256;
constexpr std::size_t max_group_ranks = 1024;

result<void> check_range(const model_spec& s, const rank_assignment& r) {
  const bool in_bounds =
      r.layer_first < r.layer_last && r.layer_last <= s.n_layers && r.head_first < r.head_last &&
      r.head_last <= s.n_heads && r.kv_head_first < r.kv_head_last &&
      r.kv_head_last <= s.n_kv_heads && r.ffn_first < r.ffn_last && r.ffn_last <= s.ffn_size &&
      r.vocab_first <= r.vocab_last && r.vocab_last <= s.n_vocab &&
      (r.first_stage || r.last_stage ? r.vocab_first < r.vocab_last : r.vocab_last == 0) &&
      r.tp_rank < r.tp_size;
  if (!in_bounds) {
    return make_error(
        errc::invalid_argument,
        "model {}: rank on node {:016x} is out of the model's bounds (layers [{}, {}) "
        "of {}, heads [{}, {}) of {}, kv [{}, {}) of {}, ffn [{}, {}) of {}, vocab "
        "[{}, {}) of {})",
        s.name, r.node, r.layer_first, r.layer_last, s.n_layers, r.head_first, r.head_last,
        s.n_heads, r.kv_head_first, r.kv_head_last, s.n_kv_heads, r.ffn_first, r.ffn_last,
        s.ffn_size, r.vocab_first, r.vocab_last, s.n_vocab);
  }
  const auto [kf, kl] = kv_range(s, r.head_first, r.head_last);
  if (kf != r.kv_head_first || kl != r.kv_head_last) {
    return make_error(errc::invalid_argument,
                      "model {}: rank on node {:016x} holds KV heads [{}, {}) but its query heads "
                      "[{}, {}) need [{}, {})",
                      s.name, r.node, r.kv_head_first, r.kv_head_last, r.head_first, r.head_last,
                      kf, kl);
  }
  return ok();
}


}  // namespace

result<void> validate_model_spec(const model_spec& s) {
  auto bad = [&](std::string_view what) {
    return make_error(errc::invalid_argument, "model '{}': {}", s.name.substr(0, max_name_bytes),
                      what);
  };
  if (s.name.empty() || s.name.size() > max_name_bytes) return bad("name empty or over 256 bytes");
  if (s.n_layers == 0 || s.n_layers > max_layers) return bad("n_layers must be in [1, 4096]");
  if (s.n_heads == 0 || s.n_kv_heads == 0 || s.n_heads % s.n_kv_heads != 0) {
    return bad(fmt::format("n_heads {} must be a non-zero multiple of n_kv_heads {}", s.n_heads,
                           s.n_kv_heads));
  }
  if (s.dim == 0 || s.dim > max_dim || s.dim % s.n_heads != 0) {
    return bad(
        fmt::format("dim {} must be in [1, 2^20] and a multiple of n_heads {}", s.dim, s.n_heads));
  }
  if (s.ffn_size == 0 || s.ffn_size > max_dim) return bad("ffn_size must be in [1, 2^20]");
  if (s.n_vocab == 0 || s.n_vocab > max_vocab) return bad("n_vocab must be in [1, 2^24]");
  if (s.n_experts > 0 &&
      (s.ffn_size % s.n_experts != 0 || s.n_experts_used == 0 || s.n_experts_used > s.n_experts ||
       s.ffn_block % (s.ffn_size / s.n_experts) != 0)) {
    return bad(
        fmt::format("experts: {} of them ({} used) must divide ffn_size {} and ffn_block {} "
                    "must hold whole experts",
                    s.n_experts, s.n_experts_used, s.ffn_size, s.ffn_block));
  }
  if (s.column_block == 0 || s.ffn_block == 0 || s.ffn_block % s.column_block != 0) {
    return bad(fmt::format("ffn_block {} must be a non-zero multiple of column_block {}",
                           s.ffn_block, s.column_block));
  }
  if (s.bytes_per_layer == 0) return bad("bytes_per_layer is 0");
  constexpr std::uint64_t max_bytes = 1ULL << 50;
  if (s.bytes_per_layer > max_bytes || s.bytes_embeddings > max_bytes ||
      s.bytes_output > max_bytes || s.kv_bytes_per_token > max_bytes) {
    return bad("a byte size is over 2^50");
  }
  return ok();
}

std::uint64_t rank_memory_bytes(const model_spec& spec, const rank_assignment& r) {
  // Nonsense in, "does not fit anywhere" out: never a division by zero or a wrapped range.
  if (!validate_model_spec(spec) || r.layer_last < r.layer_first || r.head_last < r.head_first ||
      r.kv_head_last < r.kv_head_first || r.ffn_last < r.ffn_first ||
      r.vocab_last < r.vocab_first) {
    return UINT64_MAX;
  }
  const rank_cost c =
      cost_of(spec, r.head_last - r.head_first, r.kv_head_last - r.kv_head_first,
              r.ffn_last - r.ffn_first, r.vocab_last - r.vocab_first, r.first_stage, r.last_stage);
  return c.extras + c.per_layer * (r.layer_last - r.layer_first);
}

result<void> validate_group(const model_spec& s, const serving_group& g) {
  auto bad = [&](std::string what) {
    return make_error(errc::invalid_argument, "model {}: malformed group: {}", s.name, what);
  };
  TESSERA_TRY(validate_model_spec(s));
  if (g.ranks.empty() || g.ranks.size() > max_group_ranks) return bad("no ranks or over 1024");
  std::set<member_id> nodes;
  std::uint32_t layer = 0;
  const std::uint32_t last_stage = g.ranks.back().stage;
  std::size_t i = 0;
  for (std::uint32_t stage = 0; stage <= last_stage; ++stage) {
    if (i >= g.ranks.size() || g.ranks[i].stage != stage) {
      return bad(fmt::format("stage {} missing or ranks out of order", stage));
    }
    const std::uint32_t size = g.ranks[i].tp_size;
    if (size == 0 || i + size > g.ranks.size()) return bad(fmt::format("stage {} size", stage));
    if (size > 1 && !tp_allowed(s)) {
      return bad(
          fmt::format("tensor parallelism needs head_dim {} to be a multiple of "
                      "column_block {}",
                      head_dim(s), s.column_block));
    }
    const rank_assignment& head = g.ranks[i];
    if (head.layer_first != layer) return bad(fmt::format("stage {} layers not contiguous", stage));
    std::uint32_t h = 0, f = 0, v = 0;
    for (std::uint32_t r = 0; r < size; ++r, ++i) {
      const rank_assignment& a = g.ranks[i];
      TESSERA_TRY(check_range(s, a));
      if (a.node == no_member || !nodes.insert(a.node).second) {
        return bad(fmt::format("node {:016x} is zero or appears twice", a.node));
      }
      if (a.stage != stage || a.tp_rank != r || a.tp_size != size ||
          a.layer_first != head.layer_first || a.layer_last != head.layer_last ||
          a.first_stage != (stage == 0) || a.last_stage != (stage == last_stage)) {
        return bad(fmt::format("rank {} of stage {} inconsistent with its stage", r, stage));
      }
      if (a.head_first != h || a.ffn_first != f || a.vocab_first != v) {
        return bad(
            fmt::format("stage {} rank {}: ranges do not continue the previous rank's", stage, r));
      }
      if (a.ffn_first % s.ffn_block != 0) {
        return bad(fmt::format("ffn column {} is not a multiple of ffn_block {}", a.ffn_first,
                               s.ffn_block));
      }
      h = a.head_last;
      f = a.ffn_last;
      v = a.vocab_last;
    }
    const bool vocab_split = stage == 0 || stage == last_stage;
    if (h != s.n_heads || f != s.ffn_size || v != (vocab_split ? s.n_vocab : 0)) {
      return bad(
          fmt::format("stage {} does not cover all heads / FFN columns / vocab rows", stage));
    }
    layer = head.layer_last;
  }
  if (i != g.ranks.size() || layer != s.n_layers) return bad("layers not all covered");
  return ok();
}

std::vector<tensor_shape> model_tensors(const model_spec& s) {
  const std::uint64_t q = std::uint64_t{s.n_heads} * head_dim(s);
  const std::uint64_t kv = std::uint64_t{s.n_kv_heads} * head_dim(s);
  std::vector<tensor_shape> t;
  t.push_back({"token_embd.weight", s.n_vocab, s.dim});
  for (std::uint32_t l = 0; l < s.n_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    t.push_back({b + "attn_norm.weight", s.dim, 1});
    t.push_back({b + "attn_q.weight", q, s.dim});
    t.push_back({b + "attn_k.weight", kv, s.dim});
    t.push_back({b + "attn_v.weight", kv, s.dim});
    t.push_back({b + "attn_output.weight", s.dim, q});
    t.push_back({b + "ffn_norm.weight", s.dim, 1});
    if (s.n_experts > 0) {
      // Stacked experts read as 2-D: [n_experts · width][dim] and [n_experts · dim][width].
      t.push_back({b + "ffn_gate_inp.weight", s.n_experts, s.dim});
      t.push_back({b + "ffn_gate_exps.weight", s.ffn_size, s.dim});
      t.push_back({b + "ffn_up_exps.weight", s.ffn_size, s.dim});
      t.push_back({b + "ffn_down_exps.weight", std::uint64_t{s.n_experts} * s.dim,
                   s.ffn_size / s.n_experts});
    } else {
      t.push_back({b + "ffn_gate.weight", s.ffn_size, s.dim});
      t.push_back({b + "ffn_up.weight", s.ffn_size, s.dim});
      t.push_back({b + "ffn_down.weight", s.dim, s.ffn_size});
    }
  }
  t.push_back({"output_norm.weight", s.dim, 1});
  if (!s.tied_embeddings) t.push_back({"output.weight", s.n_vocab, s.dim});
  return t;
}

result<std::vector<tensor_slice>> shard_tensors(const model_spec& s, const rank_assignment& r) {
  TESSERA_TRY(validate_model_spec(s));
  TESSERA_TRY(check_range(s, r));
  const std::uint64_t hd = head_dim(s);
  auto column_ok = [&](std::uint64_t col, std::uint64_t end) {
    return col % s.column_block == 0 || col == end;
  };
  // Of a mixture of experts the FFN range cuts rows of the stacked experts, not columns.
  const bool ffn_columns = s.n_experts == 0;
  if (!column_ok(r.head_first * hd, s.n_heads * hd) ||
      !column_ok(r.head_last * hd, s.n_heads * hd) ||
      (ffn_columns &&
       (!column_ok(r.ffn_first, s.ffn_size) || !column_ok(r.ffn_last, s.ffn_size)))) {
    return make_error(
        errc::unsupported,
        "model {}: rank on node {:016x}: column split (attn_output [{}, {}), ffn_down "
        "[{}, {})) is not a multiple of the quantization block {}",
        s.name, r.node, r.head_first * hd, r.head_last * hd, r.ffn_first, r.ffn_last,
        s.column_block);
  }
  std::vector<tensor_slice> out;
  // A range covering the whole axis is emitted as `whole` so a loader maps it in one piece.
  auto add = [&](std::string name, slice_axis axis, std::uint64_t first, std::uint64_t last,
                 std::uint64_t full) {
    if (first == 0 && last == full) {
      out.push_back({std::move(name), slice_axis::whole, 0, full});
    } else {
      out.push_back({std::move(name), axis, first, last});
    }
  };
  if (r.first_stage) {
    add("token_embd.weight", slice_axis::rows, r.vocab_first, r.vocab_last, s.n_vocab);
  }
  for (std::uint32_t l = r.layer_first; l < r.layer_last; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    add(b + "attn_norm.weight", slice_axis::whole, 0, s.dim, s.dim);
    add(b + "attn_q.weight", slice_axis::rows, r.head_first * hd, r.head_last * hd, s.n_heads * hd);
    add(b + "attn_k.weight", slice_axis::rows, r.kv_head_first * hd, r.kv_head_last * hd,
        s.n_kv_heads * hd);
    add(b + "attn_v.weight", slice_axis::rows, r.kv_head_first * hd, r.kv_head_last * hd,
        s.n_kv_heads * hd);
    add(b + "attn_output.weight", slice_axis::columns, r.head_first * hd, r.head_last * hd,
        s.n_heads * hd);
    add(b + "ffn_norm.weight", slice_axis::whole, 0, s.dim, s.dim);
    if (s.n_experts > 0) {
      // Expert parallelism: the router whole, the rank's experts' rows of the stacked tensors.
      const std::uint64_t width = s.ffn_size / s.n_experts;
      add(b + "ffn_gate_inp.weight", slice_axis::whole, 0, s.n_experts, s.n_experts);
      add(b + "ffn_gate_exps.weight", slice_axis::rows, r.ffn_first, r.ffn_last, s.ffn_size);
      add(b + "ffn_up_exps.weight", slice_axis::rows, r.ffn_first, r.ffn_last, s.ffn_size);
      add(b + "ffn_down_exps.weight", slice_axis::rows, r.ffn_first / width * s.dim,
          r.ffn_last / width * s.dim, std::uint64_t{s.n_experts} * s.dim);
    } else {
      add(b + "ffn_gate.weight", slice_axis::rows, r.ffn_first, r.ffn_last, s.ffn_size);
      add(b + "ffn_up.weight", slice_axis::rows, r.ffn_first, r.ffn_last, s.ffn_size);
      add(b + "ffn_down.weight", slice_axis::columns, r.ffn_first, r.ffn_last, s.ffn_size);
    }
  }
  if (r.last_stage) {
    add("output_norm.weight", slice_axis::whole, 0, s.dim, s.dim);
    if (!s.tied_embeddings) {
      add("output.weight", slice_axis::rows, r.vocab_first, r.vocab_last, s.n_vocab);
    } else if (!r.first_stage) {  // a first stage already holds these token_embd rows
      add("token_embd.weight", slice_axis::rows, r.vocab_first, r.vocab_last, s.n_vocab);
    }
  }
  return out;
}

}  // namespace tessera::mesh::placement
