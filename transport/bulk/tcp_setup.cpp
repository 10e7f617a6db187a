// tcp backend: the set-up of a link. Both sides listen (a port of the link's own, or one
// listener per address shared by every link of the process: shared_listener); the side with the
// smaller nonce connects and sends a hello naming both nonces, the other admits only the hello it
// expects and answers. The connected socket becomes the link (tcp.cpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "actors/base/thread.hpp"
#include "transport/bulk/backends.hpp"
#include "transport/bulk/tcp_wire.hpp"

namespace tessera::transport::bulk::detail {
namespace tcp {
namespace {


/// Where a link's set-up waits for its peer's connection. With link_options::listen_port, one
/// listener serves every link of the process on that address (get(): a firewall needs one known
/// port); otherwise each link has a private one on an ephemeral port (open()). Either way each
/// waiting set-up registers its nonce; whichever waiter accepts a connection reads its hello and
/// hands it to the set-up it names, or closes it (a stranger, or a link that gave up).
class shared_listener {
 public:
  /// The process's listener on `bind`:`port`, bound now if no set-up or reservation holds it.
  static result<std::shared_ptr<shared_listener>> get(const std::string& bind, std::uint16_t port) {
    static std::mutex registry_mu;
    static std::map<std::pair<std::string, std::uint16_t>, std::weak_ptr<shared_listener>> registry;
    std::lock_guard lock(registry_mu);
    auto& slot = registry[{bind, port}];
    if (auto live = slot.lock()) return live;
    auto l = open(bind, port);
    if (l) slot = *l;
    return l;
  }

  /// A listener of its own on `bind`:`port` (0: an ephemeral port).
  static result<std::shared_ptr<shared_listener>> open(const std::string& bind,
                                                       std::uint16_t port) {
    sockaddr_storage addr{};
    socklen_t len = 0;
    TESSERA_TRY(make_address(bind, port, addr, len));
    const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return tcp_error(errc::io, "socket");
    int yes = 1;
    if (port != 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 64) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      auto err = tcp_error(errc::io, port == 0 ? fmt::format("listen on {}", bind)
                                               : fmt::format("listen on the bulk port {}:{} (is "
                                                             "another process using it? set "
                                                             "listen.bulk_port)",
                                                             bind, port));
      ::close(fd);
      return err;
    }
    const auto bound =
        ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                        : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    return std::shared_ptr<shared_listener>(new shared_listener(fd, bound));
  }

  ~shared_listener() {
    for (auto& [nonce, q] : arrived_)
      for (auto& [fd, h] : q)
        ::close(fd);
    ::close(fd_);
  }
  shared_listener(const shared_listener&) = delete;
  shared_listener& operator=(const shared_listener&) = delete;

  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  void expect(std::uint64_t nonce) {
    std::lock_guard lock(mu_);
    waiting_.insert(nonce);
  }
  void forget(std::uint64_t nonce) {
    std::lock_guard lock(mu_);
    waiting_.erase(nonce);
    if (auto it = arrived_.find(nonce); it != arrived_.end()) {
      for (auto& [fd, h] : it->second)
        ::close(fd);
      arrived_.erase(it);
    }
  }

  /// The connection whose hello names `nonce` and comes from `from` (the peer's nonce, learnt
  /// over the control plane), accepting on the other waiters' behalf meanwhile. errc::timeout at
  /// the deadline (`timeout` says how long that was), errc::unauthorized when only connections
  /// with a wrong handshake came.
  result<int> take(std::uint64_t nonce, std::uint64_t from, clock::time_point deadline,
                   std::chrono::milliseconds timeout) {
    bool saw_stranger = false;
    for (;;) {
      std::optional<std::pair<int, hello>> got;
      {
        std::lock_guard lock(mu_);
        if (auto it = arrived_.find(nonce); it != arrived_.end() && !it->second.empty()) {
          got = it->second.front();
          it->second.pop_front();
        }
      }
      if (!got)
        got = accept_one(nonce, std::min(deadline, clock::now() + std::chrono::milliseconds(20)),
                         saw_stranger);
      if (got) {
        if (got->second.from_nonce == from) return got->first;
        saw_stranger = true;  // our nonce, but not the peer we expect
        ::close(got->first);
        continue;
      }
      if (clock::now() < deadline) continue;
      if (saw_stranger)
        return make_error(errc::unauthorized,
                          "bulk tcp: only connections with a wrong handshake arrived");
      return make_error(errc::timeout, "bulk tcp: peer did not connect within {} ms",
                        timeout.count());
    }
  }

