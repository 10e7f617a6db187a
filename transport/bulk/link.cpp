// Backend-independent parts of the bulk plane: names, params encoding, backend choice, shared
// buffers, and prepare_link() dispatch.
#include "transport/bulk/link.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "actors/base/msgpack_bounded.hpp"
#include "transport/bulk/backends.hpp"

namespace tessera::transport::bulk {

std::string_view to_string(backend_kind kind) noexcept {
  switch (kind) {
    case backend_kind::tcp: return "tcp";
    case backend_kind::shm: return "shm";
    case backend_kind::rdma: return "rdma";
  }
  return "unknown";
}

result<backend_kind> parse_backend(std::string_view name) {
  if (name == "tcp") return backend_kind::tcp;
  if (name == "shm") return backend_kind::shm;
  if (name == "rdma") return backend_kind::rdma;
  return make_error(errc::invalid_argument, "unknown bulk backend '{}' (expected tcp, shm or rdma)",
                    name);
}

std::string_view to_string(completion_kind kind) noexcept {
  switch (kind) {
    case completion_kind::write_done: return "write_done";
    case completion_kind::send_done: return "send_done";
    case completion_kind::write_received: return "write_received";
    case completion_kind::send_received: return "send_received";
    case completion_kind::link_down: return "link_down";
  }
  return "unknown";
}

std::vector<std::byte> encode(const connect_params& params) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, params);
  const auto* p = reinterpret_cast<const std::byte*>(buf.data());
  return {p, p + buf.size()};
}

result<connect_params> decode_connect_params(std::span<const std::byte> bytes) {
  // Params come from another node: bound them before msgpack allocates anything.
  constexpr std::size_t max_params_bytes = 4096;
  if (bytes.size() > max_params_bytes) {
    return make_error(errc::corrupt, "bulk connect params: {} bytes exceeds the {} byte limit",
                      bytes.size(), max_params_bytes);
  }
  auto decoded = tessera::bounded_decode<connect_params>(bytes.data(), bytes.size());
  if (!decoded)
    return make_error(errc::corrupt, "bulk connect params: malformed msgpack ({})",
                      decoded.error().message);
  connect_params& params = *decoded;
  if (params.version != connect_params::current_version) {
    return make_error(errc::unsupported, "bulk connect params: version {} (this node speaks {})",
                      params.version, connect_params::current_version);
  }
  if (params.backend < 1 || params.backend > 3) {
    return make_error(errc::corrupt, "bulk connect params: unknown backend {}", params.backend);
  }
  if (!params.gid.empty() && params.gid.size() != 16) {
    return make_error(errc::corrupt, "bulk connect params: gid has {} bytes, expected 16",
                      params.gid.size());
  }
  return params;
}

result<buffer_handle> link::register_buffer(const shared_buffer& buffer) {
  return register_buffer(buffer.data(), buffer.size());
}

std::string this_host_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  if (id.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    id = name;
  }
  return id;
}

local_capabilities probe_capabilities() {
  local_capabilities caps;
  caps.host_id = this_host_id();
#ifdef TESSERA_BULK_HAVE_RDMA
  caps.has_rdma = detail::rdma_device_available();
#endif
  return caps;
}

std::vector<std::string> describe_rdma_ports() {
#ifdef TESSERA_BULK_HAVE_RDMA
  return detail::rdma_port_descriptions();
#else
  return {};
#endif
}

backend_kind choose_backend(const local_capabilities& a, const local_capabilities& b,
                            std::optional<backend_kind> forced, bool exclude_rdma) {
  if (forced) return *forced;
  if (!exclude_rdma && a.has_rdma && b.has_rdma) return backend_kind::rdma;
  if (!a.host_id.empty() && a.host_id == b.host_id) return backend_kind::shm;
  return backend_kind::tcp;
}

result<std::shared_ptr<void>> reserve_bulk_port(const std::string& bind, std::uint16_t port) {
  if (port == 0) return std::shared_ptr<void>();
  return detail::reserve_tcp_port(bind, port);
}

result<std::unique_ptr<link_setup>> prepare_link(backend_kind kind, const link_options& options) {
  const auto& l = options.limits;
  if (l.max_buffers == 0 || l.max_outstanding == 0 || l.max_send_bytes == 0 ||
      l.max_received == 0) {
    return make_error(errc::invalid_argument, "bulk link limits must all be positive");
  }
  switch (kind) {
    case backend_kind::tcp: return detail::prepare_tcp_link(options);
    case backend_kind::shm: return detail::prepare_shm_link(options);
    case backend_kind::rdma:
#ifdef TESSERA_BULK_HAVE_RDMA
      return detail::prepare_rdma_link(options);
#else
      return make_error(errc::unsupported, "bulk backend rdma is not built into this binary");
#endif
  }
  return make_error(errc::invalid_argument, "unknown bulk backend {}", static_cast<int>(kind));
}

// --- shared_buffer -------------------------------------------------------------------------------

shared_buffer::~shared_buffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

shared_buffer::shared_buffer(shared_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

shared_buffer& shared_buffer::operator=(shared_buffer&& other) noexcept {
  if (this != &other) {
    shared_buffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

result<shared_buffer> allocate_buffer(std::size_t size) {
  if (size == 0) return make_error(errc::invalid_argument, "allocate_buffer: size 0");
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t rounded = (size + page - 1) / page * page;
  shared_buffer buf;
  buf.fd_ = ::memfd_create("tessera-bulk", MFD_CLOEXEC);
  if (buf.fd_ < 0) {
    return make_error(errc::io, "allocate_buffer: memfd_create failed: {}", std::strerror(errno));
  }
  if (::ftruncate(buf.fd_, static_cast<off_t>(rounded)) != 0) {
    return make_error(errc::io, "allocate_buffer: ftruncate to {} bytes failed: {}", rounded,
                      std::strerror(errno));
  }
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, buf.fd_, 0);
  if (p == MAP_FAILED) {
    return make_error(errc::io, "allocate_buffer: mmap of {} bytes failed: {}", rounded,
                      std::strerror(errno));
  }
  buf.data_ = static_cast<std::byte*>(p);
  buf.size_ = rounded;
  return buf;
}

std::uint64_t detail::random_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace tessera::transport::bulk
