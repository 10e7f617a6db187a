// Link probes over real bulk links (transport/bulk): for a pair of members, the one with the
// smaller member id opens a link with the backend choose_backend() picked (connect parameters
// exchanged over the control plane: bulk.offer / bulk.answer), then measures what tensor
// parallelism pays on it: the small-message round trip (kPings sends the peer echoes; the median)
// and the streaming bandwidth (bursts of kBurstBytes in kBurstWrites one-sided writes into a buffer
// the peer registered, each timed until the peer confirms the last byte landed; one untimed burst
// first, so that neither side's first touch of its buffer is counted; the best of kTimedBursts).
// Each side runs on a worker thread of its own (link set-up and waiting block); the loop thread
// only routes offers/answers and reads results.
//
// Bounds: one probe this node initiates at a time, kMaxResponders answered at a time (offers
// beyond are ignored: the initiator times out); every wait is bounded (kProbeTimeout); stop()
// makes every worker give up within ~100 ms plus a link set-up already in progress.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <msgpack.hpp>

#include "mesh/membership/ids.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::mesh::runtime {

inline constexpr std::uint64_t kBurstBytes = 16u << 20;
inline constexpr std::uint32_t kBurstWrites = 4;
// Kept small: every link is probed as peers come up, while models load, and on a 2-core machine
// under the sanitizers a heavier probe (64 pings, 3 timed bursts) starved a node's loop long
// enough for a peer to suspect it (the dashboard browser test saw an amber circle).
inline constexpr std::uint32_t kTimedBursts = 2;  // after one untimed
inline constexpr std::uint32_t kPings = 16;       // small-message round trips
inline constexpr std::size_t kMaxResponders = 2;
inline constexpr std::chrono::milliseconds kProbeTimeout{5000};

/// bulk.offer (initiator -> peer) and bulk.answer (peer -> initiator).
struct bulk_setup_message {
  std::uint64_t probe_id = 0;
  std::uint8_t backend = 0;
  std::vector<std::uint8_t> params;  ///< transport::bulk::encode(connect_params)
  MSGPACK_DEFINE_MAP(probe_id, backend, params);
};

struct bandwidth_result {
  member_id peer = no_member;
  std::uint8_t backend = 0;
  double mbps = 0;    ///< MB/s (10^6 bytes per second); 0 when the probe failed
  double rtt_us = 0;  ///< the median small-message round trip over the link
  std::string error;
};

class bandwidth_prober {
 public:
  /// `send(peer, type, body)` ships a control message to the control-plane peer id `peer`
  /// (thread-safe: called from workers).
  using sender =
      std::function<void(const std::string& peer, std::uint16_t type, const std::string& body)>;
  bandwidth_prober(transport::bulk::link_addresses addresses, sender send, std::uint16_t offer_type,
                   std::uint16_t answer_type);
  ~bandwidth_prober();

  /// Starts a probe to `peer` over `backend` unless one is in flight. True if started.
  bool start(member_id peer, const std::string& peer_hex, transport::bulk::backend_kind backend);
  /// Routes a bulk.offer from `peer` (answers it on a worker) / a bulk.answer to our probe.
  void on_offer(member_id peer, const std::string& peer_hex, const bulk_setup_message& m);
  void on_answer(member_id peer, const bulk_setup_message& m);
  /// Finished probes since the last call.
  [[nodiscard]] std::vector<bandwidth_result> take_results();
  [[nodiscard]] bool busy() const;
  /// Makes every worker give up and joins them.
  void stop();

 private:
  void initiate(member_id peer, std::string hex, transport::bulk::backend_kind backend,
                std::uint64_t id);
  void respond(member_id peer, std::string hex, bulk_setup_message offer);
  void finish(bandwidth_result r);
  void reap();

  transport::bulk::link_addresses addresses_;
  sender send_;
  std::uint16_t offer_type_;
  std::uint16_t answer_type_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t next_id_ = 1;
  bool initiating_ = false;
  std::uint64_t current_id_ = 0;
  std::optional<bulk_setup_message> answer_;
  std::size_t responders_ = 0;
  std::vector<bandwidth_result> results_;
  struct worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<worker> workers_;
};

}  // namespace tessera::mesh::runtime
