// The bulk-link conformance suite (see conformance_suite.hpp for how a backend instantiates it).
// Failure paths first: bounds and bad input, then link death, then the happy paths.
#include "tests/transport/bulk/conformance_suite.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>


namespace tessera::transport::bulk::testing {

std::string backend_name(const ::testing::TestParamInfo<backend_kind>& info) {
  return std::string(to_string(info.param));
}

result<link_pair> connect_pair(backend_kind kind, const link_options& a_options,
                               const link_options& b_options) {
  auto sa = prepare_link(kind, a_options);
  if (!sa) return std::move(sa).error();
  auto sb = prepare_link(kind, b_options);
  if (!sb) return std::move(sb).error();
  const connect_params pa = (*sa)->local_params();
  const connect_params pb = (*sb)->local_params();
  result<std::unique_ptr<bulk::link>> lb = error{};
  std::thread t([&] { lb = (*sb)->connect(pa); });
  auto la = (*sa)->connect(pb);
  t.join();
  if (!la) return std::move(la).error();
  if (!lb) return std::move(lb).error();
  return link_pair{std::move(*la), std::move(*lb)};
}

completion next_completion(link& l) {
  completion c[1];
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (std::chrono::steady_clock::now() < deadline) {
    auto n = l.wait(c, std::chrono::milliseconds(100));
    if (!n) {
      ADD_FAILURE() << "wait failed: " << n.error().describe();
      return {};
    }
    if (*n == 1) return std::move(c[0]);
  }
  ADD_FAILURE() << "no completion within " << patience.count() << " s";
  return {};
}

completion wait_for_kind(link& l, completion_kind kind) {
  for (;;) {
    completion c = next_completion(l);
    if (c.kind == kind) return c;
    if (c.kind == completion_kind::link_down) {
      ADD_FAILURE() << "link went down while waiting for " << to_string(kind) << ": "
                    << (c.failure ? c.failure->describe() : "?");
      return c;
    }
  }
}

std::vector<completion> collect(link& l, const std::vector<completion_kind>& wanted) {
  std::vector<completion> got(wanted.size());
  std::vector<bool> have(wanted.size(), false);
  std::size_t missing = wanted.size();
  const auto deadline = std::chrono::steady_clock::now() + patience;
  completion c[4];
  while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
    auto n = l.wait(c, std::chrono::milliseconds(100));
    if (!n) {
      ADD_FAILURE() << "wait failed: " << n.error().describe();
      return got;
    }
    for (std::size_t i = 0; i < *n; ++i) {
      if (c[i].kind == completion_kind::link_down) {
        ADD_FAILURE() << "link went down: " << (c[i].failure ? c[i].failure->describe() : "?");
        return got;
      }
      for (std::size_t k = 0; k < wanted.size(); ++k) {
        if (!have[k] && wanted[k] == c[i].kind) {
          got[k] = std::move(c[i]);
          have[k] = true;
          --missing;
          break;
        }
      }
    }
  }
  if (missing > 0) ADD_FAILURE() << missing << " completions did not arrive within patience";
  return got;
}

completion wait_for_down(link& l) {
  completion c[4];
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (std::chrono::steady_clock::now() < deadline) {
    auto n = l.wait(c, std::chrono::milliseconds(100));
    if (!n) {
      ADD_FAILURE() << "wait failed before link_down was delivered: " << n.error().describe();
      return {};
    }
    for (std::size_t i = 0; i < *n; ++i) {
      if (c[i].kind == completion_kind::link_down) return std::move(c[i]);
    }
  }
  ADD_FAILURE() << "link_down did not arrive within " << patience.count() << " s";
  return {};
}

}  // namespace tessera::transport::bulk::testing

namespace {

using namespace tessera;
using namespace tessera::transport::bulk;
using namespace tessera::transport::bulk::testing;
namespace bulk = tessera::transport::bulk;

link_pair must_connect(backend_kind kind, const link_options& o) {
  auto p = connect_pair(kind, o, o);
  if (!p) {
    ADD_FAILURE() << "connect_pair(" << to_string(kind) << "): " << p.error().describe();
    return {};
  }
  return std::move(*p);
}

shared_buffer must_allocate(std::size_t size) {
  auto b = allocate_buffer(size);
  TESSERA_ASSERT(b.has_value(), "allocate_buffer: {}", b.error().describe());
  return std::move(*b);
}

void fill_pattern(std::span<std::byte> s, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : s) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
}

// A registered source (a) and target (b) pair of buffers with the target's descriptor.
struct write_setup {
  shared_buffer src;
  shared_buffer dst;
  buffer_handle src_handle;
  buffer_handle dst_handle;
  remote_buffer dst_remote;
};

