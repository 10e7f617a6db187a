// Host-side tests of the rdma backend's pure parts (GID choice, timeouts, chunking) and of its
// behaviour on a machine without the named device. The verbs themselves are tested for real inside
// the Soft-RoCE VM: rdma_vm_test.cpp.
#include <gtest/gtest.h>

#include "transport/bulk/link.hpp"
#include "transport/bulk/rdma.hpp"

namespace tessera::transport::bulk::rdma {
namespace {

gid_entry make_gid(std::uint32_t index, std::uint32_t type, std::array<std::uint8_t, 16> raw) {
  gid_entry g;
  g.index = index;
  g.type = type;
  g.gid = raw;
  return g;
}

const std::array<std::uint8_t, 16> link_local{0xfe, 0x80, 0, 0, 0, 0, 0, 0,
                                              0x1c, 0x4e, 0x79, 0xff, 0xfe, 0x47, 0x31, 0x30};
const std::array<std::uint8_t, 16> v4_mapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15};
const std::array<std::uint8_t, 16> global6{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};

TEST(rdma_gid, empty_table_is_not_found_with_a_hint) {
  auto r = pick_gid({}, /*ethernet=*/true);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::not_found);
  EXPECT_NE(r.error().message.find("RoCE v2"), std::string::npos) << r.error().message;
}

TEST(rdma_gid, link_local_and_roce_v1_only_is_not_found) {
  std::vector<gid_entry> gids{make_gid(0, gid_type_roce_v2, link_local),
                              make_gid(1, gid_type_roce_v1, v4_mapped)};
  auto r = pick_gid(gids, true);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::not_found);
}

TEST(rdma_gid, prefers_ipv4_mapped_roce_v2_over_link_local_and_v1) {
  // The rxe layout in Debian 12's kernel: index 0 link-local, index 1 the IPv4-mapped address.
  std::vector<gid_entry> gids{make_gid(0, gid_type_roce_v2, link_local),
                              make_gid(1, gid_type_roce_v1, v4_mapped),
                              make_gid(2, gid_type_roce_v2, global6),
                              make_gid(3, gid_type_roce_v2, v4_mapped)};
  auto r = pick_gid(gids, true);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(*r, 3u);
}

// Two addressed netdevs under RDMA devices: the GID of the node's advertised address, the one
// peers were told (mesh/node/advertise.hpp), not the first IPv4-mapped entry.
TEST(rdma_gid, prefers_the_advertised_address) {
  const std::array<std::uint8_t, 16> other{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 9, 9, 9};
  std::vector<gid_entry> gids{make_gid(1, gid_type_roce_v2, other),
                              make_gid(3, gid_type_roce_v1, v4_mapped),
                              make_gid(4, gid_type_roce_v2, v4_mapped)};
  auto r = pick_gid(gids, true, "10.0.2.15");
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(*r, 4u);
  auto none = pick_gid(gids, true, "192.0.2.1");  // no GID of it: the first IPv4-mapped entry
  ASSERT_TRUE(none) << none.error().describe();
  EXPECT_EQ(*none, 1u);
}

TEST(rdma_gid, falls_back_to_global_ipv6_roce_v2) {
  std::vector<gid_entry> gids{make_gid(0, gid_type_roce_v2, link_local),
                              make_gid(5, gid_type_roce_v2, global6)};
  auto r = pick_gid(gids, true);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(*r, 5u);
}

TEST(rdma_gid, infiniband_uses_index_zero) {
  std::vector<gid_entry> gids{make_gid(0, gid_type_ib, link_local)};
  auto r = pick_gid(gids, /*ethernet=*/false);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, 0u);
  EXPECT_FALSE(pick_gid(std::vector<gid_entry>{make_gid(1, gid_type_ib, link_local)}, false));
}

TEST(rdma_gid, classification_and_text) {
  EXPECT_TRUE(make_gid(0, 2, v4_mapped).ipv4_mapped());
  EXPECT_FALSE(make_gid(0, 2, v4_mapped).link_local());
  EXPECT_TRUE(make_gid(0, 2, link_local).link_local());
  EXPECT_FALSE(make_gid(0, 2, global6).ipv4_mapped());
  EXPECT_EQ(format_gid(v4_mapped), "::ffff:10.0.2.15");
  EXPECT_EQ(format_gid(std::vector<std::uint8_t>(3)), "<gid of 3 bytes>");
}

TEST(rdma_timeouts, retry_budget_tracks_peer_timeout_and_is_clamped) {
  using std::chrono::milliseconds;
  // 8 tries of 4.096 us * 2^t must not exceed the budget, and t+1 would.
  for (auto budget : {milliseconds(100), milliseconds(1000), milliseconds(10'000)}) {
    const std::uint8_t t = ack_timeout_exponent(budget, 7);
    const double per_try_ms = 4.096e-3 * static_cast<double>(1u << t);
    EXPECT_LE(per_try_ms * 8, static_cast<double>(budget.count())) << int(t);
    EXPECT_GT(2 * per_try_ms * 8, static_cast<double>(budget.count())) << int(t);
  }
  EXPECT_EQ(ack_timeout_exponent(milliseconds(0), 7), 10);        // never 0 (= wait forever)
  EXPECT_EQ(ack_timeout_exponent(milliseconds(1'000'000), 7), 22);
}

TEST(rdma_chunks, writes_split_at_the_device_message_limit) {
  constexpr std::uint64_t mib = 1 << 20;
  EXPECT_EQ(chunk_count(0, 8 * mib), 1u);
  EXPECT_EQ(chunk_count(1, 8 * mib), 1u);
  EXPECT_EQ(chunk_count(8 * mib, 8 * mib), 1u);
  EXPECT_EQ(chunk_count(8 * mib + 1, 8 * mib), 2u);
  EXPECT_EQ(chunk_count(1ull << 30, 8 * mib), 128u);
}

TEST(rdma_prepare, unknown_device_is_refused_by_name) {
  link_options options;
  options.rdma_device = "no_such_rdma_device";
  auto setup = prepare_link(backend_kind::rdma, options);
  ASSERT_FALSE(setup);
  // not_found on a host with devices, unsupported on one without any.
  EXPECT_TRUE(setup.error().code == errc::not_found || setup.error().code == errc::unsupported)
      << setup.error().describe();
  EXPECT_NE(setup.error().message.find("device"), std::string::npos) << setup.error().message;
}

TEST(rdma_prepare, zero_limits_are_invalid) {
  link_options options;
  options.limits.max_outstanding = 0;
  auto setup = prepare_link(backend_kind::rdma, options);
  ASSERT_FALSE(setup);
  EXPECT_EQ(setup.error().code, errc::invalid_argument) << setup.error().describe();
}

TEST(rdma_devices, listing_never_fails_without_hardware) {
  auto devices = list_devices();
  ASSERT_TRUE(devices) << devices.error().describe();
  for (const auto& d : *devices) EXPECT_FALSE(d.name.empty());
  // One description per active port (none on a host without RDMA).
  std::size_t active = 0;
  for (const auto& d : *devices)
    for (const auto& p : d.ports) active += p.active ? 1 : 0;
  EXPECT_EQ(bulk::describe_rdma_ports().size(), active);
}

}  // namespace
}  // namespace tessera::transport::bulk::rdma
