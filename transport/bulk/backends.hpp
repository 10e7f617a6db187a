// Entry points of the individual backends, called by prepare_link() (link.cpp). Not for use
// outside transport/bulk: code above the bulk plane calls prepare_link().
//
// The rdma backend lives in rdma*.cpp; transport/bulk/CMakeLists.txt compiles those files when
// rdma.cpp exists and then defines TESSERA_BULK_HAVE_RDMA, which makes prepare_link() and
// probe_capabilities() call the two rdma functions below.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/bulk/link.hpp"

namespace tessera::transport::bulk::detail {

[[nodiscard]] result<std::unique_ptr<link_setup>> prepare_tcp_link(const link_options& options);
/// Binds the shared tcp listener of (bind, port) now and keeps it while the result lives.
[[nodiscard]] result<std::shared_ptr<void>> reserve_tcp_port(const std::string& bind,
                                                             std::uint16_t port);
[[nodiscard]] result<std::unique_ptr<link_setup>> prepare_shm_link(const link_options& options);
[[nodiscard]] result<std::unique_ptr<link_setup>> prepare_rdma_link(const link_options& options);
/// True when an RDMA device with an active port is present (rdma.cpp).
[[nodiscard]] bool rdma_device_available();
/// Active ports with the GID a link would use (rdma.cpp; see describe_rdma_ports()).
[[nodiscard]] std::vector<std::string> rdma_port_descriptions();
/// 64 bits from std::random_device (nonces, initial PSNs): unguessable, not for hot paths.
[[nodiscard]] std::uint64_t random_u64();

}  // namespace tessera::transport::bulk::detail