write_setup make_write_setup(link_pair& p, std::size_t size) {
  write_setup w{must_allocate(size), must_allocate(size), {}, {}, {}};
  auto hs = p.a->register_buffer(w.src);
  auto hd = p.b->register_buffer(w.dst);
  EXPECT_TRUE(hs && hd);
  if (!hs || !hd) return w;
  w.src_handle = *hs;
  w.dst_handle = *hd;
  auto d = p.b->describe(w.dst_handle);
  EXPECT_TRUE(d) << (d ? "" : d.error().describe());
  if (d) w.dst_remote = *d;
  return w;
}

// ---------------------------------------------------------------------------------------------
// Set-up failures

TEST_P(bulk_conformance, connect_refuses_params_of_another_backend) {
  auto s = prepare_link(kind(), options());
  ASSERT_TRUE(s) << s.error().describe();
  connect_params other = (*s)->local_params();
  other.backend = static_cast<std::uint8_t>(kind() == backend_kind::tcp ? backend_kind::shm
                                                                        : backend_kind::tcp);
  auto l = (*s)->connect(other);
  ASSERT_FALSE(l);
  EXPECT_EQ(l.error().code, errc::invalid_argument) << l.error().describe();
}

TEST_P(bulk_conformance, connect_times_out_when_the_peer_never_comes) {
  auto o = options();
  o.connect_timeout_ms = std::chrono::milliseconds(300);
  auto sa = prepare_link(kind(), o);
  auto sb = prepare_link(kind(), o);
  ASSERT_TRUE(sa && sb);
  // b's params are real, but b never calls connect().
  auto l = (*sa)->connect((*sb)->local_params());
  ASSERT_FALSE(l);
  EXPECT_TRUE(l.error().code == errc::timeout || l.error().code == errc::closed)
      << l.error().describe();
}

TEST_P(bulk_conformance, connect_with_a_tampered_nonce_fails_on_both_sides) {
  auto o = options();
  o.connect_timeout_ms = std::chrono::milliseconds(1000);
  auto sa = prepare_link(kind(), o);
  auto sb = prepare_link(kind(), o);
  ASSERT_TRUE(sa && sb);
  connect_params forged_b = (*sb)->local_params();
  forged_b.nonce ^= 0x5a5a5a5a5a5a5a5aull;
  result<std::unique_ptr<bulk::link>> lb = error{};
  std::thread t([&] { lb = (*sb)->connect((*sa)->local_params()); });
  auto la = (*sa)->connect(forged_b);
  t.join();
  EXPECT_FALSE(la && lb) << "a link came up although a's view of b's nonce was forged";
}

// ---------------------------------------------------------------------------------------------
// Bounds

TEST_P(bulk_conformance, too_many_buffers_is_refused_and_a_freed_slot_is_reused) {
  auto o = options();
  auto p = must_connect(kind(), o);
  ASSERT_TRUE(p.a);
  std::vector<shared_buffer> bufs;
  std::vector<buffer_handle> handles;
  for (std::uint32_t i = 0; i < p.a->limits().max_buffers; ++i) {
    bufs.push_back(must_allocate(4096));
    auto h = p.a->register_buffer(bufs.back());
    ASSERT_TRUE(h) << h.error().describe();
    handles.push_back(*h);
  }
  auto extra_buf = must_allocate(4096);
  auto extra = p.a->register_buffer(extra_buf);
  ASSERT_FALSE(extra);
  EXPECT_EQ(extra.error().code, errc::no_capacity) << extra.error().describe();
  ASSERT_TRUE(p.a->deregister_buffer(handles[3]));
  auto again = p.a->register_buffer(extra_buf);
  ASSERT_TRUE(again) << again.error().describe();
  // A freed handle is no longer valid for anything.
  auto stale = p.a->deregister_buffer(buffer_handle{0});
  EXPECT_FALSE(stale);
}

TEST_P(bulk_conformance, register_refuses_empty_ranges) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  char x = 0;
  auto r0 = p.a->register_buffer(nullptr, 16);
  auto r1 = p.a->register_buffer(&x, 0);
  ASSERT_FALSE(r0);
  ASSERT_FALSE(r1);
  EXPECT_EQ(r0.error().code, errc::invalid_argument);
  EXPECT_EQ(r1.error().code, errc::invalid_argument);
}

TEST_P(bulk_conformance, oversize_send_is_refused_and_nothing_is_sent) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  std::vector<std::byte> big(p.a->limits().max_send_bytes + 1, std::byte{7});
  auto r = p.a->send(big, 1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
  // The next (legal) message is the first thing b receives.
  std::vector<std::byte> marker(3, std::byte{42});
  ASSERT_TRUE(p.a->send(marker, 2));
  completion c = wait_for_kind(*p.b, completion_kind::send_received);
  EXPECT_EQ(c.data, marker);
}

