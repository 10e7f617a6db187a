// advertise: the one address peers reach this node at.
//
// A node binds its sockets to `listen.address` (0.0.0.0 by default: every interface) but must tell
// peers one address to connect to. The control plane's heartbeats, the bulk links (tcp address,
// rdma GID), the bandwidth probe, model share and the client endpoints in the node's capabilities
// all advertise the same address, chosen once at start:
//
//   1. --advertise ADDRESS (a numeric IPv4 address, or a name resolved once, at start);
//   2. --listen ADDRESS when it is not the wildcard;
//   3. the source address of the kernel's route toward the first seed that routes (a seed on
//      loopback gives 127.0.0.1: all peers are on this host);
//   4. the address of --beacon-interface;
//   5. the source address of the default route;
//   6. the first non-loopback IPv4 address of an interface that is up;
//   7. 127.0.0.1, with a warning: only peers on this host can reach the node.
//
// Never a host name (it may not resolve on the peer) and never loopback while another interface is
// up. `tessera status` shows the address and the rule that chose it; the node logs both at start.
#pragma once

#include <string>
#include <vector>

#include "actors/base/result.hpp"

namespace tessera::mesh {

struct advertise_inputs {
  std::string advertise;           ///< --advertise (empty: choose)
  std::string listen_address;      ///< --listen ("0.0.0.0" = wildcard)
  std::vector<std::string> seeds;  ///< host:port
  std::string beacon_interface;    ///< --beacon-interface (empty: none)
};

struct advertised_address {
  std::string address;         ///< numeric IPv4
  std::string source;          ///< which rule chose it, e.g. "route to seed 10.0.0.2:7400 (eth0)"
  bool loopback_only = false;  ///< rule 7: peers on other hosts cannot reach this node
};

/// Chooses the advertised address (see the file comment). Fails only when --advertise names
/// something that is not an IPv4 address and does not resolve to one.
[[nodiscard]] result<advertised_address> choose_advertise_address(const advertise_inputs& in);

/// The source address the kernel would use to reach `host` (numeric or a name), with the
/// interface's name, or an error saying why there is no route. UDP connect(): no packet is sent.
struct route_source {
  std::string address;
  std::string interface;
};
[[nodiscard]] result<route_source> source_address_toward(const std::string& host);

/// The source address of the default route with the lowest metric (/proc/net/route): the one the
/// kernel uses toward its gateway, or its interface's first address for an on-link route.
[[nodiscard]] result<route_source> default_route_source();

/// The first IPv4 address of interface `name`, or of the first interface that is up and not
/// loopback when `name` is empty.
[[nodiscard]] result<route_source> interface_address(const std::string& name);

/// True when `host` is a numeric IPv4 loopback address (127.0.0.0/8): only this machine's
/// processes reach what is bound there.
[[nodiscard]] bool is_loopback_address(const std::string& host);

/// True when numeric IPv4 `host` reaches this machine itself: a loopback address, or an address
/// of one of its interfaces. Two such addresses with the same port reach one listener (bound to
/// 0.0.0.0), so they name the same node.
[[nodiscard]] bool is_address_of_this_host(const std::string& host);

}  // namespace tessera::mesh
