// The gateway's listening socket: a port another process (or gateway) holds is refused, not
// shared (cpp-httplib's default SO_REUSEPORT let two nodes take turns answering one port).
#include <gtest/gtest.h>

#include "mesh/http/gateway.hpp"

namespace tessera::mesh::http {
namespace {

gateway_options options(std::uint16_t port) {
  gateway_options o;
  o.bind_address = "127.0.0.1";
  o.port = port;
  o.peers.push_back(serving::peer_endpoint{"127.0.0.1", 1, 2});
  o.status = [] { return nlohmann::json::object(); };
  return o;
}

TEST(GatewayBind, ATakenPortIsRefusedNamingIt) {
  auto first = gateway::start(options(0));
  ASSERT_TRUE(first.has_value()) << first.error().describe();
  const auto port = (*first)->port();
  auto second = gateway::start(options(port));
  ASSERT_FALSE(second.has_value()) << "two gateways share port " << port;
  EXPECT_NE(second.error().message.find(std::to_string(port)), std::string::npos)
      << second.error().message;
  (*first)->stop(0);
  // Free again once the first is gone.
  auto third = gateway::start(options(port));
  EXPECT_TRUE(third.has_value()) << third.error().describe();
}

}  // namespace
}  // namespace tessera::mesh::http