TEST_P(bulk_conformance, write_outside_the_target_is_refused_and_nothing_is_written) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  auto w = make_write_setup(p, 8192);
  fill_pattern(w.src.span(), 1);
  const std::size_t n = w.dst.size();
  struct bad {
    std::uint64_t local_offset, remote_offset, bytes;
  };
  const bad cases[] = {
      {0, 1, n},                     // one byte past the end
      {0, n + 1, 0},                 // offset past the end
      {0, 4096, ~0ull - 100},        // length overflows the offset
      {~0ull - 10, 0, 16},           // source offset overflows
      {1, 0, n},                     // source range too long
  };
  for (const bad& b : cases) {
    auto r = p.a->write_with_imm(w.src_handle, b.local_offset, w.dst_remote, b.remote_offset,
                                 b.bytes, 9, 1);
    ASSERT_FALSE(r) << "offsets " << b.local_offset << "/" << b.remote_offset << " bytes "
                    << b.bytes;
    EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
  }
  auto unknown = p.a->write_with_imm(buffer_handle{77}, 0, w.dst_remote, 0, 16, 9, 1);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, errc::invalid_argument);
  // Nothing arrived: the first completion b sees is the marker, and the target is still zero.
  std::vector<std::byte> marker(1, std::byte{1});
  ASSERT_TRUE(p.a->send(marker, 2));
  completion c = next_completion(*p.b);
  EXPECT_EQ(c.kind, completion_kind::send_received);
  for (std::byte x : w.dst.span()) ASSERT_EQ(x, std::byte{0});
  EXPECT_TRUE(p.a->is_up());
  EXPECT_TRUE(p.b->is_up());
}

TEST_P(bulk_conformance, a_write_list_with_one_bad_write_is_refused_whole) {
  auto o = options();
  o.limits.max_outstanding = 4;
  auto p = must_connect(kind(), o);
  ASSERT_TRUE(p.a);
  auto w = make_write_setup(p, 8192);
  fill_pattern(w.src.span(), 5);
  auto good = [&](std::uint64_t offset, std::uint64_t wr_id) {
    return write_request{w.src_handle, offset, w.dst_remote, offset, 1024,
                         static_cast<std::uint32_t>(wr_id), wr_id};
  };
  // Write 2 runs one byte past the target: the list is refused and names it.
  std::vector<write_request> list = {good(0, 1), good(1024, 2), good(4096, 3)};
  list[2].remote_offset = w.dst.size() - 1023;
  auto r = p.a->post_writes(list);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
  EXPECT_NE(r.error().message.find("write 2"), std::string::npos) << r.error().describe();
  // An unknown source handle, first in the list.
  list = {good(0, 1), good(1024, 2)};
  list[0].local = buffer_handle{77};
  r = p.a->post_writes(list);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
  EXPECT_NE(r.error().message.find("write 0"), std::string::npos) << r.error().describe();
  // More writes than max_outstanding can never fit; more than the room left does not fit now.
  list = {good(0, 1), good(1024, 2), good(2048, 3), good(3072, 4), good(4096, 5)};
  r = p.a->post_writes(list);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
  std::vector<std::byte> msg(8, std::byte{1});
  ASSERT_TRUE(p.a->send(msg, 10));
  ASSERT_TRUE(p.a->send(msg, 11));
  list = {good(0, 1), good(1024, 2), good(2048, 3)};
  r = p.a->post_writes(list);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::overloaded) << r.error().describe();
  // An empty list posts nothing and succeeds.
  EXPECT_TRUE(p.a->post_writes({}));
  // None of the refused writes arrived: b sees the two sends, then nothing, and its buffer is
  // still zero; a's own completions are the two send_done.
  for (int i = 0; i < 2; ++i) {
    completion c = next_completion(*p.b);
    EXPECT_EQ(c.kind, completion_kind::send_received);
  }
  for (int i = 0; i < 2; ++i) {
    completion c = next_completion(*p.a);
    EXPECT_EQ(c.kind, completion_kind::send_done);
  }
  completion none[1];
  EXPECT_EQ(p.b->poll(none), 0u);
  EXPECT_EQ(p.a->poll(none), 0u);
  for (std::byte x : w.dst.span()) ASSERT_EQ(x, std::byte{0});
  // With the room back, the same list of three goes.
  ASSERT_TRUE(p.a->post_writes(list));
  for (int i = 1; i <= 3; ++i) {
    completion c = wait_for_kind(*p.b, completion_kind::write_received);
    EXPECT_EQ(c.imm, static_cast<std::uint32_t>(i));
  }
  EXPECT_TRUE(p.a->is_up());
  EXPECT_TRUE(p.b->is_up());
}

