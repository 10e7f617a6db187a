#include "mesh/serving/fair_share.hpp"

namespace tessera::mesh::serving {

namespace {

client_streams of(const client_counts& counts, std::string_view client) {
  auto it = counts.find(client);
  return it == counts.end() ? client_streams{} : it->second;
}

}  // namespace

std::optional<std::string> makes_way_for(const client_counts& counts, std::string_view newcomer) {
  const std::uint32_t mine = of(counts, newcomer).total();
  const client_counts::value_type* most = nullptr;
  for (const auto& entry : counts) {
    // Only a waiting stream can make way: a running one is rule 3's (after its quantum).
    if (entry.second.waiting == 0 || entry.first == newcomer) continue;
    if (most == nullptr || entry.second.total() > most->second.total()) most = &entry;
  }
  if (most == nullptr || most->second.total() < mine + 2) return std::nullopt;
  return most->first;
}

std::optional<std::size_t> next_to_start(std::span<const waiting_stream> waiting,
                                         const client_counts& counts) {
  std::optional<std::size_t> best;
  std::uint32_t best_running = 0;
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    if (!waiting[i].can_start) continue;
    const std::uint32_t running = of(counts, waiting[i].client).running;
    if (!best || running < best_running) {
      best = i;
      best_running = running;
    }
  }
  return best;
}

std::optional<std::string> preempted_for(const client_counts& counts,
                                         std::string_view waiting_client) {
  const std::uint32_t mine = of(counts, waiting_client).running;
  const client_counts::value_type* most = nullptr;
  for (const auto& entry : counts)
    if (most == nullptr || entry.second.running > most->second.running) most = &entry;
  if (most == nullptr || most->first == waiting_client || most->second.running < mine + 2)
    return std::nullopt;
  return most->first;
}

}  // namespace tessera::mesh::serving
