// faulty_link over real tcp and shm links. Failure paths first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "transport/faults/faulty_link.hpp"

namespace {

using namespace tessera;
using namespace tessera::transport;
using namespace tessera::transport::faults;
using bulk::completion;
using bulk::completion_kind;
using namespace std::chrono_literals;

constexpr auto patience = 30s;

struct decorated_pair {
  std::shared_ptr<fault_injector> faults;
  std::unique_ptr<faulty_link> a;  // node "a"
  std::unique_ptr<bulk::link> b;   // node "b", undecorated: faults apply to a -> b
};

decorated_pair make_pair(bulk::backend_kind kind, std::uint32_t max_outstanding = 16,
                         partition_mode mode = partition_mode::vanish) {
  bulk::link_options o;
  o.limits.max_outstanding = max_outstanding;
  o.limits.max_received = 16;
  auto sa = bulk::prepare_link(kind, o);
  auto sb = bulk::prepare_link(kind, o);
  TESSERA_ASSERT(sa && sb, "prepare_link failed");
  result<std::unique_ptr<bulk::link>> lb = error{};
  std::thread t([&] { lb = (*sb)->connect((*sa)->local_params()); });
  auto la = (*sa)->connect((*sb)->local_params());
  t.join();
  TESSERA_ASSERT(la && lb, "connect failed");
  decorated_pair p;
  p.faults = std::make_shared<fault_injector>(77);
  p.a = std::make_unique<faulty_link>(std::move(*la), p.faults, "a", "b", mode);
  p.b = std::move(*lb);
  return p;
}

completion next(bulk::link& l) {
  completion c[1];
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (std::chrono::steady_clock::now() < deadline) {
    auto n = l.wait(c, 100ms);
    if (!n) {
      ADD_FAILURE() << n.error().describe();
      return {};
    }
    if (*n == 1) return std::move(c[0]);
  }
  ADD_FAILURE() << "no completion";
  return {};
}

completion next_of(bulk::link& l, completion_kind kind) {
  for (;;) {
    completion c = next(l);
    if (c.kind == kind || c.kind == completion_kind::link_down) return c;
  }
}

std::vector<std::byte> msg(std::uint32_t v) {
  std::vector<std::byte> m(4);
  std::memcpy(m.data(), &v, 4);
  return m;
}

std::uint32_t value(const completion& c) {
  std::uint32_t v = 0;
  if (c.data.size() == 4) std::memcpy(&v, c.data.data(), 4);
  return v;
}

void apply_cmd(fault_injector& f, const char* text) {
  auto c = parse_fault_command(text);
  ASSERT_TRUE(c) << c.error().describe();
  ASSERT_TRUE(f.apply(*c));
}

class faulty_link_test : public ::testing::TestWithParam<bulk::backend_kind> {};

// Every split group's link in a node is decorated, faults or not: while none is in force the
// decorator is out of the way — no timer thread, the caller's own wr_ids on its completions, a
// list posted as one — and a fault set later still applies, and after `clear` it is free again.
TEST_P(faulty_link_test, without_a_fault_in_force_traffic_passes_straight_through) {
  auto p = make_pair(GetParam());
  for (std::uint32_t i = 0; i < 3; ++i)
    ASSERT_TRUE(p.a->send(msg(i), 100 + i));
  for (std::uint32_t i = 0; i < 3; ++i) {
    auto c = next_of(*p.a, completion_kind::send_done);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c.wr_id, 100 + i);
    EXPECT_EQ(value(next_of(*p.b, completion_kind::send_received)), i);
  }
  EXPECT_FALSE(p.a->has_timer_thread());
  // A delay set now applies to the next message, and brings the timer thread.
  apply_cmd(*p.faults, "delay a->b 50ms");
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(p.a->send(msg(7), 7));
  EXPECT_EQ(value(next_of(*p.b, completion_kind::send_received)), 7u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 45ms);
  EXPECT_EQ(next_of(*p.a, completion_kind::send_done).wr_id, 7u);
  EXPECT_TRUE(p.a->has_timer_thread());
  // Cleared while a message is still held: it is delivered, and so is everything after it.
  apply_cmd(*p.faults, "delay a->b 200ms");
  ASSERT_TRUE(p.a->send(msg(8), 8));
  apply_cmd(*p.faults, "clear");
  ASSERT_TRUE(p.a->send(msg(9), 9));
  std::vector<std::uint32_t> got{value(next_of(*p.b, completion_kind::send_received)),
                                 value(next_of(*p.b, completion_kind::send_received))};
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::uint32_t>{8, 9}));
  std::vector<std::uint64_t> done;
  for (int i = 0; i < 2; ++i)
    done.push_back(next_of(*p.a, completion_kind::send_done).wr_id);
  std::sort(done.begin(), done.end());
  EXPECT_EQ(done, (std::vector<std::uint64_t>{8, 9}));
  EXPECT_EQ(p.a->held(), 0u);
  ASSERT_TRUE(p.a->send(msg(10), 10));
  EXPECT_EQ(value(next_of(*p.b, completion_kind::send_received)), 10u);
  EXPECT_EQ(next_of(*p.a, completion_kind::send_done).wr_id, 10u);
}

