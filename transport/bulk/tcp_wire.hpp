// The tcp backend's wire: the frame and hello layouts and the socket helpers that the link
// (tcp.cpp) and its set-up (tcp_setup.cpp) share. tcp.cpp's opening comment explains the
// protocol. Internal to transport/bulk: included by those two files only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>

#include "transport/bulk/backends.hpp"

namespace tessera::transport::bulk::detail::tcp {

using clock = std::chrono::steady_clock;

inline constexpr std::uint32_t frame_magic = 0x54425346;  // "TBSF"
inline constexpr std::uint32_t hello_magic = 0x54424853;  // "TBHS"

enum class frame_type : std::uint32_t { write_imm = 1, send = 2, error = 3 };

struct frame_header {
  std::uint32_t magic = frame_magic;
  std::uint32_t type = 0;
  std::uint32_t imm = 0;
  std::uint32_t buffer_id = 0;
  std::uint32_t rkey = 0;
  std::uint32_t reserved = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};
static_assert(sizeof(frame_header) == 40);

struct hello {
  std::uint32_t magic = hello_magic;
  std::uint32_t version = connect_params::current_version;
  std::uint64_t to_nonce = 0;    // the acceptor's nonce
  std::uint64_t from_nonce = 0;  // the connector's nonce
};

inline std::uint32_t random_nonzero_u32() {
  std::random_device rd;
  std::uint32_t v = 0;
  while (v == 0) v = rd();
  return v;
}

/// `host` (numeric IPv4 or IPv6) and `port` as a socket address; errc::invalid_argument naming
/// the text when it is not numeric (links connect to numbers: no resolver on the data path).
inline result<void> make_address(const std::string& host, std::uint16_t port,
                                 sockaddr_storage& addr, socklen_t& len) {
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    len = sizeof *v4;
    return ok();
  }
  if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    len = sizeof *v6;
    return ok();
  }
  return make_error(errc::invalid_argument, "bulk tcp: '{}' is not a numeric IP address", host);
}

inline error tcp_error(errc code, std::string_view what) {
  return make_error(code, "bulk tcp: {}: {}", what, std::strerror(errno));
}

// Waits for `events` on fd until the deadline. false on timeout.
inline result<bool> wait_fd(int fd, short events, clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 1000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return tcp_error(errc::io, "poll");
  }
}

// Writes all of iov or fails; stalls longer than `stall` fail with timeout. `blocking`: the socket
// has SO_SNDTIMEO set (the established link: one sendmsg per frame, as a plain socket writer
// does); otherwise each call is non-blocking and stalls wait in poll() (set-up).
inline result<void> write_all(int fd, iovec* iov, int iovcnt, std::chrono::milliseconds stall,
                       bool blocking = false) {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(iovcnt);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (blocking ? 0 : MSG_DONTWAIT));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (blocking) {
          return make_error(errc::timeout, "bulk tcp: peer accepted no bytes for {} ms",
                            stall.count());
        }
        auto ready = wait_fd(fd, POLLOUT, clock::now() + stall);
        if (!ready) return std::move(ready).error();
        if (!*ready) {
          return make_error(errc::timeout, "bulk tcp: peer accepted no bytes for {} ms",
                            stall.count());
        }
        continue;
      }
      return tcp_error(errc::closed, "send to peer failed");
    }
    auto left = static_cast<std::size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return ok();
}

// Blocking read of exactly size bytes (the receive thread's socket is blocking). EOF -> closed.
inline result<void> read_all(int fd, void* data, std::size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, MSG_WAITALL);
    if (n == 0) return make_error(errc::closed, "bulk tcp: peer closed the connection");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return make_error(errc::timeout, "bulk tcp: peer stalled in the middle of a frame");
      }
      return tcp_error(errc::closed, "receive from peer failed");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return ok();
}

// Reads exactly size bytes from a nonblocking socket before the deadline.
inline result<void> read_all_until(int fd, void* data, std::size_t size,
                                   clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n == 0) return make_error(errc::closed, "bulk tcp: peer closed during set-up");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return tcp_error(errc::io, "set-up receive");
      auto ready = wait_fd(fd, POLLIN, deadline);
      if (!ready) return std::move(ready).error();
      if (!*ready) return make_error(errc::timeout, "bulk tcp: peer silent during set-up");
      continue;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return ok();
}

inline void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

inline void tune_socket(int fd, std::chrono::milliseconds peer_timeout) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A dead host (not just a dead process) must also end the link: unacknowledged data times out
  // after peer_timeout, and an idle link is probed by keepalives.
  auto user_timeout = static_cast<unsigned>(peer_timeout.count());
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int idle_s = std::max(1, static_cast<int>(peer_timeout.count() / 2000));
  int intvl_s = std::max(1, static_cast<int>(peer_timeout.count() / 6000));
  int cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl_s, sizeof intvl_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/// The link over connected socket `fd` (the set-up checked the peer's hello): takes the
/// descriptor.
std::unique_ptr<link> make_link(int fd, const link_options& options);

}  // namespace tessera::transport::bulk::detail::tcp
