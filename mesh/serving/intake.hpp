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

#include <span>
#include <string>
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

}  // namespace tessera::mesh::serving
