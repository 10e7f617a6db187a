#include "mesh/runtime/cluster_docs.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

namespace tessera::mesh::runtime {

nlohmann::json cluster_docs::read(const nlohmann::json& self_doc,
                                  const std::string& self_hex) const {
  nlohmann::json out = nlohmann::json::object();
  const auto asked_at = now_ms_();
  const bool was_wanted = asked_at < wanted_until_.load();
  wanted_until_ = asked_at + kWantMs;
  if (!self_doc.is_object()) return out;
  out[self_hex] = self_doc;
  if (!self_doc.contains("view") || !self_doc["view"].is_object()) return out;
  std::vector<std::string> ids;
  for (const auto& m : self_doc["view"]["members"]) {
    const std::string id = m.value("id", "");
    if (id != self_hex && m.value("status", "") == "alive") ids.push_back(id);
  }
  std::unique_lock lock(mu_);
  const auto fresh = [&] {
    const auto now = now_ms_();
    return std::all_of(ids.begin(), ids.end(), [&](const std::string& id) {
      auto it = docs_.find(id);
      return it != docs_.end() && now - it->second.second <= kStaleMs;
    });
  };
  if (!was_wanted) answered_.wait_for(lock, std::chrono::milliseconds(kFirstReadWaitMs), fresh);
  const auto now = now_ms_();
  for (const auto& id : ids) {
    auto it = docs_.find(id);
    out[id] = it == docs_.end() || now - it->second.second > kStaleMs
                  ? nlohmann::json(nullptr)
                  : nlohmann::json::parse(it->second.first, nullptr, false);
  }
  return out;
}

bool cluster_docs::ask_due() {
  const auto now = now_ms_();
  if (now >= wanted_until_.load() || now < next_ask_) return false;
  next_ask_ = now + kAskMs;
  return true;
}

void cluster_docs::on_answer(const std::string& hex, std::string doc) {
  const auto at = now_ms_();
  std::lock_guard lock(mu_);
  // Bounded by the members that answered within kForgetMs (the answers of gone ones age out).
  std::erase_if(docs_, [&](const auto& e) { return at - e.second.second > kForgetMs; });
  docs_[hex] = {std::move(doc), at};
  answered_.notify_all();
}

}  // namespace tessera::mesh::runtime
