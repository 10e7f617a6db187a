// tcp backend: one TCP connection per link, both directions on it.
//
// Each operation is a 40-byte frame header followed by its payload. Writes go from the caller's
// thread straight from the registered source memory into the socket (sendmsg with two iovecs, no
// staging copy); a receive thread reads headers and reads write payloads straight into the
// registered target buffer, then queues the completion. So the sender never waits for the
// receiver's application (one-sided, as RDMA), and a completion means the bytes are in place.
//
// Set-up: both sides listen; the side with the smaller nonce connects to the other and sends a
// hello carrying both nonces; the acceptor admits only a hello naming its own nonce and the
// expected peer nonce (the nonces travelled over the authenticated control plane), and answers.
// Each link listens on a port of its own (ephemeral), or, with link_options::listen_port, every
// link of the process on that address shares one listener (shared_listener): a firewall then
// needs one known port, and the hello says which waiting link a connection is for.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "actors/base/thread.hpp"
#include "transport/bulk/backends.hpp"
#include "transport/bulk/completion_queue.hpp"

namespace tessera::transport::bulk::detail {
namespace {

using clock = std::chrono::steady_clock;

constexpr std::uint32_t frame_magic = 0x54425346;  // "TBSF"
constexpr std::uint32_t hello_magic = 0x54424853;  // "TBHS"

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

std::uint32_t random_nonzero_u32() {
  std::random_device rd;
  std::uint32_t v = 0;
  while (v == 0) v = rd();
  return v;
}

/// `host` (numeric IPv4 or IPv6) and `port` as a socket address; errc::invalid_argument naming
/// the text when it is not numeric (links connect to numbers: no resolver on the data path).
result<void> make_address(const std::string& host, std::uint16_t port, sockaddr_storage& addr,
                          socklen_t& len) {
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

error tcp_error(errc code, std::string_view what) {
  return make_error(code, "bulk tcp: {}: {}", what, std::strerror(errno));
}

// Waits for `events` on fd until the deadline. false on timeout.
result<bool> wait_fd(int fd, short events, clock::time_point deadline) {
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
result<void> write_all(int fd, iovec* iov, int iovcnt, std::chrono::milliseconds stall,
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
result<void> read_all(int fd, void* data, std::size_t size) {
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
result<void> read_all_until(int fd, void* data, std::size_t size, clock::time_point deadline) {
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

void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void tune_socket(int fd, std::chrono::milliseconds peer_timeout) {
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

struct registration {
  std::byte* addr = nullptr;
  std::uint64_t size = 0;
  std::uint32_t rkey = 0;  // 0 = free slot
};

class tcp_link final : public link {
 public:
  tcp_link(int fd, const link_options& options)
      : fd_(fd),
        options_(options),
        queue_(options.limits.max_received, options.limits.max_outstanding, options.spin_us),
        regs_(options.limits.max_buffers) {
    tune_socket(fd_, options_.peer_timeout_ms);
    // Blocking socket: the receive thread sleeps in recv(); a sender blocks in sendmsg() at most
    // SO_SNDTIMEO = peer_timeout_ms, so a stalled peer cannot hold it longer.
    set_nonblocking(fd_, false);
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(options_.peer_timeout_ms.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>(options_.peer_timeout_ms.count() % 1000 * 1000);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    // Reads start only on a readable socket; the timeout bounds a peer that stalls mid-frame.
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    receiver_ = std::thread([this] {
      name_this_thread("bulk-tcp-rx");
      receive_loop();
    });
  }

  ~tcp_link() override {
    close();
    receiver_.join();
    ::close(fd_);
  }

  backend_kind kind() const noexcept override { return backend_kind::tcp; }
  const link_limits& limits() const noexcept override { return options_.limits; }

  result<buffer_handle> register_buffer(void* addr, std::size_t size) override {
    if (addr == nullptr || size == 0) {
      return make_error(errc::invalid_argument, "register_buffer: null or empty range");
    }
    std::lock_guard lock(regs_mutex_);
    for (std::size_t i = 0; i < regs_.size(); ++i) {
      if (regs_[i].rkey == 0) {
        regs_[i] = {static_cast<std::byte*>(addr), size, random_nonzero_u32()};
        return buffer_handle{static_cast<std::uint32_t>(i + 1)};
      }
    }
    return make_error(errc::no_capacity, "register_buffer: all {} buffer slots of the link in use",
                      regs_.size());
  }

  result<void> deregister_buffer(buffer_handle handle) override {
    std::lock_guard lock(regs_mutex_);
    TESSERA_TRY(lookup_locked(handle));
    regs_[handle.id - 1] = registration{};
    return ok();
  }

  result<remote_buffer> describe(buffer_handle handle) const override {
    std::lock_guard lock(regs_mutex_);
    auto reg = lookup_locked(handle);
    if (!reg) return std::move(reg).error();
    return remote_buffer{handle.id, 0, reg->rkey, reg->size};
  }

  result<void> write_with_imm(buffer_handle local, std::uint64_t local_offset,
                              const remote_buffer& remote, std::uint64_t remote_offset,
                              std::uint64_t bytes, std::uint32_t imm,
                              std::uint64_t wr_id) override {
    registration src;
    {
      std::lock_guard lock(regs_mutex_);
      auto reg = lookup_locked(local);
      if (!reg) return std::move(reg).error();
      src = *reg;
    }
    auto source = check_write(src, local, local_offset, remote, remote_offset, bytes);
    if (!source) return std::move(source).error();
    const frame_header h = write_frame(remote, remote_offset, bytes, imm);
    return post(h, *source, bytes, completion_kind::write_done, wr_id);
  }

  result<void> post_writes(std::span<const write_request> writes) override {
    if (writes.empty()) return ok();
    if (writes.size() > options_.limits.max_outstanding) {
      return make_error(errc::invalid_argument,
                        "post_writes: {} writes in one list exceed max_outstanding ({})",
                        writes.size(), options_.limits.max_outstanding);
    }
    // Every frame goes out in one sendmsg() (or one per IOV_MAX vectors): one system call and
    // one pass through the socket's send path for the list instead of one per write.
    std::vector<frame_header> headers(writes.size());
    std::vector<iovec> iov;
    iov.reserve(2 * writes.size());
    {
      std::lock_guard lock(regs_mutex_);
      for (std::size_t i = 0; i < writes.size(); ++i) {
        const write_request& w = writes[i];
        auto reg = lookup_locked(w.local);
        if (!reg) return in_list(i, reg.error());
        auto source = check_write(*reg, w.local, w.local_offset, w.remote, w.remote_offset, w.bytes);
        if (!source) return in_list(i, source.error());
        headers[i] = write_frame(w.remote, w.remote_offset, w.bytes, w.imm);
        iov.push_back({&headers[i], sizeof(frame_header)});
        if (w.bytes > 0) {
          iov.push_back({const_cast<std::byte*>(*source), static_cast<std::size_t>(w.bytes)});
        }
      }
    }
    const auto count = static_cast<std::uint32_t>(writes.size());
    TESSERA_TRY(queue_.reserve_local(count));
    std::unique_lock lock(send_mutex_);
    if (queue_.is_down()) {
      queue_.cancel_local(count);
      return make_error(errc::closed, "bulk link is down: {}", queue_.down_reason().describe());
    }
    for (std::size_t at = 0; at < iov.size(); at += iov_max) {
      const int n = static_cast<int>(std::min(iov_max, iov.size() - at));
      auto written = write_all(fd_, iov.data() + at, n, options_.peer_timeout_ms, true);
      if (!written) {
        lock.unlock();
        queue_.cancel_local(count);
        go_down(written.error());
        return make_error(errc::closed, "bulk link is down: {}", written.error().describe());
      }
    }
    lock.unlock();
    for (const write_request& w : writes) {
      completion c;
      c.kind = completion_kind::write_done;
      c.wr_id = w.wr_id;
      c.bytes = w.bytes;
      queue_.push_local(std::move(c));
    }
    return ok();
  }

  result<void> send(std::span<const std::byte> message, std::uint64_t wr_id) override {
    if (message.size() > options_.limits.max_send_bytes) {
      return make_error(errc::invalid_argument, "send: {} bytes exceeds the limit of {}",
                        message.size(), options_.limits.max_send_bytes);
    }
    frame_header h;
    h.type = static_cast<std::uint32_t>(frame_type::send);
    h.bytes = message.size();
    return post(h, message.data(), message.size(), completion_kind::send_done, wr_id);
  }

  std::size_t poll(std::span<completion> out) override { return queue_.poll(out); }

  result<std::size_t> wait(std::span<completion> out, std::chrono::microseconds timeout) override {
    if (out.empty()) return make_error(errc::invalid_argument, "wait: empty output span");
    if (std::size_t n = queue_.poll(out); n > 0) return n;
    std::unique_lock rx(rx_mutex_, std::try_to_lock);
    if (!rx.owns_lock() || queue_.is_down()) return queue_.wait(out, timeout);
    app_reading_.store(true, std::memory_order_release);
    auto n = wait_as_reader(out, clock::now() + timeout);
    last_reader_ns_.store(clock::now().time_since_epoch().count(), std::memory_order_release);
    app_reading_.store(false, std::memory_order_release);
    return n;
  }

  bool is_up() const noexcept override { return !queue_.is_down(); }

  void close() override { go_down(make_error(errc::closed, "bulk tcp: link closed locally")); }

 private:
  // sendmsg() takes at most this many vectors (IOV_MAX on Linux).
  static constexpr std::size_t iov_max = 1024;

  // Where write_with_imm()'s bytes come from, or why it is refused (src is `local`'s registration).
  result<const std::byte*> check_write(const registration& src, buffer_handle local,
                                       std::uint64_t local_offset, const remote_buffer& remote,
                                       std::uint64_t remote_offset, std::uint64_t bytes) const {
    if (bytes > options_.limits.max_write_bytes) {
      return make_error(errc::invalid_argument, "write_with_imm: {} bytes exceeds the limit of {}",
                        bytes, options_.limits.max_write_bytes);
    }
    if (local_offset > src.size || bytes > src.size - local_offset) {
      return make_error(errc::invalid_argument,
                        "write_with_imm: source range [{}, +{}) outside local buffer {} of {} bytes",
                        local_offset, bytes, local.id, src.size);
    }
    if (remote_offset > remote.size || bytes > remote.size - remote_offset) {
      return make_error(errc::invalid_argument,
                        "write_with_imm: target range [{}, +{}) outside remote buffer {} of {} bytes",
                        remote_offset, bytes, remote.id, remote.size);
    }
    return static_cast<const std::byte*>(src.addr + local_offset);
  }

  static frame_header write_frame(const remote_buffer& remote, std::uint64_t remote_offset,
                                  std::uint64_t bytes, std::uint32_t imm) {
    frame_header h;
    h.type = static_cast<std::uint32_t>(frame_type::write_imm);
    h.imm = imm;
    h.buffer_id = remote.id;
    h.rkey = remote.rkey;
    h.offset = remote_offset;
    h.bytes = bytes;
    return h;
  }

  // An error about write `index` of a post_writes() list.
  static error in_list(std::size_t index, const error& e) {
    return make_error(e.code, "post_writes: write {}: {}", index, e.message);
  }

  result<registration> lookup_locked(buffer_handle handle) const {
    if (handle.id == 0 || handle.id > regs_.size() || regs_[handle.id - 1].rkey == 0) {
      return make_error(errc::invalid_argument, "bulk tcp: buffer handle {} is not registered",
                        handle.id);
    }
    return regs_[handle.id - 1];
  }

  result<void> post(const frame_header& h, const std::byte* payload, std::uint64_t bytes,
                    completion_kind done_kind, std::uint64_t wr_id) {
    TESSERA_TRY(queue_.reserve_local());
    std::unique_lock lock(send_mutex_);
    if (queue_.is_down()) {
      queue_.cancel_local();
      return make_error(errc::closed, "bulk link is down: {}", queue_.down_reason().describe());
    }
    iovec iov[2] = {{const_cast<frame_header*>(&h), sizeof h},
                    {const_cast<std::byte*>(payload), static_cast<std::size_t>(bytes)}};
    auto written = write_all(fd_, iov, bytes > 0 ? 2 : 1, options_.peer_timeout_ms, true);
    lock.unlock();
    if (!written) {
      queue_.cancel_local();
      go_down(written.error());
      return make_error(errc::closed, "bulk link is down: {}", written.error().describe());
    }
    completion c;
    c.kind = done_kind;
    c.wr_id = wr_id;
    c.bytes = bytes;
    queue_.push_local(std::move(c));
    return ok();
  }

  void go_down(error reason) {
    if (queue_.set_down(std::move(reason))) ::shutdown(fd_, SHUT_RDWR);
  }

  // Tells the peer why we drop the link (best effort), then drops it.
  void fail_protocol(error reason) {
    const std::string text = reason.message;
    frame_header h;
    h.type = static_cast<std::uint32_t>(frame_type::error);
    h.bytes = text.size();
    {
      std::lock_guard lock(send_mutex_);
      iovec iov[2] = {{&h, sizeof h}, {const_cast<char*>(text.data()), text.size()}};
      (void)write_all(fd_, iov, 2, std::chrono::milliseconds(100), false);
    }
    go_down(std::move(reason));
  }

  // The receive thread: reads whenever no application thread is waiting on the link (one-sided
  // progress: writes land while the application is busy elsewhere). While an application thread
  // waits, it reads the socket itself and this thread stays parked, so a message wakes one thread,
  // not two; it resumes 1 ms after the last such wait.
  void receive_loop() {
    for (;;) {
      if (queue_.is_down()) return;
      if (reader_active()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return go_down(tcp_error(errc::io, "poll"));
      std::unique_lock rx(rx_mutex_, std::try_to_lock);
      if (!rx.owns_lock()) continue;  // an application thread is reading
      if (queue_.is_down()) return;
      pollfd again{fd_, POLLIN, 0};
      if (::poll(&again, 1, 0) <= 0) continue;  // a waiting thread read it meanwhile
      if (!receive_one()) return;
    }
  }

  bool reader_active() const {
    if (app_reading_.load(std::memory_order_acquire)) return true;
    const auto last = last_reader_ns_.load(std::memory_order_acquire);
    return clock::now().time_since_epoch().count() - last < 1'000'000;
  }

  // Reads and handles one frame (the caller holds rx_mutex_). false: the link went down.
  bool receive_one() {
    frame_header h;
    auto got = read_all(fd_, &h, sizeof h);
    if (!got) {
      go_down(std::move(got).error());
      return false;
    }
    if (h.magic != frame_magic) {
      fail_protocol(make_error(errc::protocol, "bulk tcp: bad frame magic {:#x}", h.magic));
      return false;
    }
    result<void> handled = ok();
    switch (static_cast<frame_type>(h.type)) {
      case frame_type::write_imm: handled = receive_write(h); break;
      case frame_type::send: handled = receive_send(h); break;
      case frame_type::error: receive_error(h); return false;
      default: handled = make_error(errc::protocol, "bulk tcp: unknown frame type {}", h.type);
    }
    if (handled) return true;
    if (handled.error().code == errc::closed || handled.error().code == errc::timeout) {
      go_down(std::move(handled).error());
    } else {
      fail_protocol(std::move(handled).error());
    }
    return false;
  }

  // wait() with the socket to ourselves: spin on a non-blocking peek, then sleep in poll(), and
  // read frames in this thread. Saves the hand-off from the receive thread (a wake-up, 20-50 us
  // on a 2-vCPU guest) on every round trip.
  result<std::size_t> wait_as_reader(std::span<completion> out, clock::time_point deadline) {
    const auto spin_end = clock::now() + std::chrono::microseconds(options_.spin_us);
    for (;;) {
      if (std::size_t n = queue_.poll(out); n > 0) return n;
      if (queue_.is_down()) return queue_.wait(out, std::chrono::microseconds(0));
      const auto now = clock::now();
      if (now >= deadline) return std::size_t{0};
      bool readable = false;
      if (now < spin_end) {
        char byte = 0;
        const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        // Let a peer sharing this vCPU run: spinning alone cannot make its answer come sooner.
        if (n < 0) ::sched_yield();
        readable = n != 0 && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
      } else {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
        pollfd p{fd_, POLLIN, 0};
        // Slices of 10 ms: a local completion queued by another thread is seen within one.
        readable = ::poll(&p, 1, static_cast<int>(std::clamp<long>(left.count() + 1, 1, 10))) > 0;
      }
      // The queue is empty here (polled above), so handling the frame cannot block on it.
      if (readable) (void)receive_one();
    }
  }

  result<void> receive_write(const frame_header& h) {
    registration target;
    {
      std::lock_guard lock(regs_mutex_);
      if (h.buffer_id == 0 || h.buffer_id > regs_.size() ||
          regs_[h.buffer_id - 1].rkey != h.rkey || h.rkey == 0) {
        return make_error(errc::protocol,
                          "bulk tcp: remote access error: buffer {} rkey {:#x} not registered",
                          h.buffer_id, h.rkey);
      }
      target = regs_[h.buffer_id - 1];
    }
    if (h.offset > target.size || h.bytes > target.size - h.offset) {
      return make_error(errc::protocol,
                        "bulk tcp: remote access error: range [{}, +{}) outside buffer {} of {}",
                        h.offset, h.bytes, h.buffer_id, target.size);
    }
    TESSERA_TRY(read_all(fd_, target.addr + h.offset, h.bytes));
    completion c;
    c.kind = completion_kind::write_received;
    c.imm = h.imm;
    c.bytes = h.bytes;
    if (!queue_.push_received(std::move(c))) {
      return make_error(errc::closed, "bulk tcp: link went down");
    }
    return ok();
  }

  result<void> receive_send(const frame_header& h) {
    if (h.bytes > options_.limits.max_send_bytes) {
      return make_error(errc::protocol, "bulk tcp: peer sent {} bytes, limit {}", h.bytes,
                        options_.limits.max_send_bytes);
    }
    completion c;
    c.kind = completion_kind::send_received;
    c.bytes = h.bytes;
    c.data.resize(h.bytes);
    TESSERA_TRY(read_all(fd_, c.data.data(), h.bytes));
    if (!queue_.push_received(std::move(c))) {
      return make_error(errc::closed, "bulk tcp: link went down");
    }
    return ok();
  }

  void receive_error(const frame_header& h) {
    std::string text(std::min<std::uint64_t>(h.bytes, 1024), '\0');
    (void)read_all(fd_, text.data(), text.size());
    go_down(make_error(errc::protocol, "bulk tcp: peer dropped the link: {}", text));
  }

  const int fd_;
  const link_options options_;
  completion_queue queue_;
  mutable std::mutex regs_mutex_;
  std::vector<registration> regs_;
  std::mutex send_mutex_;
  std::mutex rx_mutex_;  // held by whichever thread reads the socket: receiver_ or a waiter
  std::atomic<bool> app_reading_{false};
  std::atomic<std::int64_t> last_reader_ns_{0};
  std::thread receiver_;
};

// --- set-up ------------------------------------------------------------------------------------

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
    return std::unique_ptr<link>(new tcp_link(*fd, options_));
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

  friend result<std::unique_ptr<link_setup>> prepare_tcp_link(const link_options& options);

  std::shared_ptr<shared_listener> listener_;  // until connect(): the link is up or failed
  connect_params params_;
  link_options options_;
  bool used_ = false;
};

}  // namespace

result<std::unique_ptr<link_setup>> prepare_tcp_link(const link_options& options) {
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
  auto l = shared_listener::get(bind.empty() ? "127.0.0.1" : bind, port);
  if (!l) return std::move(l).error();
  return std::shared_ptr<void>(std::move(l).value());
}

}  // namespace tessera::transport::bulk::detail