TEST_P(faulty_link_test, bad_arguments_are_refused_as_without_the_decorator) {
  auto p = make_pair(GetParam());
  apply_cmd(*p.faults, "delay a->b 10s");
  std::vector<std::byte> big(p.a->limits().max_send_bytes + 1);
  auto r = p.a->send(big, 1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  auto buf = bulk::allocate_buffer(4096);
  ASSERT_TRUE(buf);
  auto h = p.a->register_buffer(*buf);
  ASSERT_TRUE(h);
  bulk::remote_buffer remote{1, 0, 1, 4096};
  auto w = p.a->write_with_imm(*h, 0, remote, 4000, 100, 1, 1);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, errc::invalid_argument);
  EXPECT_EQ(p.a->held(), 0u);
}

TEST_P(faulty_link_test, held_operations_count_against_the_outstanding_bound) {
  auto p = make_pair(GetParam(), 4);
  apply_cmd(*p.faults, "delay a->b 60s");
  for (std::uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(p.a->send(msg(i), i));
  auto r = p.a->send(msg(9), 9);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::overloaded);
  EXPECT_EQ(p.a->held(), 4u);
}

TEST_P(faulty_link_test, a_dying_inner_link_fails_held_operations_then_reports_link_down) {
  auto p = make_pair(GetParam());
  apply_cmd(*p.faults, "delay a->b 60s");
  ASSERT_TRUE(p.a->send(msg(1), 41));
  ASSERT_TRUE(p.a->send(msg(2), 42));
  p.b->close();
  completion c1 = next(*p.a);
  completion c2 = next(*p.a);
  completion c3 = next(*p.a);
  EXPECT_EQ(c1.kind, completion_kind::send_done);
  EXPECT_FALSE(c1.ok());
  EXPECT_EQ(c1.wr_id, 41u);
  EXPECT_EQ(c2.wr_id, 42u);
  EXPECT_FALSE(c2.ok());
  EXPECT_EQ(c3.kind, completion_kind::link_down);
  completion none[1];
  auto w = p.a->wait(none, 10ms);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, errc::closed);
  EXPECT_FALSE(p.a->send(msg(3), 43));
}

TEST_P(faulty_link_test, dropped_messages_complete_for_the_sender_and_never_arrive) {
  auto p = make_pair(GetParam());
  apply_cmd(*p.faults, "drop a->b 1");
  for (std::uint32_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(p.a->send(msg(i), i));
    completion done = next_of(*p.a, completion_kind::send_done);
    EXPECT_TRUE(done.ok());
    EXPECT_EQ(done.wr_id, i);
  }
  apply_cmd(*p.faults, "ok a->b");
  ASSERT_TRUE(p.a->send(msg(100), 100));
  completion first = next(*p.b);
  EXPECT_EQ(first.kind, completion_kind::send_received);
  EXPECT_EQ(value(first), 100u) << "a dropped message arrived";
}

TEST_P(faulty_link_test, a_partition_vanishes_traffic_until_healed) {
  auto p = make_pair(GetParam());
  apply_cmd(*p.faults, "partition a | b");
  ASSERT_TRUE(p.a->send(msg(1), 1));
  EXPECT_TRUE(next_of(*p.a, completion_kind::send_done).ok());
  apply_cmd(*p.faults, "heal");
  ASSERT_TRUE(p.a->send(msg(2), 2));
  EXPECT_EQ(value(next(*p.b)), 2u);
  EXPECT_TRUE(p.a->is_up());
}

