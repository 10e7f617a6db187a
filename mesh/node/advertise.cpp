#include "mesh/node/advertise.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "mesh/discovery/peer_hint.hpp"

namespace tessera::mesh {
namespace {

bool is_loopback(const in_addr& a) {
  return (ntohl(a.s_addr) >> 24) == 127;
}

std::string text_of(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

/// Numeric IPv4 as is; a name through the resolver (IPv4 only: the planes bind IPv4).
result<in_addr> resolve_ipv4(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return make_error(errc::not_found, "'{}' does not resolve to an IPv4 address: {}", host,
                      rc != 0 ? ::gai_strerror(rc) : "no address");
  }
  a = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

/// The first IPv4 address of an interface for which `pick(flags, name, address)` holds, with the
/// interface's name; nullopt when none does (or the list cannot be read).
template <class Pick>
std::optional<route_source> find_ipv4(Pick pick) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<route_source> found;
  for (const ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto& a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if (pick(i->ifa_flags, std::string_view(i->ifa_name), a))
      found = route_source{text_of(a), i->ifa_name};
  }
  ::freeifaddrs(list);
  return found;
}

/// The name of the interface holding address `a` ("" when none does).
std::string interface_of(const in_addr& a) {
  auto r =
      find_ipv4([&](unsigned, std::string_view, const in_addr& x) { return x.s_addr == a.s_addr; });
  return r ? r->interface : std::string();
}

}  // namespace

result<route_source> default_route_source() {
  // /proc/net/route: "Iface Destination Gateway Flags RefCnt Use Metric Mask ...", hex fields in
  // network byte order. The default route has destination and mask 0; the lowest metric wins.
  // thread-self: the calling thread's network namespace (/proc/net follows the process leader's).
  std::ifstream in("/proc/thread-self/net/route");
  std::string line;
  std::getline(in, line);  // header
  std::optional<std::pair<unsigned long, std::pair<std::string, std::uint32_t>>> best;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string iface, dest, gw, flags, refcnt, use, metric, mask;
    if (!(f >> iface >> dest >> gw >> flags >> refcnt >> use >> metric >> mask)) continue;
    constexpr unsigned long rtf_up = 0x1;
    if (dest != "00000000" || mask != "00000000" || (std::stoul(flags, nullptr, 16) & rtf_up) == 0)
      continue;
    const unsigned long m = std::stoul(metric);
    if (!best || m < best->first)
      best = {m, {iface, static_cast<std::uint32_t>(std::stoul(gw, nullptr, 16))}};
  }
  if (!best) return make_error(errc::not_found, "no default route");
  const auto& [iface, gateway] = best->second;
  if (gateway != 0) {
    // The source the kernel picks toward the gateway (the route's preferred source, if set).
    in_addr g{};
    g.s_addr = gateway;  // already in network byte order
    auto r = source_address_toward(text_of(g));
    if (r) return r;
  }
  return interface_address(iface);
}

result<route_source> source_address_toward(const std::string& host) {
  auto dest = resolve_ipv4(host);
  if (!dest) return dest.error();
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(errc::io, "socket: {}", std::strerror(errno));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr = *dest;
  to.sin_port = htons(9);  // any port: a UDP connect() only looks the route up
  sockaddr_in from{};
  socklen_t len = sizeof from;
  // connect() on a datagram socket picks the route and the source address; nothing is sent.
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&from), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(errc::not_found, "no route to {}: {}", host, std::strerror(err));
  }
  ::close(fd);
  if (from.sin_addr.s_addr == htonl(INADDR_ANY)) {
    return make_error(errc::not_found, "no source address toward {}", host);
  }
  return route_source{text_of(from.sin_addr), interface_of(from.sin_addr)};
}

result<route_source> interface_address(const std::string& name) {
  auto found = find_ipv4([&](unsigned flags, std::string_view ifname, const in_addr& a) {
    if (!name.empty()) return ifname == name;
    return (flags & IFF_UP) != 0 && (flags & IFF_LOOPBACK) == 0 && !is_loopback(a);
  });
  if (!found) {
    if (!name.empty())
      return make_error(errc::not_found, "interface '{}' has no IPv4 address", name);
    return make_error(errc::not_found, "no interface other than loopback is up with IPv4");
  }
  return *found;
}

result<advertised_address> choose_advertise_address(const advertise_inputs& in) {
  if (!in.advertise.empty()) {
    auto a = resolve_ipv4(in.advertise);
    if (!a) return make_error(errc::invalid_argument, "--advertise: {}", a.error().message);
    const std::string text = text_of(*a);
    return advertised_address{
        text, text == in.advertise ? "--advertise" : fmt::format("--advertise {}", in.advertise),
        false};
  }
  if (in.listen_address != "0.0.0.0" && !in.listen_address.empty()) {
    return advertised_address{in.listen_address, "--listen", false};
  }
  auto described = [](const route_source& r, std::string what) {
    return r.interface.empty() ? what : fmt::format("{} ({})", what, r.interface);
  };
  for (const auto& s : in.seeds) {
    auto ep = parse_endpoint(s);
    if (!ep) continue;
    auto r = source_address_toward(ep->host);
    if (r) return advertised_address{r->address, described(*r, "route to seed " + s), false};
  }
  if (!in.beacon_interface.empty()) {
    auto r = interface_address(in.beacon_interface);
    if (r) return advertised_address{r->address, "--beacon-interface " + r->interface, false};
  }
  if (auto r = default_route_source(); r) {
    return advertised_address{r->address, described(*r, "default route"), false};
  }
  if (auto r = interface_address(""); r) {
    return advertised_address{r->address, "first interface up: " + r->interface, false};
  }
  return advertised_address{"127.0.0.1", "loopback (no other interface is up)", true};
}

bool is_loopback_address(const std::string& host) {
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && is_loopback(a);
}

bool is_address_of_this_host(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) != 1) return false;
  if (is_loopback(a)) return true;
  return !interface_of(a).empty();
}

}  // namespace tessera::mesh