TEST_P(bulk_conformance, outstanding_operations_are_bounded_until_completions_are_polled) {
  auto o = options();
  o.limits.max_outstanding = 4;
  auto p = must_connect(kind(), o);
  ASSERT_TRUE(p.a);
  std::vector<std::byte> msg(8, std::byte{1});
  const std::uint32_t limit = p.a->limits().max_outstanding;
  for (std::uint32_t i = 0; i < limit; ++i) ASSERT_TRUE(p.a->send(msg, i));
  auto over = p.a->send(msg, 99);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, errc::overloaded) << over.error().describe();
  // Retiring one local completion frees one slot.
  completion c = wait_for_kind(*p.a, completion_kind::send_done);
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(p.a->send(msg, 100));
  // The refused message never arrived: b sees exactly limit + 1 messages.
  for (std::uint32_t i = 0; i <= limit; ++i) wait_for_kind(*p.b, completion_kind::send_received);
  completion none[1];
  EXPECT_EQ(p.b->poll(none), 0u);
}

TEST_P(bulk_conformance, a_small_receive_bound_holds_the_sender_back_without_loss) {
  auto o = options();
  o.limits.max_received = 4;
  auto p = must_connect(kind(), o);
  ASSERT_TRUE(p.a);
  constexpr int total = 200;
  std::thread sender([&] {
    for (int i = 0; i < total; ++i) {
      std::vector<std::byte> m(1 + i % 1000, static_cast<std::byte>(i));
      for (;;) {
        auto r = p.a->send(m, static_cast<std::uint64_t>(i));
        if (r) break;
        ASSERT_EQ(r.error().code, errc::overloaded) << r.error().describe();
        (void)wait_for_kind(*p.a, completion_kind::send_done);
      }
    }
  });
  for (int i = 0; i < total; ++i) {
    completion c = wait_for_kind(*p.b, completion_kind::send_received);
    ASSERT_EQ(c.data.size(), static_cast<std::size_t>(1 + i % 1000));
    ASSERT_EQ(c.data[0], static_cast<std::byte>(i));
  }
  sender.join();
}

// ---------------------------------------------------------------------------------------------
// Link death

TEST_P(bulk_conformance, close_takes_the_link_down_on_both_sides_and_later_calls_fail) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  p.a->close();
  EXPECT_FALSE(p.a->is_up());
  completion down_b = wait_for_down(*p.b);
  ASSERT_FALSE(down_b.ok());
  EXPECT_FALSE(p.b->is_up());
  std::vector<std::byte> msg(4, std::byte{1});
  auto r = p.b->send(msg, 1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::closed);
  // After link_down was delivered, wait() says closed and poll() returns nothing.
  completion c[2];
  auto w = p.b->wait(c, std::chrono::milliseconds(10));
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, errc::closed);
  EXPECT_EQ(p.b->poll(c), 0u);
  // a delivers its own link_down exactly once too.
  completion down_a = wait_for_down(*p.a);
  EXPECT_FALSE(down_a.ok());
  auto ra = p.a->send(msg, 1);
  EXPECT_FALSE(ra);
}

TEST_P(bulk_conformance, completions_received_before_the_peer_closed_are_delivered_first) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  for (int i = 0; i < 5; ++i) {
    std::vector<std::byte> m(16, static_cast<std::byte>(i));
    ASSERT_TRUE(p.a->send(m, static_cast<std::uint64_t>(i)));
  }
  // All five are in b's queue before a closes.
  std::vector<completion> got;
  for (int i = 0; i < 5; ++i) got.push_back(next_completion(*p.b));
  p.a->close();
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(got[static_cast<std::size_t>(i)].kind, completion_kind::send_received);
    EXPECT_EQ(got[static_cast<std::size_t>(i)].data[0], static_cast<std::byte>(i));
  }
  completion down = wait_for_down(*p.b);
  EXPECT_FALSE(down.ok());
}

