// beacon_source: periodic UDP beacons to a multicast group or a broadcast address, and a
// receiver for the same. For networks without mDNS.
//
//   thread: poll(socket, stop eventfd, timeout = next send)
//             -> readable: drain up to max_datagrams_per_wakeup, decode, filter, emit hints
//             -> timeout:  send one beacon
//
// Filters, in order (each counted in stats): malformed or other version -> malformed;
// key set and MAC absent/wrong -> unauthenticated; our own node id -> self; another cluster id ->
// foreign_cluster; otherwise a hint whose control endpoint is the announced host (or the
// datagram's source address) and control port.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "mesh/discovery/beacon_codec.hpp"
#include "mesh/discovery/discovery_source.hpp"

namespace tessera::mesh {

struct beacon_options {
  std::string cluster_id;
  std::string node_id;  ///< ours, 32 hex digits
  std::uint16_t control_port = 0;
  std::string advertise_host;  ///< empty: receivers use the datagram's source address
  std::uint32_t protocol_version = 1;
  std::string interface_name;             ///< multicast: join/send here; broadcast: SO_BINDTODEVICE
  std::string address = "239.255.74.74";  ///< IPv4 multicast group or broadcast address
  std::uint16_t port = 7479;
  std::uint32_t interval_ms = 1000;
  std::optional<beacon_key> key;  ///< set: send MACs and require them
  /// Bound on datagrams read per wakeup, so a flood cannot starve sending.
  std::uint32_t max_datagrams_per_wakeup = 64;
};

class beacon_source final : public discovery_source {
 public:
  /// Validates the options (node id, cluster id, address, port, interval); no socket yet.
  [[nodiscard]] static result<std::unique_ptr<beacon_source>> create(beacon_options options);
  ~beacon_source() override;

  const char* name() const noexcept override { return "beacon"; }
  /// Opens and binds the socket in the calling thread's network namespace, then starts the
  /// thread. Errors name the address, port or interface the kernel refused.
  result<void> start(hint_sink sink) override;
  void stop() override;
  discovery_stats stats() const override;

 private:
  explicit beacon_source(beacon_options options);
  result<void> open_socket();
  void run();
  void send_one();
  void receive_some();

  beacon_options options_;
  std::vector<std::uint8_t> datagram_;  ///< our encoded beacon (constant)
  hint_sink sink_;
  int fd_ = -1;
  int stop_fd_ = -1;
  std::uint32_t dest_addr_be_ = 0;
  std::thread thread_;
  struct counters {
    std::atomic<std::uint64_t> hints{0}, foreign{0}, malformed{0}, unauthenticated{0}, self{0},
        sent{0}, send_errors{0};
  } counters_;
};

}  // namespace tessera::mesh
