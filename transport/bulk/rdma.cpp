// The rdma bulk backend. Design and state diagram: rdma.hpp; shared semantics: link.hpp.
//
// This file: the pure parts (GID choice, timeouts, chunking), the device listing and the link over
// an endpoint; the endpoint itself is in rdma_endpoint.hpp, rdma_endpoint.cpp (set-up) and
// rdma_datapath.cpp (data path).
#include "transport/bulk/rdma.hpp"

#include <infiniband/verbs.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "transport/bulk/backends.hpp"
#include "transport/bulk/link.hpp"
#include "transport/bulk/rdma_endpoint.hpp"

namespace tessera::transport::bulk {
namespace rdma {

bool gid_entry::ipv4_mapped() const noexcept {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return false;
  }
  return gid[10] == 0xff && gid[11] == 0xff;
}

bool gid_entry::link_local() const noexcept { return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80; }

result<std::uint32_t> pick_gid(std::span<const gid_entry> gids, bool ethernet,
                               const std::string& prefer_ipv4) {
  if (!ethernet) {
    for (const auto& g : gids) {
      if (g.index == 0) return g.index;
    }
    return make_error(errc::not_found, "InfiniBand port has no GID at index 0");
  }
  // A host with several addressed netdevs under RDMA devices: the GID of the address peers were
  // told (the same one the control plane and tcp links use) is the one whose route reaches them.
  in_addr want{};
  if (!prefer_ipv4.empty() && ::inet_pton(AF_INET, prefer_ipv4.c_str(), &want) == 1) {
    for (const auto& g : gids) {
      if (g.type == gid_type_roce_v2 && g.ipv4_mapped() &&
          std::memcmp(g.gid.data() + 12, &want.s_addr, 4) == 0)
        return g.index;
    }
  }
  for (const auto& g : gids) {
    if (g.type == gid_type_roce_v2 && g.ipv4_mapped()) return g.index;
  }
  for (const auto& g : gids) {
    if (g.type == gid_type_roce_v2 && !g.link_local()) return g.index;
  }
  return make_error(errc::not_found,
                    "no RoCE v2 GID with an IPv4 or global IPv6 address among {} entries (is the "
                    "netdev under the RDMA device up and addressed?)",
                    gids.size());
}

std::string format_gid(std::span<const std::uint8_t> gid) {
  if (gid.size() != 16) return fmt::format("<gid of {} bytes>", gid.size());
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.data(), text, sizeof text) == nullptr) return "<bad gid>";
  return text;
}

std::uint8_t ack_timeout_exponent(std::chrono::milliseconds peer_timeout,
                                  std::uint8_t retry_cnt) noexcept {
  const double per_try_us =
      static_cast<double>(std::max<std::int64_t>(peer_timeout.count(), 1)) * 1000.0 /
      (static_cast<double>(retry_cnt) + 1.0);
  std::uint8_t t = 10;
  while (t < 22 && 4.096 * static_cast<double>(1ull << (t + 1)) <= per_try_us) ++t;
  return t;
}

std::uint64_t chunk_count(std::uint64_t bytes, std::uint64_t max_msg_bytes) noexcept {
  if (bytes == 0 || max_msg_bytes == 0) return 1;
  return (bytes + max_msg_bytes - 1) / max_msg_bytes;
}

result<std::vector<device_info>> list_devices() {
  int count = 0;
  device_list list(ibv_get_device_list(&count));
  std::vector<device_info> out;
  if (!list) {
    // ENOSYS: no kernel support at all, which is "no devices" rather than a failure.
    if (errno == ENOSYS || errno == ENOENT) return out;
    return make_error(errc::io, "ibv_get_device_list: {}", errno_text(errno));
  }
  for (int i = 0; i < count; ++i) {
    context_ptr ctx(ibv_open_device(list.get()[i]));
    if (!ctx) {
      return make_error(errc::io, "{}: ibv_open_device: {}",
                        ibv_get_device_name(list.get()[i]), errno_text(errno));
    }
    auto info = query_device(ctx.get());
    if (!info) return std::move(info).error();
    out.push_back(std::move(*info));
  }
  return out;
}

}  // namespace rdma

