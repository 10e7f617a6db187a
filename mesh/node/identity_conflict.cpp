#include "mesh/node/identity_conflict.hpp"

#include <tuple>

namespace tessera::mesh {

identity_verdict judge_identity(const node_instance& self, const node_instance& heard) {
  if (heard.id != self.id) return identity_verdict::unrelated;
  if (heard.nonce == self.nonce) return identity_verdict::own_echo;
  bool heard_is_later =
      std::tie(heard.started_unix_ms, heard.nonce) > std::tie(self.started_unix_ms, self.nonce);
  // A record at our own endpoint that is older than us can only be a previous run of this very
  // process' data dir (the flock rules out a concurrent one on this host).
  if (heard.control_endpoint == self.control_endpoint && !heard_is_later) {
    return identity_verdict::stale_self;
  }
  return heard_is_later ? identity_verdict::peer_must_yield : identity_verdict::we_must_refuse;
}

const char* to_string(identity_verdict v) noexcept {
  switch (v) {
    case identity_verdict::unrelated:
      return "unrelated";
    case identity_verdict::own_echo:
      return "own_echo";
    case identity_verdict::stale_self:
      return "stale_self";
    case identity_verdict::peer_must_yield:
      return "peer_must_yield";
    case identity_verdict::we_must_refuse:
      return "we_must_refuse";
  }
  return "unknown";
}

}  // namespace tessera::mesh
