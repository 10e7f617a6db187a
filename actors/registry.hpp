// registry: named actors of one node (register / lookup / unregister; automatic removal on stop).
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/actor_ref.hpp"
#include "actors/base/result.hpp"

namespace tessera::actors {

/// Name -> actor_ref. Thread-safe. Bounded by `capacity` names.
class registry {
 public:
  explicit registry(std::size_t capacity = 65536) : capacity_(capacity) {}

  /// Binds `name` to `ref`. Fails with errc::invalid_argument when the name is taken (unless
  /// `replace`, which supervisors use to re-bind a restarted child) or empty, errc::overloaded
  /// when the registry is full.
  [[nodiscard]] result<void> add(std::string_view name, const actor_ref& ref, bool replace = false);
  /// The actor bound to `name`, or errc::not_found.
  [[nodiscard]] result<actor_ref> lookup(std::string_view name) const;
  /// Removes `name`; false when it was not bound.
  bool remove(std::string_view name);
  /// Removes every name bound to `id` (called when that actor stops).
  void remove_actor(actor_id id);
  [[nodiscard]] std::size_t size() const;
  /// Every name with its actor, sorted by name (status pages).
  [[nodiscard]] std::vector<std::pair<std::string, actor_ref>> entries() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, actor_ref> names_;
  std::size_t capacity_;
};

}  // namespace tessera::actors
