#include "mesh/runtime/peer_directory.hpp"

#include <algorithm>
#include <cctype>

#include <spdlog/spdlog.h>

#include "mesh/runtime/host.hpp"

namespace tessera::mesh::runtime {

namespace ctl = transport::control;

peer_directory::peer_directory(ctl::control_node& control, std::string self_hex, member_id self,
                               std::string self_endpoint)
    : control_(control),
      hex_(std::move(self_hex)),
      self_(self),
      endpoint_(std::move(self_endpoint)) {}

const peer_directory::peer* peer_directory::find(member_id id) const {
  auto it = known_.find(id);
  return it == known_.end() ? nullptr : &it->second;
}

std::string peer_directory::link_endpoint(const std::string& id) const {
  for (const auto& p : control_.peers())
    if (p.id == id) return p.endpoint;
  return {};
}

void peer_directory::drop_seeds_at(const std::string& ep) {
  for (auto s = seeds_.begin(); s != seeds_.end();) {
    if (same_listener(s->second, ep)) {
      (void)control_.remove_peer(s->first);
      s = seeds_.erase(s);
    } else {
      ++s;
    }
  }
}

void peer_directory::ensure_link(const std::string& peer_hex, const std::string& ep, bool move) {
  if (peer_hex == hex_ || ep.empty()) return;
  const bool moved = move && added_.contains(peer_hex) && link_endpoint(peer_hex) != ep;
  if (added_.contains(peer_hex) && !moved) return;
  // A seed placeholder pointing at the same endpoint must go first: the peer's ROUTER accepts
  // only one connection per routing id (ours).
  drop_seeds_at(ep);
  // The control plane may already hold it (the peer introduced itself): re-adding would
  // replace a working connection.
  if (!moved && link_endpoint(peer_hex) == ep) {
    added_.insert(peer_hex);
    return;
  }
  if (moved)
    spdlog::info("node {}: peer {} now at {} (was {})", hex_, peer_hex, ep,
                 link_endpoint(peer_hex));
  if (auto r = control_.add_peer(peer_hex, ep); r) {
    added_.insert(peer_hex);
  } else {
    spdlog::warn("node {}: cannot add peer {} at {}: {}", hex_, peer_hex, ep, r.error().describe());
  }
}

void peer_directory::learn(member_id id, const std::string& address, bool first_hand) {
  if (id == self_ || id == no_member) return;
  auto parsed = split_address(address);
  if (!parsed || member_of(parsed->first) != id) return;
  auto it = known_.find(id);
  const bool differs = it != known_.end() && it->second.endpoint != parsed->second;
  if (differs && !first_hand) return;
  known_[id] = peer{parsed->first, parsed->second};
  ensure_link(parsed->first, parsed->second, first_hand);
}

std::optional<peer_directory::join> peer_directory::on_peer(
    const ctl::peer_event& ev, const std::function<bool(member_id)>& is_member) {
  if (!is_node_id_text(ev.peer)) {
    // A status client (or a seed placeholder) whose link went down: forget it.
    if (ev.kind == ctl::peer_event_kind::down && !seeds_.contains(ev.peer))
      (void)control_.remove_peer(ev.peer);
    return std::nullopt;
  }
  if (ev.kind != ctl::peer_event_kind::up || ev.peer == hex_) return std::nullopt;
  // A peer introduced itself (we may have dialled it as a seed): learn its endpoint from the
  // control plane and join it through membership.
  const std::string ep = link_endpoint(ev.peer);
  if (ep.empty()) return std::nullopt;
  const member_id id = member_of(ev.peer);
  added_.insert(ev.peer);  // the control plane added it itself
  drop_seeds_at(ep);
  if (is_member(id)) return std::nullopt;
  known_[id] = peer{ev.peer, ep};
  return join{id, ev.peer + "@" + ep};
}

std::optional<peer_directory::join> peer_directory::on_hint(const peer_hint& h) {
  if (h.control.empty()) return std::nullopt;
  const std::string ep = "tcp://" + h.control.front().to_string();
  if (ep == endpoint_) return std::nullopt;
  if (!h.node_id.empty()) {
    if (h.node_id == hex_) return std::nullopt;
    const member_id id = member_of(h.node_id);
    if (id == no_member) return std::nullopt;
    // Hints are rumours (mDNS is unauthenticated): a flood of invented ids must not grow the
    // table without bound. Members we already know are always updated.
    if (!known_.contains(id) && known_.size() >= kMaxKnownPeers) {
      ++hints_dropped_;
      return std::nullopt;
    }
    // A rumour never re-points a peer we already reach (learn() has the rule).
    if (auto k = known_.find(id); k != known_.end() && k->second.endpoint != ep)
      return std::nullopt;
    known_[id] = peer{h.node_id, ep};
    ensure_link(h.node_id, ep, /*move=*/false);
    return join{id, h.node_id + "@" + ep};
  }
  // A seed: the node id is learnt when the peer introduces itself over the control plane.
  for (const auto& [id, k] : known_)
    if (same_listener(k.endpoint, ep)) return std::nullopt;
  std::string placeholder =
      "seed-" + h.control.front().host + "-" + std::to_string(h.control.front().port);
  std::replace_if(
      placeholder.begin(), placeholder.end(),
      [](char c) {
        return !(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_');
      },
      '_');
  if (seeds_.contains(placeholder)) return std::nullopt;
  if (auto r = control_.add_peer(placeholder, ep); r) {
    seeds_[placeholder] = ep;
  } else {
    spdlog::warn("node {}: seed {}: {}", hex_, ep, r.error().describe());
  }
  return std::nullopt;
}

bool peer_directory::send(member_id to, std::uint16_t type, const std::string& body) {
  auto it = known_.find(to);
  if (it == known_.end()) return false;  // not met yet: the protocols treat it as loss
  return control_.send(it->second.hex, type, bytes_of(body)).has_value();
}

}  // namespace tessera::mesh::runtime
