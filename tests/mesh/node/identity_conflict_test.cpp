#include "mesh/node/identity_conflict.hpp"

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

const node_id same{1, 2};

node_instance inst(std::string ep, std::int64_t started, std::uint64_t nonce, node_id id = same) {
  return {id, std::move(ep), started, nonce};
}

TEST(identity_conflict, another_node_id_is_unrelated) {
  auto self = inst("10.0.0.1:7400", 100, 7);
  EXPECT_EQ(judge_identity(self, inst("10.0.0.2:7400", 50, 7, node_id{9, 9})),
            identity_verdict::unrelated);
}

TEST(identity_conflict, own_announcement_heard_back_is_ignored) {
  auto self = inst("10.0.0.1:7400", 100, 7);
  // Even via another address of ours (mDNS may resolve a different interface).
  EXPECT_EQ(judge_identity(self, inst("192.168.1.5:7400", 100, 7)), identity_verdict::own_echo);
}

TEST(identity_conflict, older_record_at_our_endpoint_is_a_stale_run_of_ourselves) {
  auto self = inst("10.0.0.1:7400", 100, 7);
  EXPECT_EQ(judge_identity(self, inst("10.0.0.1:7400", 40, 3)), identity_verdict::stale_self);
}

TEST(identity_conflict, the_later_of_two_live_duplicates_refuses_and_both_sides_agree) {
  auto early = inst("10.0.0.1:7400", 100, 7);
  auto late = inst("10.0.0.2:7400", 200, 3);
  EXPECT_EQ(judge_identity(early, late), identity_verdict::peer_must_yield);
  EXPECT_EQ(judge_identity(late, early), identity_verdict::we_must_refuse);
}

TEST(identity_conflict, equal_start_times_are_broken_by_the_nonce_on_both_sides) {
  auto a = inst("10.0.0.1:7400", 100, 5);
  auto b = inst("10.0.0.2:7400", 100, 9);
  EXPECT_EQ(judge_identity(a, b), identity_verdict::peer_must_yield);
  EXPECT_EQ(judge_identity(b, a), identity_verdict::we_must_refuse);
}

TEST(identity_conflict, a_later_process_at_our_own_endpoint_is_a_duplicate_not_stale) {
  // Same endpoint string on two hosts (e.g. both announce 0.0.0.0 or a NATed address): the
  // endpoint alone must not let a newer duplicate pass as "stale".
  auto self = inst("10.0.0.1:7400", 100, 7);
  EXPECT_EQ(judge_identity(self, inst("10.0.0.1:7400", 300, 8)), identity_verdict::peer_must_yield);
}

}  // namespace
}  // namespace tessera::mesh