 private:
  shared_listener(int fd, std::uint16_t port) : fd_(fd), port_(port) {}

  /// Accepts one connection before `until` and reads its hello: ours is returned, another
  /// waiting set-up's is queued for it (short slices: it finds it in arrived_), anything else is
  /// closed (`saw_stranger`).
  std::optional<std::pair<int, hello>> accept_one(std::uint64_t nonce, clock::time_point until,
                                                  bool& saw_stranger) {
    auto ready = wait_fd(fd_, POLLIN, until);
    if (!ready || !*ready) return std::nullopt;
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return std::nullopt;  // another waiter took it
    hello h;
    // A stranger gets a short window to present its hello, so it cannot stall set-up.
    auto got = read_all_until(fd, &h, sizeof h, clock::now() + std::chrono::seconds(2));
    if (got && h.magic == hello_magic && h.version == connect_params::current_version) {
      if (h.to_nonce == nonce) return std::pair{fd, h};
      std::lock_guard lock(mu_);
      if (waiting_.contains(h.to_nonce)) {
        arrived_[h.to_nonce].emplace_back(fd, h);
        return std::nullopt;
      }
    }
    saw_stranger = true;
    ::close(fd);
    return std::nullopt;
  }

  int fd_;
  std::uint16_t port_;
  std::mutex mu_;
  std::set<std::uint64_t> waiting_;
  std::map<std::uint64_t, std::deque<std::pair<int, hello>>> arrived_;
};

class tcp_setup final : public link_setup {
 public:
  tcp_setup(std::shared_ptr<shared_listener> listener, connect_params params,
            const link_options& options)
      : listener_(std::move(listener)), params_(std::move(params)), options_(options) {
    listener_->expect(params_.nonce);
  }
  ~tcp_setup() override {
    if (listener_) listener_->forget(params_.nonce);
  }

  const connect_params& local_params() const noexcept override { return params_; }

  result<std::unique_ptr<link>> connect(const connect_params& remote) override {
    if (used_) return make_error(errc::invalid_argument, "bulk tcp: connect called twice");
    used_ = true;
    if (remote.backend != static_cast<std::uint8_t>(backend_kind::tcp)) {
      return make_error(errc::invalid_argument, "bulk tcp: peer params are for backend {}",
                        remote.backend);
    }
    if (remote.nonce == params_.nonce) {
      return make_error(errc::invalid_argument, "bulk tcp: peer params carry our own nonce");
    }
    const auto deadline = clock::now() + options_.connect_timeout_ms;
    auto fd = remote.nonce > params_.nonce ? dial(remote, deadline) : accept_peer(remote, deadline);
    listener_->forget(params_.nonce);
    listener_.reset();  // a private listener closes now
    if (!fd) return std::move(fd).error();
    return make_link(*fd, options_);
  }

