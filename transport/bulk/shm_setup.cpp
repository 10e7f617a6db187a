// shm backend: the set-up of a link. prepare_shm_link() creates our inbox (a memfd, see
// shm_inbox.hpp) and the connect_params that name it; connect() maps the peer's inbox through
// /proc/<pid>/fd/<n>, checks that it is the one the peer announced and of a size its header
// allows, claims it as its only producer and waits for the peer to claim ours (shm.cpp).
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <new>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "transport/bulk/backends.hpp"
#include "transport/bulk/biased_lock.hpp"
#include "transport/bulk/shm_inbox.hpp"

namespace tessera::transport::bulk::detail {
namespace shm {
namespace {

// What our inbox header's fence_free says (computed again at connect, not read back from the
// header, which the peer can write).
bool announces_fence_free(const link_options& options) {
  return options.shm_fence_free && membarrier_support().global_expedited;
}

class shm_setup final : public link_setup {
 public:
  shm_setup(inbox_view own, int fd, connect_params params, const link_options& options)
      : own_(own), fd_(fd), params_(std::move(params)), options_(options) {}
  ~shm_setup() override {
    if (own_.base != nullptr) ::munmap(own_.base, own_.size);
    if (fd_ >= 0) ::close(fd_);
  }

  const connect_params& local_params() const noexcept override { return params_; }

  result<std::unique_ptr<link>> connect(const connect_params& remote) override {
    if (own_.base == nullptr) return make_error(errc::invalid_argument, "bulk shm: connect twice");
    if (remote.backend != static_cast<std::uint8_t>(backend_kind::shm)) {
      return make_error(errc::invalid_argument, "bulk shm: peer params are for backend {}",
                        remote.backend);
    }
    if (remote.host_id != params_.host_id) {
      return make_error(errc::invalid_argument, "bulk shm: peer is on host {}, we are on {}",
                        remote.host_id, params_.host_id);
    }
    if (remote.nonce == params_.nonce) {
      return make_error(errc::invalid_argument, "bulk shm: peer params carry our own nonce");
    }
    auto peer = map_path(remote.shm_name, sizeof(inbox_header));
    if (!peer) return std::move(peer).error();
    inbox_header* ph = peer->header();
    if (ph->magic == inbox_magic && ph->version != inbox_format) {
      const std::uint32_t theirs = ph->version;
      ::munmap(peer->base, peer->size);
      return make_error(errc::unsupported,
                        "bulk shm: the peer's inbox has format {}, we speak {} (different builds)",
                        theirs, inbox_format);
    }
    // Read once: the peer can change its header at any time, and what we checked is what we use.
    const std::uint32_t depth = ph->depth;
    const std::uint32_t payload = ph->slot_payload;
    const std::uint32_t buffers = ph->max_buffers;
    // Fence-free only when both announced it: each of us runs membarrier() before sleeping and
    // registered so that the other's membarrier() reaches our publishing threads.
    const bool fence_free = ph->fence_free == 1 && announces_fence_free(options_);
    if (ph->magic != inbox_magic || ph->owner_nonce != remote.nonce || depth == 0 ||
        depth > max_geometry || buffers > max_geometry || payload > max_slot_payload ||
        peer->size < inbox_bytes(depth, payload, buffers)) {
      ::munmap(peer->base, peer->size);
      return make_error(errc::unauthorized, "bulk shm: {} is not the inbox the peer announced",
                        remote.shm_name);
    }
    *peer = inbox_view::of(peer->base, peer->size, depth, payload, buffers);
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, remote.pid, 0));
    if (pidfd < 0) {
      auto err = shm_error(errc::closed, fmt::format("peer process {}", remote.pid));
      ::munmap(peer->base, peer->size);
      return err;
    }
    std::uint64_t expected = 0;
    if (!ph->attached_nonce.compare_exchange_strong(expected, params_.nonce)) {
      ::munmap(peer->base, peer->size);
      ::close(pidfd);
      return make_error(errc::unauthorized, "bulk shm: another process attached to {}",
                        remote.shm_name);
    }
    // Wait for the peer to attach to our inbox too, so both ends are live when connect returns.
    auto attached = wait_attached(remote, pidfd);
    if (!attached) {
      ::munmap(peer->base, peer->size);
      ::close(pidfd);
      return std::move(attached).error();
    }
    return make_link(std::exchange(own_, inbox_view{}), std::exchange(fd_, -1), *peer, pidfd,
                     remote.pid, options_, fence_free);
  }

 private:
  result<void> wait_attached(const connect_params& remote, int pidfd) {
    const auto deadline = clock::now() + options_.connect_timeout_ms;
    for (;;) {
      const std::uint64_t who = own_.header()->attached_nonce.load(std::memory_order_acquire);
      if (who == remote.nonce) return ok();
      if (who != 0) {
        return make_error(errc::unauthorized, "bulk shm: a process other than the peer attached");
      }
      pollfd p{pidfd, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) {
        return make_error(errc::closed, "bulk shm: peer process {} exited during set-up",
                          remote.pid);
      }
      if (clock::now() >= deadline) {
        return make_error(errc::timeout, "bulk shm: peer did not attach within {} ms",
                          options_.connect_timeout_ms.count());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  inbox_view own_;
  int fd_;
  connect_params params_;
  link_options options_;
};

}  // namespace
}  // namespace shm

result<std::unique_ptr<link_setup>> prepare_shm_link(const link_options& options) {
  using namespace shm;
  const auto& l = options.limits;
  if (l.max_received > max_geometry || l.max_buffers > max_geometry ||
      l.max_send_bytes > max_slot_payload) {
    return make_error(errc::invalid_argument,
                      "bulk shm: limits too large for an inbox (max_received and max_buffers at "
                      "most {}, max_send_bytes at most {})",
                      max_geometry, max_slot_payload);
  }
  const std::size_t bytes = inbox_bytes(l.max_received, l.max_send_bytes, l.max_buffers);
  const int fd = ::memfd_create("tessera-bulk-inbox", MFD_CLOEXEC);
  if (fd < 0) return shm_error(errc::io, "memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    auto err = shm_error(errc::io, "ftruncate inbox");
    ::close(fd);
    return err;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    auto err = shm_error(errc::io, "mmap inbox");
    ::close(fd);
    return err;
  }
  inbox_view own = inbox_view::of(static_cast<std::byte*>(p), bytes, l.max_received,
                                  l.max_send_bytes, l.max_buffers);
  // The memfd is zero-filled: every atomic starts at 0. Placement-new the header's atomics anyway
  // so their lifetime begins formally.
  auto* h = new (own.base) inbox_header{};
  h->magic = inbox_magic;
  h->version = inbox_format;
  h->owner_nonce = random_u64();
  h->depth = l.max_received;
  h->slot_payload = l.max_send_bytes;
  h->max_buffers = l.max_buffers;
  h->fence_free = announces_fence_free(options) ? 1 : 0;
  for (std::uint32_t i = 0; i < l.max_buffers; ++i) new (&own.table()[i]) reg_entry{};
  for (std::uint32_t i = 0; i < l.max_received; ++i)
    new (own.slot(i)) std::atomic<std::uint64_t>{0};

  connect_params params;
  params.backend = static_cast<std::uint8_t>(backend_kind::shm);
  params.host_id = this_host_id();
  params.nonce = h->owner_nonce;
  params.pid = static_cast<std::int32_t>(::getpid());
  params.shm_name = fmt::format("/proc/{}/fd/{}", params.pid, fd);
  return std::unique_ptr<link_setup>(new shm_setup(own, fd, std::move(params), options));
}

}  // namespace tessera::transport::bulk::detail
