// The status protocol, client side: a control-plane node of its own under a `status-` id that
// asks nodes for their status documents (status.request, answered with status.reply over a link
// the node dials back). `tessera status`/`fault` ask one node and wait (query_status); the node's
// duplicate-identity check (identity_check.hpp) asks several at once from an actor and takes the
// answers as they come, on the client's I/O thread.
//
// Why a node of its own: a node's ROUTER takes one connection per routing id, so a process whose
// id another peer already uses (a cloned data directory) can only ask under another id.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/base/result.hpp"
#include "transport/control/cluster_key.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::mesh::runtime {

/// Bound on nodes one client asks (each is a control peer of the client, with its queue).
inline constexpr std::size_t kMaxStatusTargets = 64;

struct status_client_options {
  transport::control::cluster_keys keys;
  /// Where the client's ROUTER binds ("127.0.0.1", "0.0.0.0", ...); the node asked dials the
  /// reply to `reply_address` (an address of this host the asked node reaches) at the bound port.
  std::string bind_address = "127.0.0.1";
  std::string reply_address;  ///< empty: bind_address
  std::uint64_t id_seed = 0;  ///< the client's id is status_client_prefix + 16 hex digits of it
};

class status_client {
 public:
  /// `on_reply(target, document)` runs on the client's I/O thread for each status document that
  /// comes back (target as passed to ask()); it must not block.
  using reply_fn = std::function<void(const std::string& target, std::string document)>;

  [[nodiscard]] static result<std::unique_ptr<status_client>> start(status_client_options options,
                                                                    reply_fn on_reply);
  ~status_client();
  status_client(const status_client&) = delete;
  status_client& operator=(const status_client&) = delete;

  /// Asks the node at `target` ("host:port" or "tcp://host:port") for its status, after sending
  /// it `fault_commands` (fault.set bodies) over the same link. Errors: invalid_argument (the
  /// endpoint), no_capacity (kMaxStatusTargets asked already), closed (stopped).
  [[nodiscard]] result<void> ask(const std::string& target,
                                 const std::vector<std::string>& fault_commands = {});

  /// Handshakes our links failed (a node of another cluster refused our key).
  [[nodiscard]] std::uint64_t handshakes_refused() const;

  /// Stops the I/O thread (idempotent; the destructor calls it). No reply is delivered after.
  void stop();

 private:
  struct impl;
  explicit status_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// The local address the kernel would use to reach host:port (what a node asked dials back).
[[nodiscard]] result<std::string> local_address_towards(const std::string& host,
                                                        std::uint16_t port);

}  // namespace tessera::mesh::runtime
