// The node's status document (docs/design/011-node-runtime.md): written by the control actor
// (the snapshot the HTTP gateway serves, and answers to status requests).
#include "mesh/runtime/node_impl.hpp"

namespace tessera::mesh::runtime {

nlohmann::json node_runtime::impl::status_snapshot() const {
  std::lock_guard lock(snapshot_mu);
  if (snapshot.empty()) return nullptr;
  return nlohmann::json::parse(snapshot, nullptr, false);
}

json node_runtime::impl::control_json() const {
  const auto st = control->stats();
  json rejected = json::object();
  for (std::size_t r = 1; r < transport::control::kRejectReasonCount; ++r)
    rejected[std::string(transport::control::to_string(
        static_cast<transport::control::reject_reason>(r)))] = st.rejected[r];
  return {{"frames_received", st.frames_received},
          {"frames_sent", st.frames_sent},
          {"rejected", rejected},
          {"handshakes_refused", st.zap_denied + st.handshake_failed_inbound}};
}

json node_runtime::impl::faults_json() const {
  const auto st = control->stats();
  json f = {{"commands_applied", st.fault_commands},
            {"commands_refused", st.fault_commands_refused},
            {"frames_dropped", st.fault_dropped},
            {"frames_delayed", st.fault_delayed},
            {"frames_duplicated", st.fault_duplicated}};
  json cuts = json::array();
  json rules = json::array();
  json clocks = json::array();
  injector->update([&](const transport::faults::fault_policy& pol) {
    for (const auto& [node, c] : pol.clocks())
      clocks.push_back({{"node", node}, {"rate", c.rate}, {"bump_ms", c.bump_ns / 1'000'000}});
    for (const auto& [from, to] : pol.cuts())
      cuts.push_back({{"from", from}, {"to", to}});
    for (const auto& [pair, r] : pol.rules())
      rules.push_back({{"from", pair.first},
                       {"to", pair.second},
                       {"drop", r.drop},
                       {"delay_ms", static_cast<double>(r.delay.count()) / 1e6},
                       {"jitter_ms", static_cast<double>(r.jitter.count()) / 1e6},
                       {"duplicate", r.duplicate},
                       {"reorder", r.reorder}});
  });
  f["partitions"] = cuts;
  f["rules"] = rules;
  f["clocks"] = clocks;
  {
    std::lock_guard g(clock_mu);
    const auto real = real_ms();
    f["clock"] = {{"rate", pclock.rate()}, {"offset_ms", pclock.offset_ms(real)}};
  }
  return f;
}

json node_runtime::impl::status_json() const {
  json j;
  j["format"] = 1;
  j["node"] = {{"id", hex},
               {"endpoint", endpoint},
               {"advertise", {{"address", advertise.address}, {"source", advertise.source}}},
               {"started_unix_ms", instance.started_unix_ms},
               {"instance_nonce", fmt::format("{:016x}", instance.nonce)},
               {"pid", caps.pid},
               {"hostname", caps.hostname},
               {"host_id", caps.host_id},
               {"link_dead_after_ms", link_dead_after_ms}};
  {
    const auto& cfg = opt.config;
    j["node"]["client_endpoints"] = {
        {"address", cfg.listen.client_address},
        {"auth", cfg.client_auth},
        {"reachable_from_other_hosts", !is_loopback_address(cfg.listen.client_address)}};
    json warnings = json::array();
    if (auto w = insecure_clients_warning(cfg)) warnings.push_back(*w);
    if (auto w = descriptor_warning(descriptor_limit)) warnings.push_back(*w);
    j["node"]["warnings"] = warnings;
    j["node"]["descriptors"] = {{"limit", static_cast<std::uint64_t>(descriptor_limit)},
                                {"open", open_descriptors()}};
  }
  j["faults"] = faults_json();
  j["control"] = control_json();
  core->status_into(j, endpoint);
  j["serving"] = engine ? engine->status() : json(nullptr);
  auto& st = j["stats"];
  st["undecodable"] = core->counters().undecodable + undecodable;
  st["dropped_events"] = dropped_events.load();
  st["hints_dropped"] = directory->hints_dropped();
  feed->status_into(st);
  json threads = json::object();
  std::size_t total = 0;
  for (const auto& [role, n] : thread_roles()) {
    threads[role] = n;
    total += n;
  }
  j["threads"] = {{"total", total}, {"by_role", threads}};
  json actor_list = json::array();
  for (const auto& a : actors->named_actors()) {
    json one = {{"name", a.name}, {"queued", a.queued}, {"handled", a.handled}};
    if (a.name == "control") one["restarts"] = control_restarts.load();
    actor_list.push_back(std::move(one));
  }
  j["actors"] = actor_list;
  return j;
}

}  // namespace tessera::mesh::runtime