namespace {

using rdma_ep::endpoint;

class rdma_link final : public link {
 public:
  explicit rdma_link(std::unique_ptr<endpoint> ep) : ep_(std::move(ep)) {}
  backend_kind kind() const noexcept override { return backend_kind::rdma; }
  const link_limits& limits() const noexcept override { return ep_->limits(); }
  result<buffer_handle> register_buffer(void* addr, std::size_t size) override {
    return ep_->register_buffer(addr, size);
  }
  using link::register_buffer;
  result<void> deregister_buffer(buffer_handle handle) override {
    return ep_->deregister_buffer(handle);
  }
  result<remote_buffer> describe(buffer_handle handle) const override {
    return ep_->describe(handle);
  }
  result<void> write_with_imm(buffer_handle local, std::uint64_t local_offset,
                              const remote_buffer& remote, std::uint64_t remote_offset,
                              std::uint64_t bytes, std::uint32_t imm, std::uint64_t wr_id) override {
    return ep_->write_with_imm(local, local_offset, remote, remote_offset, bytes, imm, wr_id);
  }
  result<void> post_writes(std::span<const write_request> writes) override {
    return ep_->post_writes(writes);
  }
  result<void> send(std::span<const std::byte> message, std::uint64_t wr_id) override {
    return ep_->send(message, wr_id);
  }
  std::size_t poll(std::span<completion> out) override { return ep_->poll(out); }
  result<std::size_t> wait(std::span<completion> out, std::chrono::microseconds timeout) override {
    return ep_->wait(out, timeout);
  }
  bool is_up() const noexcept override { return ep_->is_up(); }
  void close() override { ep_->close(); }

 private:
  std::unique_ptr<endpoint> ep_;
};

class rdma_setup final : public link_setup {
 public:
  explicit rdma_setup(std::unique_ptr<endpoint> ep)
      : params_(ep->local_params()), ep_(std::move(ep)) {}
  // A copy: still valid after connect() has handed the endpoint to the link.
  const connect_params& local_params() const noexcept override { return params_; }
  result<std::unique_ptr<link>> connect(const connect_params& remote) override {
    if (!ep_) return make_error(errc::invalid_argument, "rdma: connect() called twice");
    std::unique_ptr<endpoint> ep = std::move(ep_);
    TESSERA_TRY(ep->connect(remote));
    return std::unique_ptr<link>(std::make_unique<rdma_link>(std::move(ep)));
  }

 private:
  connect_params params_;
  std::unique_ptr<endpoint> ep_;
};

}  // namespace

namespace detail {

result<std::unique_ptr<link_setup>> prepare_rdma_link(const link_options& options) {
  auto ep = endpoint::open(options);
  if (!ep) return std::move(ep).error();
  return std::unique_ptr<link_setup>(std::make_unique<rdma_setup>(std::move(*ep)));
}

bool rdma_device_available() {
  auto devices = rdma::list_devices();
  if (!devices) return false;
  for (const auto& d : *devices) {
    for (const auto& p : d.ports) {
      if (p.active) return true;
    }
  }
  return false;
}

std::vector<std::string> rdma_port_descriptions() {
  std::vector<std::string> out;
  auto devices = rdma::list_devices();
  if (!devices) return out;
  for (const auto& d : *devices)
    for (const auto& p : d.ports) {
      if (!p.active) continue;
      auto pick = rdma::pick_gid(p.gids, p.ethernet);
      if (!pick) {
        out.push_back(fmt::format("{}/{} (no usable GID)", d.name, p.port));
        continue;
      }
      for (const auto& g : p.gids) {
        if (g.index != *pick) continue;
        const char* type = g.type == rdma::gid_type_roce_v2   ? "RoCE v2"
                           : g.type == rdma::gid_type_roce_v1 ? "RoCE v1"
                                                              : "IB";
        out.push_back(fmt::format("{}/{} {} ({}, GID index {})", d.name, p.port,
                                  rdma::format_gid(g.gid), type, g.index));
      }
    }
  return out;
}

}  // namespace detail
}  // namespace tessera::transport::bulk
