// Fair share of one peer's streams among its clients (issue 32: one client must not make a peer
// answer `overloaded` to the others, nor keep them waiting behind its long streams). Pure: counts
// in, a choice out, so that the rules are tested alone and the engine only applies them.
//
// A client is what the peer can tell apart without trusting the client's word: the connection a
// request arrived on (docs/design/014-threat-model.md). Its streams are *running* (holding a slot
// and a KV cache) or *waiting* (accepted, queued). Three rules, max-min fairness by counts:
//   1. A newcomer at the peer's bound takes the place of the newest waiting stream of the client
//      holding the most, if that client holds at least two more than the newcomer's (the client
//      that made way hears `overloaded`, as the newcomer would have).
//   2. A free slot goes to the waiting stream whose client runs the fewest; queue order among
//      equals (resumed streams are queued first).
//   3. With every slot taken, a client that runs at least two more than a waiting client makes
//      way: one of its streams that has run for a quantum goes back to the queue, its tokens so far
//      kept (it re-reads them when it runs again; its client sees only a pause, with keepalives).
// "At least two more" is what makes the rules converge instead of trading one slot back and forth.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tessera::mesh::serving {

/// One client's streams on this peer.
struct client_streams {
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  [[nodiscard]] std::uint32_t total() const noexcept { return running + waiting; }
};

/// Per client (by identity); clients with no stream are absent or zero alike.
using client_counts = std::map<std::string, client_streams, std::less<>>;

/// Rule 1: the client whose newest waiting stream makes way for a newcomer from `newcomer`
/// arriving at the peer's bound, or nullopt (the newcomer's client already holds its share: it is
/// refused). Among clients holding equally many, the first by identity (deterministic).
[[nodiscard]] std::optional<std::string> makes_way_for(const client_counts& counts,
                                                       std::string_view newcomer);

/// A queued stream as rule 2 sees it.
struct waiting_stream {
  std::string_view client;
  bool can_start = false;  ///< it may take a slot now (its weights are in; the headroom allows it)
};

/// Rule 2: which of the queued streams (in queue order) starts next, or nullopt when none can.
[[nodiscard]] std::optional<std::size_t> next_to_start(std::span<const waiting_stream> waiting,
                                                       const client_counts& counts);

/// Rule 3: with every slot taken and a stream of `waiting_client` ready to start, the client one
/// of whose running streams goes back to the queue, or nullopt (no client runs two more).
[[nodiscard]] std::optional<std::string> preempted_for(const client_counts& counts,
                                                       std::string_view waiting_client);

}  // namespace tessera::mesh::serving
