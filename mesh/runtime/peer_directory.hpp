// Where the node's peers listen and which control links it keeps to them: members by the address
// they said (or were said) to have, seed placeholders for peers whose node id is not known yet,
// and the rules that keep one link per peer (a peer's ROUTER takes one connection per routing id,
// ours, so two links to one peer would take it from each other). Used on the control actor's
// turns only: no lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "mesh/discovery/peer_hint.hpp"
#include "mesh/runtime/messages.hpp"
#include "mesh/runtime/runtime.hpp"  // kMaxKnownPeers
#include "transport/control/control_node.hpp"

namespace tessera::mesh::runtime {

class peer_directory {
 public:
  struct peer {
    std::string hex;       ///< its node id
    std::string endpoint;  ///< its control endpoint, tcp://host:port
  };
  /// Someone to join through membership: its member id and "hex@endpoint".
  using join = std::pair<member_id, std::string>;

  peer_directory(transport::control::control_node& control, std::string self_hex, member_id self,
                 std::string self_endpoint);

  [[nodiscard]] const peer* find(member_id id) const;
  [[nodiscard]] const std::map<member_id, peer>& known() const { return known_; }
  /// Whether we hold a link to `hex` that we (or the peer, introducing itself) set up.
  [[nodiscard]] bool linked(const std::string& hex) const { return added_.contains(hex); }
  /// The endpoint of the control plane's link to `id` (empty: none).
  [[nodiscard]] std::string link_endpoint(const std::string& id) const;

  /// Learns where member `id` listens. `first_hand`: the member itself said so in a message
  /// that came over its own authenticated link, which may move our link to it (a peer restarted
  /// on another port or address). Second-hand addresses (gossip, membership events) only fill in
  /// peers we have no address for: a stale or forged rumour must not re-point a working link.
  void learn(member_id id, const std::string& address, bool first_hand);

  /// A control-plane event: a status client's or stale seed's link down is forgotten; a peer
  /// that introduced itself is learnt (its seed placeholder dropped) and, when `is_member` says
  /// membership does not know it yet, returned to be joined.
  [[nodiscard]] std::optional<join> on_peer(const transport::control::peer_event& ev,
                                            const std::function<bool(member_id)>& is_member);

  /// A discovery hint: a peer with its node id is linked and returned to be joined (unless the
  /// table is full: dropped, counted); a seed gets a placeholder link until it introduces itself.
  [[nodiscard]] std::optional<join> on_hint(const peer_hint& h);

  /// Sends to member `to`; false when its address is not known yet (the protocols treat it as
  /// loss) or the control plane refused.
  bool send(member_id to, std::uint16_t type, const std::string& body);

  [[nodiscard]] std::uint64_t hints_dropped() const { return hints_dropped_; }

 private:
  /// Makes sure a control link to `peer_hex` exists; `move` re-points an existing one at `ep`.
  void ensure_link(const std::string& peer_hex, const std::string& ep, bool move);
  /// Drops the seed placeholders that reach the listener at `ep`.
  void drop_seeds_at(const std::string& ep);

  transport::control::control_node& control_;
  std::string hex_;
  member_id self_;
  std::string endpoint_;
  std::map<member_id, peer> known_;           // bounded by kMaxKnownPeers (hints) + members
  std::set<std::string> added_;               // control peers we added (hex ids)
  std::map<std::string, std::string> seeds_;  // placeholder id -> endpoint (node id not known yet)
  std::uint64_t hints_dropped_ = 0;
};

}  // namespace tessera::mesh::runtime