TEST_P(faulty_link_test, a_partition_in_fail_mode_fails_operations_but_keeps_the_link) {
  auto p = make_pair(GetParam(), 16, partition_mode::fail);
  apply_cmd(*p.faults, "partition a -> b");
  ASSERT_TRUE(p.a->send(msg(1), 7));
  completion c = next_of(*p.a, completion_kind::send_done);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.failure->code, errc::closed);
  EXPECT_EQ(c.wr_id, 7u);
  apply_cmd(*p.faults, "heal");
  ASSERT_TRUE(p.a->send(msg(2), 8));
  EXPECT_EQ(value(next(*p.b)), 2u);
}

TEST_P(faulty_link_test, duplicated_messages_arrive_twice_and_complete_once) {
  auto p = make_pair(GetParam());
  apply_cmd(*p.faults, "duplicate a->b 1");
  for (std::uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(p.a->send(msg(i), i));
  for (std::uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(value(next(*p.b)), i);
    EXPECT_EQ(value(next(*p.b)), i);
  }
  for (std::uint32_t i = 0; i < 5; ++i) EXPECT_EQ(next_of(*p.a, completion_kind::send_done).wr_id, i);
  apply_cmd(*p.faults, "clear");
  ASSERT_TRUE(p.a->send(msg(99), 99));
  EXPECT_EQ(value(next(*p.b)), 99u);
  (void)next_of(*p.a, completion_kind::send_done);
  completion extra[2];
  EXPECT_EQ(p.a->poll(extra), 0u) << "a duplicate produced a second local completion";
}

TEST_P(faulty_link_test, delayed_and_reordered_messages_all_arrive) {
  auto p = make_pair(GetParam(), 64);
  apply_cmd(*p.faults, "delay a->b 2ms 1ms");
  apply_cmd(*p.faults, "reorder a->b 0.5 5ms");
  constexpr std::uint32_t n = 40;
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_TRUE(p.a->send(msg(i), i));
  std::vector<std::uint32_t> got;
  for (std::uint32_t i = 0; i < n; ++i) got.push_back(value(next(*p.b)));
  std::sort(got.begin(), got.end());
  for (std::uint32_t i = 0; i < n; ++i) EXPECT_EQ(got[i], i);
  for (std::uint32_t i = 0; i < n; ++i) EXPECT_TRUE(next_of(*p.a, completion_kind::send_done).ok());
}

TEST_P(faulty_link_test, a_delayed_write_lands_with_its_bytes_and_immediate) {
  auto p = make_pair(GetParam());
  apply_cmd(*p.faults, "delay a->b 3ms");
  auto src = bulk::allocate_buffer(1 << 20);
  auto dst = bulk::allocate_buffer(1 << 20);
  ASSERT_TRUE(src && dst);
  for (std::size_t i = 0; i < src->size(); ++i) src->data()[i] = static_cast<std::byte>(i * 7);
  auto hs = p.a->register_buffer(*src);
  auto hd = p.b->register_buffer(*dst);
  ASSERT_TRUE(hs && hd);
  auto remote = p.b->describe(*hd);
  ASSERT_TRUE(remote);
  ASSERT_TRUE(p.a->write_with_imm(*hs, 0, *remote, 0, src->size(), 0xabc, 5));
  completion c = next_of(*p.b, completion_kind::write_received);
  EXPECT_EQ(c.imm, 0xabcu);
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->size()), 0);
  completion done = next_of(*p.a, completion_kind::write_done);
  EXPECT_EQ(done.wr_id, 5u);
}

