// mdns_source: publishes this node as a _tessera._tcp DNS-SD service through avahi-daemon and
// browses for others (avahi-client over D-Bus, on avahi's threaded poll).
//
//   stopped --start()--> connecting --client RUNNING--> running (published + browsing)
//                          ^   |  avahi_client_new failed (no bus / no daemon):
//                          |   +-- retry after backoff (retry_min_ms doubling to retry_max_ms)
//                          +------ client FAILURE (daemon or bus restarted): free client, retry
//
// While avahi is absent the node keeps running on its other sources; mdns_source logs the first
// failure of each outage (warn) and retries quietly. Resolved services of another cluster are
// counted (foreign_cluster) and ignored; undecodable TXT records count as malformed.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "mesh/discovery/discovery_source.hpp"

struct AvahiThreadedPoll;
struct AvahiClient;
struct AvahiEntryGroup;
struct AvahiServiceBrowser;
struct AvahiTimeout;
struct AvahiAddress;
struct AvahiStringList;

namespace tessera::mesh {

struct mdns_options {
  std::string cluster_id;
  std::string node_id;  ///< ours, 32 hex digits
  std::uint16_t control_port = 0;
  std::uint32_t protocol_version = 1;
  /// DNS-SD instance name; empty: "tessera-" + the first 12 digits of the node id. On a name
  /// collision avahi's alternative name ("... #2") is used.
  std::string service_name;
  bool publish = true;
  bool browse = true;
  std::uint32_t retry_min_ms = 250;
  std::uint32_t retry_max_ms = 10000;
  /// Bound on concurrent resolves; services seen beyond it are dropped (counted) and picked up
  /// again when avahi announces them next.
  std::uint32_t max_pending_resolves = 64;
};

enum class mdns_state : std::uint8_t { stopped, connecting, running };
[[nodiscard]] const char* to_string(mdns_state s) noexcept;

class mdns_source final : public discovery_source {
 public:
  [[nodiscard]] static result<std::unique_ptr<mdns_source>> create(mdns_options options);
  ~mdns_source() override;

  const char* name() const noexcept override { return "mdns"; }
  /// Starts avahi's poll thread and tries to connect; never fails because avahi is absent.
  result<void> start(hint_sink sink) override;
  void stop() override;
  discovery_stats stats() const override;

  [[nodiscard]] mdns_state state() const noexcept { return state_.load(); }
  /// The service name in use (after collisions). Thread-safe copy.
  [[nodiscard]] std::string published_name() const;

 private:
  explicit mdns_source(mdns_options options);

  friend struct mdns_callbacks;  // avahi's C callbacks (mdns_source.cpp)

  // All below run on avahi's poll thread.
  void connect();
  void drop_client_and_retry(const char* why);
  void schedule_retry(std::uint32_t delay_ms);
  void publish(AvahiClient* c);
  void browse(AvahiClient* c);
  void on_resolved(const char* name, const AvahiAddress* address, std::uint16_t port,
                   AvahiStringList* txt);

  mdns_options options_;
  hint_sink sink_;
  AvahiThreadedPoll* poll_ = nullptr;
  AvahiClient* client_ = nullptr;
  AvahiEntryGroup* group_ = nullptr;
  AvahiServiceBrowser* browser_ = nullptr;
  AvahiTimeout* retry_timer_ = nullptr;
  std::uint32_t backoff_ms_ = 0;
  std::uint32_t pending_resolves_ = 0;
  bool outage_logged_ = false;
  std::string current_name_;  ///< guarded by the avahi poll lock
  std::atomic<mdns_state> state_{mdns_state::stopped};
  struct counters {
    std::atomic<std::uint64_t> hints{0}, foreign{0}, malformed{0}, self{0}, reconnects{0},
        dropped{0};
  } counters_;
};

}  // namespace tessera::mesh
