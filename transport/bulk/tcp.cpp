#include "transport/bulk/backends.hpp"

namespace tessera::transport::bulk::detail {

result<std::unique_ptr<link_setup>> prepare_tcp_link(const link_options&) {
  return make_error(errc::unsupported, "bulk backend tcp: not implemented yet");
}

}  // namespace tessera::transport::bulk::detail
