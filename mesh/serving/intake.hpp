// Intake: which peer takes a request, and who answers when nobody can. Pure logic (plan, view and
// request in; a decision out), so every peer decides alike and the simulator can run it.
//
// Every peer sees every request. The group that placement::route_request picks for (model, id)
// takes it: its first rank (stage 0, tensor rank 0) accepts and streams. A group with a member
// the deciding peer does not count as live is left out of that choice (the one rule for serving
// without a leader: a peer that holds a model's weights serves it whatever became of the others;
// peers whose views differ may both accept an attempt, and the client cancels the later one). A
// request nobody can take (malformed, unknown model, no capacity) is answered by exactly one peer —
// the responder, picked by rendezvous hashing of the id over the live members — so the client gets
// one error, not N.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mesh/membership/ids.hpp"
#include "mesh/placement/placement.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::serving {

enum class intake_action : std::uint8_t {
  ignore,  ///< another peer takes it (or answers it)
  accept,  ///< this peer serves it
  reject,  ///< this peer answers with the error in code/message
};

struct intake_decision {
  intake_action action = intake_action::ignore;
  std::string code;       ///< reject: an error_code
  std::string message;    ///< reject: the reason, naming the model / field
  std::size_t group = 0;  ///< accept: the index of the group in the model's plan
};

/// The live member that answers requests nobody takes: highest rendezvous score of (id, member).
/// no_member when `live` is empty.
[[nodiscard]] member_id responder_for(std::string_view request_id,
                                      std::span<const member_id> live) noexcept;

/// Decides what `self` does with `r`. `plan` may be null (no plan yet: everyone ignores, the
/// client re-publishes until one exists). `local_models`: the models `self` has loaded;
/// `fetching`: models whose bytes `self` is still fetching from peers (routed here, it stays
/// silent and the client re-publishes, instead of refusing).
[[nodiscard]] intake_decision decide(const request& r, const placement::plan* plan,
                                     std::span<const member_id> live, member_id self,
                                     std::span<const std::string> local_models,
                                     std::span<const std::string> fetching = {});

/// Whether a cancel ends the stream this peer (`self_hex`) runs for its id, at
/// `running_attempt` (nullopt: none runs here). A cancel naming a node (`node`: the client cuts a
/// duplicate acceptance) is for that peer's copy only; one for an earlier attempt than the running
/// one is stale. The engine and the simulator's modelled engine both ask this.
[[nodiscard]] bool cancel_applies(const request& cancel, std::string_view self_hex,
                                  std::optional<std::uint32_t> running_attempt) noexcept;

/// The node ids a peer's peer list names (`nodes`, docs/PROTOCOL.md): none while it has no plan
/// (it serves nothing, so it vouches for nobody), else its own, then each live member's whose id it
/// knows (`hex_of(id)` returns "" for one it does not). A client whose serving peer is missing from
/// such a list resumes once that peer is silent. `live` is the engine's list (self first).
template <class HexOf>
[[nodiscard]] std::vector<std::string> peer_list_nodes(bool has_plan, member_id self,
                                                       std::string_view self_hex,
                                                       std::span<const member_id> live,
                                                       HexOf&& hex_of) {
  std::vector<std::string> nodes;
  if (!has_plan) return nodes;
  nodes.emplace_back(self_hex);
  for (member_id id : live) {
    if (id == self) continue;
    std::string hex = hex_of(id);
    if (!hex.empty()) nodes.push_back(std::move(hex));
  }
  return nodes;
}

}  // namespace tessera::mesh::serving
