// The fault layer (transport/faults) on control frames, switched at run time by fault.set /
// fault.clear messages between authenticated nodes.
#include <gtest/gtest.h>

#include "tests/transport/control/test_support.hpp"
#include "transport/control/control_node.hpp"
#include "transport/control/fault_adapter.hpp"

namespace tessera::transport::control {
namespace {

using test::config;
using test::inbox;
using test::int_body;
using test::kPing;
using test::wait_for;

faults::fault_command parsed(std::string_view text) {
  auto c = faults::parse_fault_command(text);
  EXPECT_TRUE(c.has_value()) << text;
  return *c;
}

struct faulty_pair {
  std::shared_ptr<faults::fault_injector> injector = std::make_shared<faults::fault_injector>(42);
  inbox in_a, in_b;
  std::unique_ptr<control_node> a, b;
  faulty_pair() {
    const auto keys = test::keys_from(41);
    auto ca = config("a", keys, 800);
    auto cb = config("b", keys, 800);
    ca.faults = make_fault_hooks(injector, "a");
    cb.faults = make_fault_hooks(injector, "b");
    a = std::move(*control_node::start(ca, in_a.handlers()));
    b = std::move(*control_node::start(cb, in_b.handlers()));
    EXPECT_TRUE(a->add_peer("b", b->endpoint()).has_value());
    EXPECT_TRUE(b->add_peer("a", a->endpoint()).has_value());
  }
};

TEST(control_faults_test, a_malformed_fault_command_is_refused_and_counted) {
  faulty_pair p;
  const auto junk = int_body(3);
  ASSERT_TRUE(p.b->send("a", msg_type::fault_set, as_bytes(junk)).has_value());
  ASSERT_TRUE(wait_for([&] { return p.a->stats().fault_commands_refused == 1; }));
  EXPECT_EQ(p.a->stats().fault_commands, 0u);
}

TEST(control_faults_test, a_partition_sent_over_the_control_plane_takes_peers_down_and_heal_restores) {
  faulty_pair p;
  ASSERT_TRUE(wait_for([&] { return p.in_a.count_events(peer_event_kind::up, "b") >= 1; }));
  ASSERT_TRUE(wait_for([&] { return p.in_b.count_events(peer_event_kind::up, "a") >= 1; }));
  // b tells a (the injector is shared here, as in the simulator; on a live cluster every node
  // receives the command and applies its own outgoing direction).
  const auto cut = encode_fault_command(parsed("partition a | b"));
  ASSERT_TRUE(p.b->send("a", msg_type::fault_set, as_bytes(cut)).has_value());
  ASSERT_TRUE(wait_for([&] { return p.a->stats().fault_commands == 1; }));
  ASSERT_TRUE(wait_for([&] { return p.in_a.count_events(peer_event_kind::down, "b") >= 1; }));
  ASSERT_TRUE(wait_for([&] { return p.in_b.count_events(peer_event_kind::down, "a") >= 1; }));
  const auto body = int_body(5);
  ASSERT_TRUE(p.a->send("b", kPing, as_bytes(body)).has_value());
  // Once it has left a's queue it has been judged (under the cut: lost).
  ASSERT_TRUE(wait_for([&] { return p.a->peers().at(0).queued == 0; }));
  // Heal directly on the injector: a fault.set could not cross the cut either.
  ASSERT_TRUE(p.injector->apply(parsed("heal")).has_value());
  ASSERT_TRUE(wait_for([&] { return p.in_a.count_events(peer_event_kind::up, "b") >= 2; }));
  ASSERT_TRUE(wait_for([&] { return p.in_b.count_events(peer_event_kind::up, "a") >= 2; }));
  const auto body2 = int_body(6);
  ASSERT_TRUE(p.a->send("b", kPing, as_bytes(body2)).has_value());
  ASSERT_TRUE(wait_for([&] { return p.in_b.message_count() == 1; }));
  EXPECT_EQ(test::body_int(p.in_b.messages()[0].body), 6);
  EXPECT_GE(p.a->stats().fault_dropped, 1u);
}

TEST(control_faults_test, seeded_duplicates_and_delays_are_absorbed_by_sequence_numbers) {
  faulty_pair p;
  ASSERT_TRUE(p.injector->apply(parsed("duplicate a->b 1")).has_value());
  auto reorder = parsed("reorder a->b 0.3 20ms");
  reorder.two_way = false;
  ASSERT_TRUE(p.injector->apply(reorder).has_value());
  constexpr int kCount = 100;
  for (int i = 0; i < kCount; ++i) {
    const auto body = int_body(i);
    ASSERT_TRUE(p.a->send("b", kPing, as_bytes(body)).has_value());
  }
  // Every frame arrives twice, some late: each is delivered at most once and in order. A frame
  // overtaken while held back counts as missing when its successor arrives and is then dropped
  // (both copies) as late; every other frame loses only its second copy.
  auto settled = [&] {
    auto s = p.b->stats();
    return s.messages_delivered + s.frames_missing == kCount &&
           s.duplicates_dropped == kCount + s.frames_missing;
  };
  ASSERT_TRUE(wait_for(settled)) << "delivered " << p.b->stats().messages_delivered << ", missing "
                                 << p.b->stats().frames_missing << ", duplicates "
                                 << p.b->stats().duplicates_dropped;
  auto m = p.in_b.messages();
  for (std::size_t i = 1; i < m.size(); ++i) {
    EXPECT_LT(test::body_int(m[i - 1].body), test::body_int(m[i].body));
  }
  EXPECT_GE(p.a->stats().fault_duplicated, static_cast<std::uint64_t>(kCount));
  EXPECT_GE(p.a->stats().fault_delayed, 1u);
}

}  // namespace
}  // namespace tessera::transport::control
