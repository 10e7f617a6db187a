#include "tests/transport/bulk/support.hpp"

namespace tessera::transport::bulk::testing {

link_options default_options(backend_kind kind) {
  link_options o;
  o.limits.max_buffers = 8;
  o.limits.max_outstanding = 16;
  o.limits.max_send_bytes = 64 * 1024;
  o.limits.max_received = 16;
  o.connect_timeout_ms = std::chrono::milliseconds(20'000);
  o.peer_timeout_ms = std::chrono::milliseconds(20'000);
  // A backend that needs more (e.g. rdma: a device name from the environment) adds it here.
  if (kind == backend_kind::rdma) {
    // rdma finds a silent dead peer by an idle keepalive (every peer_timeout/4) whose retries
    // last about peer_timeout: keep the sum well inside the tests' patience.
    o.peer_timeout_ms = std::chrono::milliseconds(3'000);
  }
  return o;
}

std::string to_hex(const std::vector<std::byte>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    s += digits[std::to_integer<unsigned>(b) >> 4];
    s += digits[std::to_integer<unsigned>(b) & 15];
  }
  return s;
}

std::vector<std::byte> from_hex(const std::string& text) {
  std::vector<std::byte> out;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i + 1 < text.size(); i += 2) {
    const int hi = val(text[i]), lo = val(text[i + 1]);
    if (hi < 0 || lo < 0) return {};
    out.push_back(static_cast<std::byte>(hi * 16 + lo));
  }
  return out;
}

}  // namespace tessera::transport::bulk::testing
