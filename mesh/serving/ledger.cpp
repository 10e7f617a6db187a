#include "mesh/serving/ledger.hpp"

namespace tessera::mesh::serving {

void finished_ledger::remember(const std::string& id, std::uint32_t attempt, response final_msg) {
  if (!entries_.contains(id)) {
    order_.push_back(id);
    if (order_.size() > capacity_) {
      entries_.erase(order_.front());
      order_.pop_front();
    }
  }
  entries_[id] = {attempt, std::move(final_msg)};
}

const finished_ledger::entry* finished_ledger::find(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

admission admit(const request& q, std::optional<std::uint32_t> running_attempt,
                const finished_ledger& finished) {
  // The running stream first: an attempt may have finished (an error) before a newer one began.
  if (running_attempt)
    return q.attempt <= *running_attempt ? admission::running_duplicate : admission::supersedes;
  if (const auto* f = finished.find(q.id); f != nullptr && q.attempt <= f->attempt)
    return q.attempt == f->attempt ? admission::finished_duplicate : admission::stale;
  return admission::fresh;
}

}  // namespace tessera::mesh::serving
