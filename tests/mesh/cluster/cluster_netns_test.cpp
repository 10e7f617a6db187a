// Partition 2 | 3 for real: five `tessera node` processes, each in its own network namespace on a
// bridge (tests/support/netns_lab). The cut is made with blackhole routes in each namespace
// towards the other side's addresses (no iptables on the CI image); heal deletes them.
#include <chrono>
#include <cstdio>

#include <gtest/gtest.h>

#include "tests/mesh/cluster/cluster_fixture.hpp"
#include "tests/support/netns_lab.hpp"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;

result<void> set_routes(const netns_lab& lab, const std::vector<std::size_t>& a,
                        const std::vector<std::size_t>& b, const char* verb) {
  for (auto i : a)
    for (auto j : b) {
      for (auto [from, to] : {std::pair{i, j}, std::pair{j, i}}) {
        auto r = run_command({"ip", "netns", "exec", lab.member(from), "ip", "route", verb,
                              "blackhole", netns_lab::address(to) + "/32"});
        if (!r) return r.error();
      }
    }
  return ok();
}

TEST(ClusterNetns, PartitionTwoThreeThenHeal) {
  if (auto why = netns_lab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  auto lab = netns_lab::create(5);
  ASSERT_TRUE(lab.has_value()) << lab.error().describe();
  std::vector<std::string> hosts, spaces;
  for (std::size_t i = 0; i < 5; ++i) {
    hosts.push_back(netns_lab::address(i));
    spaces.push_back(lab->member(i));
  }
  auto c = cluster_fixture::create(TESSERA_BINARY, 5, hosts, spaces);
  ASSERT_TRUE(c.has_value()) << c.error().describe();
  for (std::size_t i = 0; i < 5; ++i)
    ASSERT_TRUE(c->start(i).has_value());
  std::string leader, why;
  ASSERT_TRUE(wait_until(
      [&] {
        return c->converged({0, 1, 2, 3, 4}, &leader, &why);
      },
      60s))
      << why << "\n"
      << c->logs();

  const std::vector<std::size_t> minority{0, 1}, majority{2, 3, 4};
  ASSERT_TRUE(set_routes(*lab, minority, majority, "add").has_value());
  const auto t0 = std::chrono::steady_clock::now();
  std::string maj_leader;
  ASSERT_TRUE(wait_until(
      [&] {
        for (auto i : minority) {
          auto s = c->status(i);
          if (!s || !s->at("node").at("leader").is_null()) return false;
        }
        std::optional<std::string> l;
        for (auto i : majority) {
          auto s = c->status(i);
          if (!s || s->at("node").at("leader").is_null()) return false;
          auto x = s->at("node").at("leader").get<std::string>();
          if (l && *l != x) return false;
          l = x;
        }
        maj_leader = *l;
        return c->node_id(2) == *l || c->node_id(3) == *l || c->node_id(4) == *l;
      },
      30s))
      << c->logs();
  std::printf("[cluster-netns] partition 2|3: minority leaderless, majority led after %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  ASSERT_TRUE(set_routes(*lab, minority, majority, "del").has_value());
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_until(
      [&] {
        return c->converged({0, 1, 2, 3, 4}, &leader, &why);
      },
      60s))
      << why << "\n"
      << c->logs();
  std::printf("[cluster-netns] heal: one leader, one view after %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
}

}  // namespace
}  // namespace tessera::test