TEST_P(bulk_conformance, local_completions_posted_before_a_close_come_before_its_link_down) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  constexpr std::uint64_t posted = 6;
  for (std::uint64_t i = 0; i < posted; ++i) {
    std::vector<std::byte> m(32, static_cast<std::byte>(i));
    ASSERT_TRUE(p.a->send(m, 100 + i));
  }
  p.a->close();
  // Every posted send completes exactly once (successfully or flushed), then link_down comes
  // once, then wait() says closed. Taken two at a time so the down has to wait behind
  // completions still queued when a batch fills up.
  std::vector<completion> got;
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no link_down within patience";
    completion c[2];
    auto n = p.a->wait(c, std::chrono::milliseconds(100));
    ASSERT_TRUE(n) << n.error().describe();
    for (std::size_t i = 0; i < *n; ++i)
      got.push_back(std::move(c[i]));
    if (!got.empty() && got.back().kind == completion_kind::link_down) break;
  }
  ASSERT_EQ(got.size(), posted + 1);
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < posted; ++i) {
    EXPECT_EQ(got[i].kind, completion_kind::send_done) << "completion " << i;
    ids.push_back(got[i].wr_id);
  }
  std::sort(ids.begin(), ids.end());  // the contract orders received completions, not local ones
  for (std::uint64_t i = 0; i < posted; ++i)
    EXPECT_EQ(ids[i], 100 + i);
  completion c[2];
  auto after = p.a->wait(c, std::chrono::milliseconds(10));
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, errc::closed);
}

TEST_P(bulk_conformance, writing_with_a_stale_descriptor_takes_the_link_down) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  auto w = make_write_setup(p, 4096);
  ASSERT_TRUE(p.b->deregister_buffer(w.dst_handle));
  auto r = p.a->write_with_imm(w.src_handle, 0, w.dst_remote, 0, 64, 5, 1);
  // RDMA reports the remote access error asynchronously, shm at once: either way the writer's
  // link ends up down, and so does the target's.
  if (r) {
    completion c = wait_for_down(*p.a);
    EXPECT_FALSE(c.ok());
  } else {
    EXPECT_FALSE(p.a->is_up()) << r.error().describe();
  }
  completion down_b = wait_for_down(*p.b);
  EXPECT_FALSE(down_b.ok());
}

TEST_P(bulk_conformance, wait_returns_zero_on_timeout_while_the_link_is_idle) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  completion c[1];
  auto n = p.a->wait(c, std::chrono::milliseconds(20));
  ASSERT_TRUE(n) << n.error().describe();
  EXPECT_EQ(*n, 0u);
  EXPECT_TRUE(p.a->is_up());
}

// The threading contract: poll() never blocks, and a wait() ends by its own timeout, whatever
// another thread is doing with the link. (The shm link once held its consumer lock across a whole
// wait(), sleep included, so both queued behind the other thread's wait.)
TEST_P(bulk_conformance, poll_and_a_short_wait_do_not_queue_behind_another_threads_wait) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  std::atomic<bool> started{false};
  std::atomic<bool> done{false};
  result<std::size_t> got = std::size_t{0};
  completion received[1];
  std::thread waiter([&] {
    started = true;
    got = p.a->wait(received, std::chrono::seconds(5));
    done = true;
  });
  while (!started)
    std::this_thread::yield();
  // Well past the spin (spin_us is 50 us): the waiter is asleep.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  completion c[1];
  EXPECT_EQ(p.a->poll(c), 0u);
  EXPECT_FALSE(done) << "poll() returned only after the other thread's wait() had";
  auto n = p.a->wait(c, std::chrono::milliseconds(20));
  ASSERT_TRUE(n) << n.error().describe();
  EXPECT_EQ(*n, 0u);
  EXPECT_FALSE(done) << "a 20 ms wait() returned only after the other thread's 5 s wait() had";
  // A message now wakes the sleeping waiter, and it gets the message.
  const std::byte hello[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  ASSERT_TRUE(p.b->send(hello, 7));
  waiter.join();
  ASSERT_TRUE(got) << got.error().describe();
  ASSERT_EQ(*got, 1u);
  EXPECT_EQ(received[0].kind, completion_kind::send_received);
  EXPECT_EQ(received[0].data.size(), sizeof hello);
}

// ---------------------------------------------------------------------------------------------
// Happy paths

TEST_P(bulk_conformance, write_with_imm_puts_the_bytes_in_place_before_the_completion) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  constexpr std::size_t size = 4 << 20;
  auto w = make_write_setup(p, size);
  fill_pattern(w.src.span(), 7);
  struct op {
    std::uint64_t src_off, dst_off, bytes;
  };
  const op ops[] = {{0, 0, 0}, {0, 0, 1}, {3, 5, 4097}, {0, 1 << 20, 1 << 20}, {0, 0, size},
                    {size - 8, size - 8, 8}};
  std::uint32_t imm = 100;
  for (const op& o : ops) {
    std::memset(w.dst.data(), 0, w.dst.size());
    ASSERT_TRUE(p.a->write_with_imm(w.src_handle, o.src_off, w.dst_remote, o.dst_off, o.bytes, imm,
                                    imm + 1000));
    completion got = wait_for_kind(*p.b, completion_kind::write_received);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got.imm, imm);
    EXPECT_EQ(got.bytes, o.bytes);
    ASSERT_EQ(std::memcmp(w.dst.data() + o.dst_off, w.src.data() + o.src_off, o.bytes), 0)
        << "bytes " << o.bytes;
    // Bytes around the range are untouched.
    if (o.dst_off > 0) {
      EXPECT_EQ(w.dst.data()[o.dst_off - 1], std::byte{0});
    }
    if (o.dst_off + o.bytes < size) {
      EXPECT_EQ(w.dst.data()[o.dst_off + o.bytes], std::byte{0});
    }
    completion done = wait_for_kind(*p.a, completion_kind::write_done);
    EXPECT_TRUE(done.ok());
    EXPECT_EQ(done.wr_id, imm + 1000u);
    ++imm;
  }
}

