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
//
// This file is the link; tcp_wire.hpp the frames and socket helpers; tcp_setup.cpp the set-up
// (listeners, the hello).
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
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "actors/base/thread.hpp"
#include "transport/bulk/backends.hpp"
#include "transport/bulk/completion_queue.hpp"
#include "transport/bulk/tcp_wire.hpp"

namespace tessera::transport::bulk::detail::tcp {
namespace {

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

}  // namespace

std::unique_ptr<link> make_link(int fd, const link_options& options) {
  return std::make_unique<tcp_link>(fd, options);
}

}  // namespace tessera::transport::bulk::detail::tcp
