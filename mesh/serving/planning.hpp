// The leader's serving plan, computed from the published view. Pure: the same view and previous
// plan give the same plan on every peer that may lead, so a new leader reproduces the content of
// the plan in force (under its own term: see plan_from_view) and a leader change alone unloads
// nothing and drops nothing.
#pragma once

#include <cstdint>

#include "actors/base/result.hpp"
#include "mesh/placement/placement.hpp"
#include "mesh/topology/topology.hpp"

namespace tessera::mesh::serving {

/// Plans every model some live member of `v` holds. A model is planned over the members that hold
/// it and report the same spec (content included) as the holder with the lowest id, plus the
/// members that fetch models (capabilities::fetches_models) and hold no file of that name: they
/// receive their shard's bytes from holders (model_share). With `previous`, a plan whose content
/// does not change keeps its epoch if that epoch is of this term (or a later one); otherwise the
/// epoch is {term, previous.version + 1}: a new leader re-issues the plan in force once under its
/// own term, so that it replaces any later plan of the old leader a follower holds and this
/// leader never saw (found by the simulator's swizzle-clog).
[[nodiscard]] result<placement::plan> plan_from_view(const topology::view& v,
                                                     const placement::plan* previous,
                                                     std::uint64_t term,
                                                     const placement::planner_config& cfg = {});

/// How long a new leader waits for the capabilities of every live member before it plans without
/// the ones still missing (members report every second; one that cannot reach the leader must not
/// stop the cluster from serving).
inline constexpr std::uint64_t max_plan_wait_ms = 3000;

/// Whether a leader that has led for `leading_ms` may plan from `v`: every live member has
/// reported its capabilities, or it has waited max_plan_wait_ms. Planning earlier — at a cold
/// start, before any report — would issue a plan without the members' models, and peers would
/// answer requests "unknown_model" (found by the simulator); without a plan they stay silent and
/// clients re-publish.
[[nodiscard]] bool ready_to_plan(const topology::view& v, std::uint64_t leading_ms);

/// Whether a peer adopts a plan the leader sent: true for a newer epoch whose every group is valid
/// for its model; false for a stale one (or the one in force); an error naming the group for an
/// invalid one (refused, never trusted). Pure: the node runtime and the simulator both use it.
[[nodiscard]] result<bool> should_adopt(const placement::plan* current,
                                        const placement::plan& incoming);

}  // namespace tessera::mesh::serving