// Posts 8 lists of 16 writes (every fifth carries only its immediate) over a `kind` link made
// with `o` while a reader takes the peer's completions 8 at a time; checks bytes, immediates and
// wr_ids.
void write_lists_and_check_them(backend_kind kind, const link_options& o) {
  auto p = must_connect(kind, o);
  ASSERT_TRUE(p.a);
  constexpr std::size_t chunk = 3000;  // not a multiple of anything the backends align to
  constexpr std::uint32_t lists = 8;
  constexpr std::uint32_t per_list = 16;
  constexpr std::uint32_t count = lists * per_list;
  auto w = make_write_setup(p, chunk * count);
  fill_pattern(w.src.span(), 11);
  std::vector<completion> received;
  // A jthread: an ASSERT below that returns early still joins it (it stops by its deadline).
  std::jthread reader([&] {
    completion in[8];
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (received.size() < count && std::chrono::steady_clock::now() < deadline) {
      auto n = p.b->wait(in, std::chrono::milliseconds(100));
      if (!n) return;
      for (std::size_t i = 0; i < *n; ++i) received.push_back(std::move(in[i]));
    }
  });
  std::vector<std::uint64_t> done;
  for (std::uint32_t l = 0; l < lists; ++l) {
    std::vector<write_request> list;
    for (std::uint32_t k = 0; k < per_list; ++k) {
      const std::uint32_t i = l * per_list + k;
      // Every fifth write carries only its immediate.
      const std::uint64_t bytes = i % 5 == 4 ? 0 : chunk;
      list.push_back({w.src_handle, i * chunk, w.dst_remote, i * chunk, bytes, i, 1000 + i});
    }
    auto r = p.a->post_writes(list);
    ASSERT_TRUE(r) << r.error().describe();
    // The whole list is outstanding until its completions are polled.
    while (done.size() < (l + 1) * per_list) {
      completion c = next_completion(*p.a);
      ASSERT_EQ(c.kind, completion_kind::write_done);
      ASSERT_TRUE(c.ok()) << c.failure->describe();
      done.push_back(c.wr_id);
    }
  }
  reader.join();
  ASSERT_EQ(received.size(), count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const completion& c = received[i];
    ASSERT_TRUE(c.ok());
    ASSERT_EQ(c.kind, completion_kind::write_received) << i;
    EXPECT_EQ(c.imm, i);
    EXPECT_EQ(c.bytes, i % 5 == 4 ? 0u : chunk) << i;
    EXPECT_EQ(done[i], 1000u + i);
    const bool written = i % 5 != 4;
    EXPECT_EQ(std::memcmp(w.dst.data() + i * chunk, w.src.data() + i * chunk, chunk) == 0, written)
        << "write " << i;
  }
}

TEST_P(bulk_conformance, a_write_list_lands_in_order_with_a_completion_per_write) {
  // A receive bound of 4 under lists of 16, and a reader that takes 8 completions at a time. shm
  // publishes a list's writes in groups, one slot per group, as many as the slot payload
  // (max_send_bytes) holds: by default one group per list, which the reader takes in two halves;
  // with 48-byte slots, groups of 3 and a single write at the end, so that a list outruns the
  // ring; with 16-byte slots, one slot per write. Every list must arrive whole and in order.
  for (const std::uint32_t slot_payload : {link_limits{}.max_send_bytes, 48u, 16u}) {
    SCOPED_TRACE("max_send_bytes " + std::to_string(slot_payload));
    auto o = options();
    o.limits.max_outstanding = 16;
    o.limits.max_received = 4;
    o.limits.max_send_bytes = slot_payload;
    ASSERT_NO_FATAL_FAILURE(write_lists_and_check_them(kind(), o));
  }
}