 private:
  result<int> dial(const connect_params& remote, clock::time_point deadline) {
    sockaddr_storage addr{};
    socklen_t len = 0;
    TESSERA_TRY(make_address(remote.address, remote.port, addr, len));
    // The peer may not be listening yet if its process is slow: retry until the deadline.
    for (;;) {
      const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return tcp_error(errc::io, "socket");
      auto done = try_dial(fd, addr, len, remote, deadline);
      if (done) return fd;
      ::close(fd);
      if (done.error().code != errc::io || clock::now() >= deadline) {
        return std::move(done).error();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  result<void> try_dial(int fd, const sockaddr_storage& addr, socklen_t len,
                        const connect_params& remote, clock::time_point deadline) {
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      if (errno != EINPROGRESS) return tcp_error(errc::io, "connect");
      auto ready = wait_fd(fd, POLLOUT, deadline);
      if (!ready) return std::move(ready).error();
      if (!*ready) {
        return make_error(errc::timeout, "bulk tcp: connect to {}:{} timed out", remote.address,
                          remote.port);
      }
      int err = 0;
      socklen_t elen = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
      if (err != 0) {
        errno = err;
        return tcp_error(errc::io, "connect");
      }
    }
    hello h;
    h.to_nonce = remote.nonce;
    h.from_nonce = params_.nonce;
    iovec iov{&h, sizeof h};
    TESSERA_TRY(write_all(fd, &iov, 1, options_.connect_timeout_ms));
    hello answer;
    TESSERA_TRY(read_all_until(fd, &answer, sizeof answer, deadline));
    if (answer.magic != hello_magic || answer.to_nonce != params_.nonce ||
        answer.from_nonce != remote.nonce) {
      return make_error(errc::unauthorized, "bulk tcp: {}:{} answered with a wrong handshake",
                        remote.address, remote.port);
    }
    return ok();
  }

  result<int> accept_peer(const connect_params& remote, clock::time_point deadline) {
    auto fd = listener_->take(params_.nonce, remote.nonce, deadline, options_.connect_timeout_ms);
    if (!fd) return fd;
    hello answer;
    answer.to_nonce = remote.nonce;
    answer.from_nonce = params_.nonce;
    iovec iov{&answer, sizeof answer};
    if (auto w = write_all(*fd, &iov, 1, options_.connect_timeout_ms); !w) {
      ::close(*fd);
      return std::move(w).error();
    }
    return fd;
  }

  friend result<std::unique_ptr<link_setup>> detail::prepare_tcp_link(
      const link_options& options);

  std::shared_ptr<shared_listener> listener_;  // until connect(): the link is up or failed
  connect_params params_;
  link_options options_;
  bool used_ = false;
};

}  // namespace
}  // namespace tcp

result<std::unique_ptr<link_setup>> prepare_tcp_link(const link_options& options) {
  using namespace tcp;
  connect_params params;
  params.backend = static_cast<std::uint8_t>(backend_kind::tcp);
  params.host_id = this_host_id();
  params.nonce = random_u64();
  const std::string bind = options.bind_address.empty() ? "127.0.0.1" : options.bind_address;
  const bool wildcard = bind == "0.0.0.0" || bind == "::";
  if (!options.advertise_address.empty()) {
    params.address = options.advertise_address;
  } else if (wildcard) {
    return make_error(errc::invalid_argument,
                      "bulk tcp: bound to {} with no advertise address: the peer would not know "
                      "where to connect",
                      bind);
  } else {
    params.address = bind;
  }
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (!make_address(params.address, 0, addr, len))
    return make_error(errc::invalid_argument,
                      "bulk tcp: advertise address '{}' is not a numeric IP", params.address);
  addr = {};
  if (!make_address(bind, 0, addr, len))
    return make_error(errc::invalid_argument, "bulk tcp: bind address '{}' is not a numeric IP",
                      bind);
  auto listener = options.listen_port != 0 ? shared_listener::get(bind, options.listen_port)
                                           : shared_listener::open(bind, 0);
  if (!listener) return std::move(listener).error();
  params.port = (*listener)->port();
  return std::unique_ptr<link_setup>(
      new tcp_setup(std::move(listener).value(), std::move(params), options));
}

result<std::shared_ptr<void>> reserve_tcp_port(const std::string& bind, std::uint16_t port) {
  using tcp::shared_listener;
  auto l = shared_listener::get(bind.empty() ? "127.0.0.1" : bind, port);
  if (!l) return std::move(l).error();
  return std::shared_ptr<void>(std::move(l).value());
}

}  // namespace tessera::transport::bulk::detail