TEST_P(faulty_link_test, a_write_list_gives_each_write_its_own_fate_and_is_checked_whole) {
  auto p = make_pair(GetParam(), 8);
  auto src = bulk::allocate_buffer(8 * 1024);
  auto dst = bulk::allocate_buffer(8 * 1024);
  ASSERT_TRUE(src && dst);
  for (std::size_t i = 0; i < src->size(); ++i) src->data()[i] = static_cast<std::byte>(i * 13);
  auto hs = p.a->register_buffer(*src);
  auto hd = p.b->register_buffer(*dst);
  ASSERT_TRUE(hs && hd);
  auto remote = p.b->describe(*hd);
  ASSERT_TRUE(remote);
  std::vector<bulk::write_request> list;
  for (std::uint32_t i = 0; i < 4; ++i) list.push_back({*hs, i * 1024, *remote, i * 1024, 1024, i, 10 + i});
  // Refused whole while faults are on: a bad last write, then more than the bound.
  apply_cmd(*p.faults, "delay a->b 60s");
  auto bad = list;
  bad[3].local_offset = src->size() - 1000;
  auto r = p.a->post_writes(bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
  EXPECT_NE(r.error().message.find("write 3"), std::string::npos) << r.error().describe();
  bad = list;
  bad[1].local = bulk::buffer_handle{55};
  r = p.a->post_writes(bad);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("write 1"), std::string::npos) << r.error().describe();
  bad = list;
  bad.insert(bad.end(), list.begin(), list.end());
  bad.push_back(list[0]);
  r = p.a->post_writes(bad);  // 9 writes, bound 8
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
  EXPECT_EQ(p.a->held(), 0u);
  // Held: the list counts against the bound like single writes.
  ASSERT_TRUE(p.a->post_writes(list));
  EXPECT_EQ(p.a->held(), 4u);
  ASSERT_TRUE(p.a->post_writes(list));
  r = p.a->post_writes(std::span(list).first(1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::overloaded) << r.error().describe();
  // Duplicated: each write of a list lands twice and completes once.
  auto q = make_pair(GetParam(), 8);
  auto qs = q.a->register_buffer(*src);
  auto qd = q.b->register_buffer(*dst);
  ASSERT_TRUE(qs && qd);
  auto qremote = q.b->describe(*qd);
  ASSERT_TRUE(qremote);
  for (auto& w : list) {
    w.local = *qs;
    w.remote = *qremote;
  }
  apply_cmd(*q.faults, "duplicate a->b 1");
  ASSERT_TRUE(q.a->post_writes(list));
  for (std::uint32_t i = 0; i < 4; ++i) {
    for (int copy = 0; copy < 2; ++copy) {
      completion c = next_of(*q.b, completion_kind::write_received);
      EXPECT_EQ(c.imm, i);
    }
  }
  for (std::uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(next_of(*q.a, completion_kind::write_done).wr_id, 10u + i);
  }
  completion extra[2];
  EXPECT_EQ(q.a->poll(extra), 0u) << "a duplicate produced a second local completion";
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 4 * 1024), 0);
}

TEST_P(faulty_link_test, the_same_seed_loses_the_same_messages_on_a_real_link) {
  // Two independent link pairs under the same seed and rule: exactly the same messages arrive.
  // b drains as a goes (its receive queue is bounded; a receiver that never polls holds the
  // sender back and, after peer_timeout_ms, takes the link down).
  auto delivered = [&](std::vector<std::uint32_t>& got) {
    auto p = make_pair(GetParam(), 64);
    apply_cmd(*p.faults, "drop a->b 0.5");
    bool marker = false;
    auto drain = [&] {
      completion c[8];
      const std::size_t n = p.b->poll(c);
      for (std::size_t k = 0; k < n; ++k) {
        const std::uint32_t v = value(c[k]);
        if (v == 1000) marker = true;
        else got.push_back(v);
      }
    };
    for (std::uint32_t i = 0; i < 60; ++i) {
      auto r = p.a->send(msg(i), i);
      ASSERT_TRUE(r) << r.error().describe();
      (void)next_of(*p.a, completion_kind::send_done);
      drain();
    }
    apply_cmd(*p.faults, "clear");
    ASSERT_TRUE(p.a->send(msg(1000), 1000));  // end marker, never dropped
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!marker && std::chrono::steady_clock::now() < deadline) drain();
    EXPECT_TRUE(marker);
  };
  std::vector<std::uint32_t> first, second;
  delivered(first);
  delivered(second);
  EXPECT_EQ(first, second);
  EXPECT_GT(first.size(), 10u);  // seed 77 at p = 0.5: some arrive ...
  EXPECT_LT(first.size(), 50u);  // ... and some are lost
}

INSTANTIATE_TEST_SUITE_P(host, faulty_link_test,
                         ::testing::Values(bulk::backend_kind::tcp, bulk::backend_kind::shm),
                         [](const auto& param_info) {
                           return std::string(bulk::to_string(param_info.param));
                         });

}  // namespace
