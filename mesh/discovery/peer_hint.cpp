#include "mesh/discovery/peer_hint.hpp"

#include <charconv>

namespace tessera::mesh {

std::string endpoint::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

result<endpoint> parse_endpoint(std::string_view text) {
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return make_error(errc::invalid_argument, "'{}': expected [ipv6]:port", text);
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return make_error(errc::invalid_argument, "'{}': expected host:port", text);
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return make_error(errc::invalid_argument, "'{}': an IPv6 host needs brackets: [addr]:port",
                        text);
    }
  }
  if (host.empty() || host.size() > max_host_bytes) {
    return make_error(errc::invalid_argument, "'{}': host must be 1..{} characters", text,
                      max_host_bytes);
  }
  for (char c : host) {
    bool okc = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
    if (!okc) return make_error(errc::invalid_argument, "'{}': bad character in host", text);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || ptr != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return make_error(errc::invalid_argument, "'{}': port must be a number 1..65535", text);
  }
  return endpoint{std::string(host), static_cast<std::uint16_t>(port)};
}

const char* to_string(hint_source s) noexcept {
  switch (s) {
    case hint_source::mdns:
      return "mdns";
    case hint_source::beacon:
      return "beacon";
    case hint_source::seed:
      return "seed";
  }
  return "unknown";
}

bool is_node_id_text(std::string_view id) noexcept {
  if (id.size() != 32) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool is_cluster_id_text(std::string_view id) noexcept {
  if (id.empty() || id.size() > max_cluster_id_bytes) return false;
  for (char c : id) {
    if (c <= ' ' || c > '~' || c == '=' || c == ',') return false;
  }
  return true;
}

}  // namespace tessera::mesh
