// What a peer does with a request whose id it is serving or has served: the duplicate rules of
// docs/PROTOCOL.md ("Who answers"). Pure, so that the engine and the simulator's serving peers
// apply the same rules.
//
// Clients re-publish until they hear "accepted" and resume with a higher attempt after silence,
// and while the plan moves two peers may see the same publication; these rules make each attempt
// generate at most once per peer and give every re-publication of a finished attempt the same
// final message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::serving {

/// The final messages (done / error) of the last `capacity` requests a peer finished.
class finished_ledger {
 public:
  static constexpr std::size_t default_capacity = 4096;
  explicit finished_ledger(std::size_t capacity = default_capacity) : capacity_(capacity) {}

  /// Remembers (or replaces) `id`'s final message; beyond the capacity the oldest id is forgotten.
  void remember(const std::string& id, std::uint32_t attempt, response final_msg);
  struct entry {
    std::uint32_t attempt = 0;
    response final_msg;
  };
  [[nodiscard]] const entry* find(const std::string& id) const;
  [[nodiscard]] std::size_t size() const { return entries_.size(); }

 private:
  std::size_t capacity_;
  std::map<std::string, entry> entries_;
  std::deque<std::string> order_;  // first remembered first
};

enum class admission : std::uint8_t {
  fresh,               ///< not seen (or a newer attempt of a finished one): decide it
  running_duplicate,   ///< an attempt <= the running one: say "accepted" (of the running one)
  supersedes,          ///< a newer attempt of a running stream: end that stream, then decide
  finished_duplicate,  ///< the attempt that finished: send its final message again
  stale,               ///< an older attempt than the one that finished: ignore
};

/// `running_attempt`: the attempt of `q.id` this peer is serving now, if any.
[[nodiscard]] admission admit(const request& q, std::optional<std::uint32_t> running_attempt,
                              const finished_ledger& finished);

}  // namespace tessera::mesh::serving