TEST_P(bulk_conformance, writes_and_sends_arrive_in_the_order_they_were_posted) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  constexpr std::size_t chunk = 4096;
  constexpr std::uint32_t count = 256;
  auto w = make_write_setup(p, chunk * count);
  fill_pattern(w.src.span(), 3);
  std::uint32_t posted = 0;
  std::vector<completion> received;
  while (received.size() < count) {
    while (posted < count) {
      result<void> r = ok();
      if (posted % 3 == 0) {
        std::vector<std::byte> m(4);
        std::memcpy(m.data(), &posted, 4);
        r = p.a->send(m, posted);
      } else {
        r = p.a->write_with_imm(w.src_handle, posted * chunk, w.dst_remote, posted * chunk, chunk,
                                posted, posted);
      }
      if (!r) {
        ASSERT_EQ(r.error().code, errc::overloaded) << r.error().describe();
        break;
      }
      ++posted;
    }
    completion local[8];
    (void)p.a->poll(local);
    completion in[8];
    auto n = p.b->wait(in, std::chrono::milliseconds(1));
    ASSERT_TRUE(n);
    for (std::size_t i = 0; i < *n; ++i) received.push_back(std::move(in[i]));
  }
  for (std::uint32_t i = 0; i < count; ++i) {
    const completion& c = received[i];
    ASSERT_TRUE(c.ok());
    if (i % 3 == 0) {
      ASSERT_EQ(c.kind, completion_kind::send_received) << i;
      std::uint32_t v = 0;
      std::memcpy(&v, c.data.data(), 4);
      EXPECT_EQ(v, i);
    } else {
      ASSERT_EQ(c.kind, completion_kind::write_received) << i;
      EXPECT_EQ(c.imm, i);
    }
  }
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::byte* got = w.dst.data() + i * chunk;
    if (i % 3 == 0) {
      EXPECT_EQ(got[0], std::byte{0}) << "chunk " << i << " was never written";
    } else {
      ASSERT_EQ(std::memcmp(got, w.src.data() + i * chunk, chunk), 0) << "chunk " << i;
    }
  }
}

TEST_P(bulk_conformance, sends_deliver_their_bytes_both_ways_up_to_the_limit) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  const std::size_t sizes[] = {0, 1, 100, 4096, p.a->limits().max_send_bytes};
  for (std::size_t s : sizes) {
    std::vector<std::byte> m(s);
    fill_pattern(m, static_cast<std::uint32_t>(s));
    ASSERT_TRUE(p.a->send(m, s));
    completion c = wait_for_kind(*p.b, completion_kind::send_received);
    EXPECT_EQ(c.data, m);
    EXPECT_EQ(c.bytes, s);
    ASSERT_TRUE(p.b->send(m, s));
    completion back = wait_for_kind(*p.a, completion_kind::send_received);
    EXPECT_EQ(back.data, m);
  }
}

TEST_P(bulk_conformance, both_directions_write_at_once_without_deadlock) {
  auto p = must_connect(kind(), options());
  ASSERT_TRUE(p.a);
  constexpr std::size_t size = 8 << 20;
  auto ab = make_write_setup(p, size);
  link_pair reversed{std::move(p.b), std::move(p.a)};
  auto ba = make_write_setup(reversed, size);
  p.a = std::move(reversed.b);
  p.b = std::move(reversed.a);
  fill_pattern(ab.src.span(), 1);
  fill_pattern(ba.src.span(), 2);
  // Each side writes 4 x 8 MiB to the other while the other does the same; a side counts the
  // writes it receives along the way (completions of both kinds arrive on one queue).
  auto run = [&](bulk::link& me, write_setup& w, int& received) {
    int done = 0;
    for (std::uint32_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(me.write_with_imm(w.src_handle, 0, w.dst_remote, 0, size, i, i));
    }
    const auto deadline = std::chrono::steady_clock::now() + patience;
    completion c[8];
    while ((done < 4 || received < 4) && std::chrono::steady_clock::now() < deadline) {
      auto n = me.wait(c, std::chrono::milliseconds(10));
      ASSERT_TRUE(n) << n.error().describe();
      for (std::size_t i = 0; i < *n; ++i) {
        ASSERT_TRUE(c[i].ok()) << c[i].failure->describe();
        done += c[i].kind == completion_kind::write_done;
        received += c[i].kind == completion_kind::write_received;
      }
    }
    EXPECT_EQ(done, 4);
  };
  int got_a = 0, got_b = 0;
  std::thread t([&] { run(*p.b, ba, got_b); });
  run(*p.a, ab, got_a);
  t.join();
  ASSERT_EQ(got_a, 4);
  ASSERT_EQ(got_b, 4);
  EXPECT_EQ(std::memcmp(ab.dst.data(), ab.src.data(), size), 0);
  EXPECT_EQ(std::memcmp(ba.dst.data(), ba.src.data(), size), 0);
}

