#include "mesh/discovery/beacon_source.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "actors/base/log.hpp"
#include "actors/base/thread.hpp"

namespace tessera::mesh {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

result<std::unique_ptr<beacon_source>> beacon_source::create(beacon_options options) {
  if (options.port == 0) return make_error(errc::invalid_argument, "beacon: port 0");
  if (options.interval_ms == 0) return make_error(errc::invalid_argument, "beacon: interval 0 ms");
  if (options.max_datagrams_per_wakeup == 0) {
    return make_error(errc::invalid_argument, "beacon: max_datagrams_per_wakeup 0");
  }
  in_addr addr{};
  if (::inet_pton(AF_INET, options.address.c_str(), &addr) != 1) {
    return make_error(errc::invalid_argument, "beacon address '{}' is not an IPv4 address",
                      options.address);
  }
  if (options.interface_name.size() >= IFNAMSIZ) {
    return make_error(errc::invalid_argument, "beacon interface '{}': name too long",
                      options.interface_name);
  }
  beacon b{options.node_id, options.cluster_id, options.advertise_host, options.control_port,
           options.protocol_version};
  auto encoded = encode_beacon(b, options.key);
  if (!encoded) return std::move(encoded).error();
  auto src = std::unique_ptr<beacon_source>(new beacon_source(std::move(options)));
  src->datagram_ = std::move(encoded).value();
  src->dest_addr_be_ = addr.s_addr;
  return src;
}

beacon_source::beacon_source(beacon_options options) : options_(std::move(options)) {}

beacon_source::~beacon_source() {
  stop();
}

result<void> beacon_source::open_socket() {
  fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) return make_error(errc::io, "beacon: socket: {}", errno_text());
  int one = 1;
  // Several nodes on one host (tests, or a node per NUMA domain) share the port: every socket
  // bound to it receives each multicast/broadcast datagram.
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  unsigned ifindex = 0;
  if (!options_.interface_name.empty()) {
    ifindex = ::if_nametoindex(options_.interface_name.c_str());
    if (ifindex == 0) {
      return make_error(errc::invalid_argument, "beacon interface '{}': {}",
                        options_.interface_name, errno_text());
    }
  }
  bool multicast = IN_MULTICAST(ntohl(dest_addr_be_));
  if (multicast) {
    ip_mreqn mreq{};
    mreq.imr_multiaddr.s_addr = dest_addr_be_;
    mreq.imr_ifindex = static_cast<int>(ifindex);
    if (::setsockopt(fd_, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof(mreq)) != 0) {
      return make_error(errc::io, "beacon: joining multicast group {} on interface '{}': {}",
                        options_.address, options_.interface_name, errno_text());
    }
    if (ifindex != 0 && ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_IF, &mreq, sizeof(mreq)) != 0) {
      return make_error(errc::io, "beacon: IP_MULTICAST_IF {}: {}", options_.interface_name,
                        errno_text());
    }
    unsigned char ttl = 1;   // beacons never leave the link
    unsigned char loop = 1;  // other nodes on this host hear us too
    ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof(ttl));
    ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof(loop));
  } else {
    ::setsockopt(fd_, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one));
    if (ifindex != 0 &&
        ::setsockopt(fd_, SOL_SOCKET, SO_BINDTODEVICE, options_.interface_name.c_str(),
                     static_cast<socklen_t>(options_.interface_name.size())) != 0) {
      return make_error(errc::io, "beacon: binding to interface '{}': {}", options_.interface_name,
                        errno_text());
    }
  }
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_port = htons(options_.port);
  local.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
    return make_error(errc::io, "beacon: bind 0.0.0.0:{}: {}", options_.port, errno_text());
  }
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return make_error(errc::io, "beacon: eventfd: {}", errno_text());
  return ok();
}

result<void> beacon_source::start(hint_sink sink) {
  TESSERA_ASSERT(!thread_.joinable(), "beacon_source::start called twice");
  TESSERA_ASSERT(sink != nullptr, "beacon_source::start without a sink");
  sink_ = std::move(sink);
  auto r = open_socket();
  if (!r) {
    if (fd_ >= 0) ::close(fd_);
    if (stop_fd_ >= 0) ::close(stop_fd_);
    fd_ = stop_fd_ = -1;
    return r;
  }
  // Create spdlog's registry on this thread before ours logs: its lazy initialisation inside the
  // uninstrumented libspdlog is invisible to TSan, which then reports two sources' threads racing.
  (void)spdlog::default_logger_raw();
  thread_ = std::thread([this] { run(); });
  return ok();
}

