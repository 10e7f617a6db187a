#include "mesh/serving/intake.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace tessera::mesh::serving {

namespace {

intake_decision reject_if_responder(bool responder, std::string_view code, std::string message) {
  if (!responder) return {};
  return {intake_action::reject, std::string(code), std::move(message)};
}

std::string served_models(const placement::plan& p) {
  std::string out;
  for (const auto& m : p.models) {
    if (!out.empty()) out += ", ";
    out += m.spec.name;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

bool cancel_applies(const request& cancel, std::string_view self_hex,
                    std::optional<std::uint32_t> running_attempt) noexcept {
  if (!cancel.node.empty() && cancel.node != self_hex) return false;  // another peer's copy
  return running_attempt.has_value() && *running_attempt <= cancel.attempt;
}

member_id responder_for(std::string_view request_id, std::span<const member_id> live) noexcept {
  const std::uint64_t h = fnv1a64(request_id);
  member_id best = no_member;
  std::uint64_t best_score = 0;
  for (member_id m : live) {
    const std::uint64_t s = mix64(h ^ mix64(m));
    if (best == no_member || s > best_score || (s == best_score && m < best)) {
      best = m;
      best_score = s;
    }
  }
  return best;
}

intake_decision decide(const request& r, const placement::plan* plan,
                       std::span<const member_id> live, member_id self,
                       std::span<const std::string> local_models,
                       std::span<const std::string> fetching) {
  const bool responder = responder_for(r.id, live) == self;
  if (auto v = validate(r); !v) {
    // A request without a usable id cannot be answered (there is no topic to answer on).
    if (!valid_id(r.id)) return {};
    return reject_if_responder(responder, error_code::invalid_request, v.error().message);
  }
  if (plan == nullptr) return {};
  // Groups with a member this peer no longer counts as live take nothing: the request goes where
  // the plan without that group will send it, at once — before the leader re-plans, and when no
  // leader can (a minority, a lone survivor: availability wins; a client cancels a duplicate).
  const auto model =
      std::find_if(plan->models.begin(), plan->models.end(),
                   [&](const placement::model_plan& m) { return m.spec.name == r.model; });
  // No group until links to a joining peer are measured: no answer, so the client re-publishes
  // and meets the next plan (a refusal now would fail a request as the capacity returns).
  if (model != plan->models.end() && model->groups.empty() && model->links_pending) return {};
  std::vector<std::uint32_t> weights;
  if (model != plan->models.end()) {
    bool any_down = false;
    for (const auto& grp : model->groups) {
      const bool up = std::all_of(grp.ranks.begin(), grp.ranks.end(), [&](const auto& rank) {
        return std::find(live.begin(), live.end(), rank.node) != live.end();
      });
      weights.push_back(up ? 1 : 0);
      any_down |= !up;
    }
    if (!any_down) weights.clear();
  }
  // Requests that name one affinity key go to one group (the n choices of one API request: one
  // prompt, read once, one batch).
  auto g =
      placement::route_request(*plan, r.model, r.affinity.empty() ? r.id : r.affinity, weights);
  if (!g) {
    if (g.error().code == errc::not_found)
      return reject_if_responder(
          responder, error_code::unknown_model,
          fmt::format("model '{}' is not served by this cluster (served: {})", r.model,
                      served_models(*plan)));
    if (g.error().code == errc::no_capacity)
      return reject_if_responder(responder, error_code::no_capacity, g.error().message);
    return reject_if_responder(responder, error_code::internal, g.error().message);
  }
  const auto& group = model->groups[*g];  // routed: the model is in the plan
  if (group.ranks.empty() || group.ranks.front().node != self) return {};
  if (std::find(local_models.begin(), local_models.end(), r.model) == local_models.end()) {
    if (std::find(fetching.begin(), fetching.end(), r.model) != fetching.end()) return {};
    return {intake_action::reject, std::string(error_code::no_capacity),
            fmt::format("model '{}': the plan assigns it to peer {:016x}, which has not loaded it",
                        r.model, self)};
  }
  // A group split over several peers is accepted here too; the engine checks it has formed.
  return {intake_action::accept, {}, {}, *g};
}

}  // namespace tessera::mesh::serving
