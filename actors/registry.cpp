#include "actors/registry.hpp"

#include <algorithm>

#include <iterator>

namespace tessera::actors {

result<void> registry::add(std::string_view name, const actor_ref& ref, bool replace) {
  if (name.empty()) return error{errc::invalid_argument, "actor name is empty"};
  if (!ref.valid()) return make_error(errc::invalid_argument, "name '{}': invalid actor_ref", name);
  std::lock_guard lock(mutex_);
  auto it = names_.find(std::string(name));
  if (it != names_.end()) {
    if (!replace && !(it->second == ref)) {
      return make_error(errc::invalid_argument, "name '{}' is already bound to {}", name,
                        it->second);
    }
    it->second = ref;
    return ok();
  }
  if (names_.size() >= capacity_) {
    return make_error(errc::overloaded, "name '{}': registry full ({} names)", name, capacity_);
  }
  names_.emplace(std::string(name), ref);
  return ok();
}

result<actor_ref> registry::lookup(std::string_view name) const {
  std::lock_guard lock(mutex_);
  auto it = names_.find(std::string(name));
  if (it == names_.end()) return make_error(errc::not_found, "no actor named '{}'", name);
  return it->second;
}

std::vector<std::pair<std::string, actor_ref>> registry::entries() const {
  std::vector<std::pair<std::string, actor_ref>> out;
  {
    std::lock_guard lock(mutex_);
    out.assign(names_.begin(), names_.end());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

bool registry::remove(std::string_view name) {
  std::lock_guard lock(mutex_);
  return names_.erase(std::string(name)) > 0;
}

void registry::remove_actor(actor_id id) {
  std::lock_guard lock(mutex_);
  for (auto it = names_.begin(); it != names_.end();) {
    it = it->second.id() == id ? names_.erase(it) : std::next(it);
  }
}

std::size_t registry::size() const {
  std::lock_guard lock(mutex_);
  return names_.size();
}

}  // namespace tessera::actors
