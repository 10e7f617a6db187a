// A simulated client of the pub-sub protocol: publishes its requests to every peer at scheduled
// times and follows each stream with serving::stream_follower — the same state machine the C++
// client runs — so the simulator checks request routing and failover end to end: every request
// ends in exactly one outcome, every index arrives once, and the tokens equal the single-peer
// reference (sim_reference).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mesh/serving/follower.hpp"
#include "mesh/sim/mesh_node.hpp"
#include "mesh/sim/world.hpp"

namespace tessera::mesh::sim {

/// A request and when to publish it (the client's local time).
struct scheduled_request {
  std::uint64_t at_ms = 0;
  serving::request req;
};

/// What the client saw of one request.
struct request_record {
  serving::request req;
  std::uint64_t issued_ms = 0;  ///< local time of the client
  std::uint64_t ended_ms = 0;
  std::vector<std::uint32_t> indices;  ///< the indices handed to the caller, in order
  std::vector<std::int32_t> tokens;    ///< their token ids
  std::vector<std::uint64_t> token_ms;   ///< when each arrived (the client's local time)
  std::vector<std::string> token_nodes;  ///< the peer that sent each
  std::optional<result<serving::outcome>> outcome;
  std::uint32_t outcomes = 0;  ///< how many times an outcome was reported (must be 1)
  std::uint32_t publications = 0;
};

class client_node : public sim_node {
 public:
  /// `peers`: every peer to publish to; `schedule` sorted by time.
  client_node(std::vector<member_id> peers, std::vector<scheduled_request> schedule,
              serving::follower_options options);

  void on_start(node_context& ctx) override;
  void on_message(node_context& ctx, const envelope& msg) override;
  void on_timer(node_context& ctx) override;

  [[nodiscard]] const std::map<std::string, request_record>& records() const { return records_; }
  /// Responses that failed to decode (must stay 0).
  [[nodiscard]] std::uint64_t undecodable() const { return undecodable_; }
  /// Every scheduled request has been published and has its outcome.
  [[nodiscard]] bool all_done() const;

 private:
  void apply(node_context& ctx, const std::string& id, serving::follower_step step);
  void publish(node_context& ctx, const serving::request& r);
  void rearm(node_context& ctx);

  std::vector<member_id> peers_;
  std::vector<scheduled_request> schedule_;
  std::size_t next_ = 0;  // the next request of schedule_ to publish
  serving::follower_options options_;
  std::map<std::string, serving::stream_follower> followers_;  // running
  std::map<std::string, request_record> records_;
  std::uint64_t undecodable_ = 0;
};

/// A world with mesh nodes 1..n built from `options` (serving and serve_requests on) and one
/// client node after them per schedule (ids n+1, n+2, ...), each publishing to nodes 1..n.
/// Nothing is started.
[[nodiscard]] std::unique_ptr<world> make_request_world(
    std::uint64_t seed, std::size_t n, const mesh_node_options& options,
    std::vector<std::vector<scheduled_request>> schedules, serving::follower_options follower);

}  // namespace tessera::mesh::sim