// ---------------------------------------------------------------------------------------------
// Two processes (a real helper binary, tessera_bulk_peer)

struct peer_process {
  pid_t pid = -1;
  int to_child = -1;
  int from_child = -1;

  ~peer_process() {
    if (to_child >= 0) ::close(to_child);
    if (from_child >= 0) ::close(from_child);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  int reap() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

std::unique_ptr<peer_process> spawn_peer(backend_kind kind, const char* mode) {
  int in[2], out[2];
  if (::pipe(in) != 0 || ::pipe(out) != 0) return nullptr;
  auto p = std::make_unique<peer_process>();
  p->pid = ::fork();
  if (p->pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::close(in[1]);
    ::close(out[0]);
    const std::string backend(to_string(kind));
    ::execl(TESSERA_BULK_PEER_PATH, TESSERA_BULK_PEER_PATH, backend.c_str(), mode,
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  p->to_child = in[1];
  p->from_child = out[0];
  return p;
}

// Exchanges params with the peer over its stdin/stdout and connects.
std::unique_ptr<bulk::link> connect_to_peer(peer_process& peer, backend_kind kind,
                                      const link_options& o) {
  auto s = prepare_link(kind, o);
  if (!s) {
    ADD_FAILURE() << s.error().describe();
    return nullptr;
  }
  std::string line = to_hex(encode((*s)->local_params())) + "\n";
  if (::write(peer.to_child, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    ADD_FAILURE() << "cannot write to the peer";
    return nullptr;
  }
  std::string theirs;
  char ch = 0;
  while (::read(peer.from_child, &ch, 1) == 1 && ch != '\n') theirs += ch;
  auto params = decode_connect_params(from_hex(theirs));
  if (!params) {
    ADD_FAILURE() << "peer params: " << params.error().describe();
    return nullptr;
  }
  auto l = (*s)->connect(*params);
  if (!l) {
    ADD_FAILURE() << "connect to peer: " << l.error().describe();
    return nullptr;
  }
  return std::move(*l);
}

TEST_P(bulk_conformance, two_processes_exchange_writes_and_sends) {
  auto peer = spawn_peer(kind(), "echo");
  ASSERT_TRUE(peer);
  auto l = connect_to_peer(*peer, kind(), options());
  ASSERT_TRUE(l);
  // The peer announces its buffer; we write patterns into it and it answers with checksums.
  completion announce = wait_for_kind(*l, completion_kind::send_received);
  auto remote = peer_protocol::decode_remote(announce.data);
  ASSERT_TRUE(remote) << remote.error().describe();
  auto src = must_allocate(remote->size);
  auto h = l->register_buffer(src);
  ASSERT_TRUE(h);
  for (std::uint32_t round = 1; round <= 8; ++round) {
    const std::uint64_t bytes = (remote->size >> (round % 4)) - round;
    fill_pattern(src.span().first(bytes), round);
    ASSERT_TRUE(l->write_with_imm(*h, 0, *remote, 0, bytes, round, round));
    auto got = collect(*l, {completion_kind::send_received, completion_kind::write_done});
    ASSERT_FALSE(::testing::Test::HasFailure());
    auto sum = peer_protocol::decode_answer(got[0].data);
    ASSERT_TRUE(sum);
    EXPECT_EQ(sum->imm, round);
    EXPECT_EQ(sum->bytes, bytes);
    EXPECT_EQ(sum->checksum, peer_protocol::checksum(src.span().first(bytes)));
    EXPECT_EQ(got[1].wr_id, round);
  }
  ASSERT_TRUE(l->send(peer_protocol::bye(), 0));
  completion down = wait_for_down(*l);  // the peer closes after bye
  EXPECT_FALSE(down.ok());
  EXPECT_EQ(peer->reap(), 0);
}

TEST_P(bulk_conformance, a_killed_peer_process_takes_the_link_down_without_a_hang) {
  auto peer = spawn_peer(kind(), "idle");
  ASSERT_TRUE(peer);
  auto l = connect_to_peer(*peer, kind(), options());
  ASSERT_TRUE(l);
  completion hello = wait_for_kind(*l, completion_kind::send_received);
  ASSERT_TRUE(hello.ok());
  ::kill(peer->pid, SIGKILL);
  (void)peer->reap();
  completion down = wait_for_down(*l);
  ASSERT_FALSE(down.ok());
  EXPECT_FALSE(l->is_up());
  std::vector<std::byte> m(8);
  EXPECT_FALSE(l->send(m, 1));
}

}  // namespace