void beacon_source::stop() {
  if (thread_.joinable()) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (fd_ >= 0) ::close(fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
  fd_ = stop_fd_ = -1;
}

discovery_stats beacon_source::stats() const {
  discovery_stats s;
  s.hints = counters_.hints.load();
  s.foreign_cluster = counters_.foreign.load();
  s.malformed = counters_.malformed.load();
  s.unauthenticated = counters_.unauthenticated.load();
  s.self = counters_.self.load();
  s.sent = counters_.sent.load();
  s.send_errors = counters_.send_errors.load();
  return s;
}

void beacon_source::run() {
  name_this_thread("beacon");
  using clock = std::chrono::steady_clock;
  auto next_send = clock::now();
  for (;;) {
    auto now = clock::now();
    if (now >= next_send) {
      send_one();
      next_send = now + std::chrono::milliseconds(options_.interval_ms);
    }
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next_send - now).count();
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    int n = ::poll(fds, 2, static_cast<int>(std::max<long long>(wait_ms, 1)));
    if (n < 0 && errno != EINTR) {
      spdlog::error("beacon: poll: {}", errno_text());
      return;
    }
    if (fds[1].revents & POLLIN) return;
    if (fds[0].revents & POLLIN) receive_some();
  }
}

void beacon_source::send_one() {
  sockaddr_in dest{};
  dest.sin_family = AF_INET;
  dest.sin_port = htons(options_.port);
  dest.sin_addr.s_addr = dest_addr_be_;
  ssize_t n = ::sendto(fd_, datagram_.data(), datagram_.size(), 0,
                       reinterpret_cast<sockaddr*>(&dest), sizeof(dest));
  if (n == static_cast<ssize_t>(datagram_.size())) {
    counters_.sent.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Log the first error and then every 100th: a down link must not flood the log.
  auto errors = counters_.send_errors.fetch_add(1, std::memory_order_relaxed);
  if (errors % 100 == 0) {
    spdlog::warn("beacon: sendto {}:{}: {} ({} errors so far)", options_.address, options_.port,
                 errno_text(), errors + 1);
  }
}

void beacon_source::receive_some() {
  std::uint8_t buf[max_beacon_bytes + 1];
  for (std::uint32_t i = 0; i < options_.max_datagrams_per_wakeup; ++i) {
    sockaddr_in from{};
    socklen_t from_len = sizeof(from);
    ssize_t n =
        ::recvfrom(fd_, buf, sizeof(buf), MSG_TRUNC, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) return;  // EAGAIN: drained
    char addr[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &from.sin_addr, addr, sizeof(addr));
    // MSG_TRUNC makes n the real length, so an oversized datagram fails the size bound.
    auto decoded =
        decode_beacon(std::span(buf, std::min<std::size_t>(n, sizeof(buf))), options_.key);
    if (static_cast<std::size_t>(n) > max_beacon_bytes) {
      decoded = make_error(errc::corrupt, "beacon of {} bytes exceeds the bound", n);
    }
    if (!decoded) {
      auto& counter = decoded.error().code == errc::unauthorized ? counters_.unauthenticated
                                                                 : counters_.malformed;
      counter.fetch_add(1, std::memory_order_relaxed);
      spdlog::debug("beacon: dropped datagram from {}: {}", addr, decoded.error().message);
      continue;
    }
    if (decoded->node_id == options_.node_id) {
      counters_.self.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (decoded->cluster_id != options_.cluster_id) {
      counters_.foreign.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    peer_hint hint;
    hint.node_id = decoded->node_id;
    hint.cluster_id = decoded->cluster_id;
    hint.control.push_back(
        {decoded->host.empty() ? std::string(addr) : decoded->host, decoded->control_port});
    hint.source = hint_source::beacon;
    hint.protocol_version = decoded->protocol_version;
    hint.seen_at = std::chrono::system_clock::now();
    counters_.hints.fetch_add(1, std::memory_order_relaxed);
    sink_(hint);
  }
}

}  // namespace tessera::mesh
