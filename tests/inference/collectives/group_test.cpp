// Collectives over real tcp and shm links: ranks as threads of this process, and (at the end) as
// separate processes (tessera_collectives_peer), one of which gets killed.
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "inference/collectives/group.hpp"
#include "tests/inference/collectives/support.hpp"

namespace tessera::inference::collectives {
namespace {

using namespace testing;
using bulk::backend_kind;

group_options opts(std::size_t max_floats = 4096) {
  group_options o;
  o.max_floats = max_floats;
  o.timeout_ms = std::chrono::milliseconds(30'000);
  return o;
}

// Runs fn(rank, group) on one thread per rank over a fresh mesh.
void run_ranks(backend_kind kind, std::uint32_t n, const group_options& o,
               const std::function<void(std::uint32_t, group&)>& fn) {
  auto mesh = make_local_mesh(kind, n);
  ASSERT_TRUE(mesh) << mesh.error().describe();
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto g = group::create(r, row(*mesh, r), o);
      ASSERT_TRUE(g) << "rank " << r << ": " << g.error().describe();
      fn(r, **g);
    });
  }
  for (auto& t : threads) t.join();
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

class collectives : public ::testing::TestWithParam<backend_kind> {};

// --- bad arguments first --------------------------------------------------------------------------

TEST_P(collectives, create_refuses_bad_arguments) {
  auto mesh = make_local_mesh(GetParam(), 2);
  ASSERT_TRUE(mesh) << mesh.error().describe();
  EXPECT_EQ(group::create(0, {}, opts()).error().code, errc::invalid_argument);
  EXPECT_EQ(group::create(2, row(*mesh, 0), opts()).error().code, errc::invalid_argument);
  std::vector<bulk::link*> nine(9, nullptr);
  EXPECT_EQ(group::create(0, nine, opts()).error().code, errc::invalid_argument);
  // links[rank] must be null, the others present.
  EXPECT_EQ(group::create(1, row(*mesh, 0), opts()).error().code, errc::invalid_argument);
  auto zero_epoch = opts();
  zero_epoch.epoch = 0;
  EXPECT_EQ(group::create(0, row(*mesh, 0), zero_epoch).error().code, errc::invalid_argument);
  auto no_floats = opts();
  no_floats.max_floats = 0;
  EXPECT_EQ(group::create(0, row(*mesh, 0), no_floats).error().code, errc::invalid_argument);
}

TEST_P(collectives, peers_that_disagree_on_the_group_are_refused) {
  auto mesh = make_local_mesh(GetParam(), 2);
  ASSERT_TRUE(mesh);
  result<std::unique_ptr<group>> b = make_error(errc::internal, "not run");
  std::thread t([&] { b = group::create(1, row(*mesh, 1), opts(2048)); });
  auto a = group::create(0, row(*mesh, 0), opts(4096));
  t.join();
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, errc::protocol) << a.error().describe();
  EXPECT_NE(a.error().message.find("max_floats"), std::string::npos);
  ASSERT_FALSE(b);
}

TEST_P(collectives, operations_refuse_bad_arguments_before_anything_moves) {
  run_ranks(GetParam(), 2, opts(1024), [](std::uint32_t r, group& g) {
    std::vector<float> empty;
    EXPECT_EQ(g.all_reduce(empty).error().code, errc::invalid_argument);
    std::vector<float> mine(3), out(5);
    const std::size_t two_counts[] = {3, 2};
    const std::size_t one_count[] = {5};
    const std::size_t big[] = {3, 5000};
    EXPECT_EQ(g.all_gather(mine, one_count, out).error().code, errc::invalid_argument);
    EXPECT_EQ(g.all_gather(mine, big, out).error().code, errc::invalid_argument);
    std::vector<float> out_small(4);
    EXPECT_EQ(g.all_gather(r == 0 ? std::span<const float>(mine) : std::span<const float>(mine).first(2),
                           two_counts, out_small)
                  .error()
                  .code,
              errc::invalid_argument);
    EXPECT_EQ(g.send(r, 1, mine).error().code, errc::invalid_argument);  // to itself
    EXPECT_EQ(g.send(7, 1, mine).error().code, errc::invalid_argument);
    EXPECT_EQ(g.recv(9, 1, out).error().code, errc::invalid_argument);
    EXPECT_EQ(g.set_epoch(1).error().code, errc::invalid_argument);  // not after the current
    // Refusals leave the group usable.
    std::vector<float> v = input(r, 0, 10);
    ASSERT_TRUE(g.all_reduce(v)) ;
    EXPECT_TRUE(same_bits(v, rank_order_sum(2, 0, 10)));
  });
}

TEST_P(collectives, ranks_passing_different_lengths_get_a_protocol_error_not_garbage) {
  run_ranks(GetParam(), 2, opts(1024), [](std::uint32_t r, group& g) {
    std::vector<float> v(r == 0 ? 100 : 101, 1.0f);
    auto res = g.all_reduce(v, algorithm::mesh);
    ASSERT_FALSE(res);
    EXPECT_TRUE(res.error().code == errc::protocol || res.error().code == errc::cancelled)
        << res.error().describe();
    // The group stays failed until a re-plan.
    std::vector<float> w(100, 1.0f);
    EXPECT_FALSE(g.all_reduce(w));
  });
}

TEST_P(collectives, a_mismatched_pipeline_tag_is_an_error) {
  run_ranks(GetParam(), 2, opts(1024), [](std::uint32_t r, group& g) {
    std::vector<float> v(16, 2.0f);
    if (r == 0) {
      // Succeeds, or sees the receiver's abort if it arrives before the write completes.
      auto sent = g.send(1, 41, v);
      if (!sent) {
        EXPECT_EQ(sent.error().code, errc::cancelled) << sent.error().describe();
      }
    } else {
      auto res = g.recv(0, 42, v);
      ASSERT_FALSE(res);
      EXPECT_EQ(res.error().code, errc::protocol);
      EXPECT_NE(res.error().message.find("tag 41"), std::string::npos) << res.error().describe();
    }
  });
}

// --- results ---------------------------------------------------------------------------------------

struct reduce_case {
  std::uint32_t n;
  std::size_t len;
  algorithm algo;
};

TEST_P(collectives, all_reduce_is_bit_identical_on_every_rank_and_matches_the_reference) {
  const std::size_t max_floats = 1000;
  for (const reduce_case& c : {
           reduce_case{1, 17, algorithm::automatic}, reduce_case{2, 1, algorithm::mesh},
           reduce_case{2, 513, algorithm::mesh}, reduce_case{3, 1000, algorithm::mesh},
           reduce_case{4, 2500, algorithm::mesh},  // chunked: 1000 + 1000 + 500
           reduce_case{2, 999, algorithm::ring}, reduce_case{3, 1000, algorithm::ring},
           reduce_case{3, 2, algorithm::ring},     // fewer floats than ranks: empty chunks
           reduce_case{4, 2333, algorithm::ring},  // chunked and uneven
       }) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " len=" << c.len
                                      << " ring=" << (c.algo == algorithm::ring));
    std::vector<std::vector<float>> results(c.n);
    run_ranks(GetParam(), c.n, opts(max_floats), [&](std::uint32_t r, group& g) {
      for (std::uint32_t round = 0; round < 3; ++round) {
        auto v = input(r, round, c.len);
        ASSERT_TRUE(g.all_reduce(v, c.algo)) << "rank " << r;
        if (round == 2) results[r] = v;
      }
    });
    ASSERT_FALSE(HasFailure());
    const auto want = c.algo == algorithm::ring ? ring_order_sum(c.n, 2, c.len, max_floats)
                                                : rank_order_sum(c.n, 2, c.len);
    for (std::uint32_t r = 0; r < c.n; ++r) {
      EXPECT_TRUE(same_bits(results[r], results[0])) << "rank " << r << " differs from rank 0";
      EXPECT_TRUE(same_bits(results[r], want)) << "rank " << r << " differs from the reference";
    }
  }
}

// Teams (the tensor-parallel ranks of one pipeline stage): {0, 1} and {2, 3} of a group of 4
// reduce at once, each summing its members in order, bit-identical within the team; chunked
// vectors too; uneven operation counts between teams are fine; then a full-group all_reduce, an
// all_gather or another team is refused, and point-to-point sends across teams still work.
TEST_P(collectives, teams_reduce_among_themselves_and_keep_to_their_team) {
  const std::size_t len = 2500;  // chunked by max_floats 1000
  std::vector<std::vector<float>> results(4);
  run_ranks(GetParam(), 4, opts(1000), [&](std::uint32_t r, group& g) {
    const std::vector<std::uint32_t> team = r < 2 ? std::vector<std::uint32_t>{0, 1}
                                                  : std::vector<std::uint32_t>{2, 3};
    const std::uint32_t rounds = r < 2 ? 3 : 5;  // the teams count their operations apart
    for (std::uint32_t round = 0; round < rounds; ++round) {
      auto v = input(r, round, len);
      ASSERT_TRUE(g.all_reduce_among(v, team)) << "rank " << r;
      results[r] = v;
    }
    std::vector<float> v(8, 1.0f);
    EXPECT_EQ(g.all_reduce(v).error().code, errc::invalid_argument);
    std::vector<std::size_t> counts(4, 2);
    std::vector<float> out(8);
    EXPECT_EQ(g.all_gather(std::span<const float>(v).first(2), counts, out).error().code,
              errc::invalid_argument);
    const std::vector<std::uint32_t> other{0, 1, 2, 3};
    EXPECT_EQ(g.all_reduce_among(v, other).error().code, errc::invalid_argument);
    const std::vector<std::uint32_t> without_me{r == 0 ? 1u : 0u};
    EXPECT_EQ(g.all_reduce_among(v, without_me).error().code, errc::invalid_argument);
    // Across teams: rank 1 sends to rank 2.
    std::vector<float> msg(16, static_cast<float>(r));
    if (r == 1) {
      ASSERT_TRUE(g.send(2, 9, msg));
    }
    if (r == 2) {
      ASSERT_TRUE(g.recv(1, 9, msg));
      EXPECT_EQ(msg[0], 1.0f);
    }
  });
  ASSERT_FALSE(HasFailure());
  for (std::uint32_t t = 0; t < 2; ++t) {
    const std::uint32_t a = 2 * t, b = a + 1, last = t == 0 ? 2 : 4;
    EXPECT_TRUE(same_bits(results[a], results[b])) << "team " << t;
    auto x = input(a, last, len), y = input(b, last, len);
    for (std::size_t i = 0; i < len; ++i) x[i] = x[i] + y[i];
    EXPECT_TRUE(same_bits(results[a], x)) << "team " << t << " differs from the members-order sum";
  }
}

TEST_P(collectives, groups_of_five_and_eight_ranks_work_with_both_algorithms) {
  for (std::uint32_t n : {5u, 8u}) {
    SCOPED_TRACE(n);
    std::vector<std::vector<float>> mesh_out(n), ring_out(n);
    run_ranks(GetParam(), n, opts(1024), [&](std::uint32_t r, group& g) {
      mesh_out[r] = input(r, 1, 301);
      ring_out[r] = input(r, 2, 1500);  // chunked: 1024 + 476
      ASSERT_TRUE(g.all_reduce(mesh_out[r], algorithm::mesh)) << "rank " << r;
      ASSERT_TRUE(g.all_reduce(ring_out[r], algorithm::ring)) << "rank " << r;
    });
    ASSERT_FALSE(HasFailure());
    for (std::uint32_t r = 0; r < n; ++r) {
      EXPECT_TRUE(same_bits(mesh_out[r], rank_order_sum(n, 1, 301))) << "rank " << r;
      EXPECT_TRUE(same_bits(ring_out[r], ring_order_sum(n, 2, 1500, 1024))) << "rank " << r;
    }
  }
}

TEST_P(collectives, the_two_algorithms_agree_within_rounding_and_the_threshold_picks_one) {
  auto o = opts(4096);
  o.ring_threshold_floats = 100;
  run_ranks(GetParam(), 3, o, [&](std::uint32_t r, group& g) {
    auto small = input(r, 5, 99);   // below the threshold: mesh
    auto large = input(r, 6, 300);  // ring
    ASSERT_TRUE(g.all_reduce(small));
    ASSERT_TRUE(g.all_reduce(large));
    EXPECT_TRUE(same_bits(small, rank_order_sum(3, 5, 99)));
    EXPECT_TRUE(same_bits(large, ring_order_sum(3, 6, 300, 4096)));
    const auto ref = rank_order_sum(3, 6, 300);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(large[i], ref[i], 1e-3 * (std::abs(ref[i]) + 1)) << i;
    }
  });
}

TEST_P(collectives, all_gather_concatenates_uneven_slices_in_rank_order) {
  for (std::uint32_t n : {2u, 3u, 4u}) {
    SCOPED_TRACE(n);
    std::vector<std::size_t> counts;
    for (std::uint32_t r = 0; r < n; ++r) counts.push_back(r == 1 ? 0 : 5 + 7 * r);  // rank 1: empty
    std::size_t total = 0;
    for (auto c : counts) total += c;
    std::vector<float> want;
    for (std::uint32_t r = 0; r < n; ++r) {
      auto x = input(r, 9, counts[r]);
      want.insert(want.end(), x.begin(), x.end());
    }
    run_ranks(GetParam(), n, opts(1024), [&](std::uint32_t r, group& g) {
      for (int round = 0; round < 3; ++round) {
        std::vector<float> out(total, -1.0f);
        ASSERT_TRUE(g.all_gather(input(r, 9, counts[r]), counts, out)) << "rank " << r;
        EXPECT_TRUE(same_bits(out, want)) << "rank " << r;
      }
    });
  }
}

TEST_P(collectives, pipeline_send_recv_carries_tensors_along_a_chain_with_chunking) {
  const std::size_t len = 2500;  // > max_floats: three chunks, each acknowledged
  run_ranks(GetParam(), 3, opts(1000), [&](std::uint32_t r, group& g) {
    for (std::uint64_t step = 0; step < 4; ++step) {
      std::vector<float> v(len);
      if (r == 0) {
        v = input(0, static_cast<std::uint32_t>(step), len);
      } else {
        ASSERT_TRUE(g.recv(r - 1, step, v)) << "rank " << r;
        EXPECT_TRUE(same_bits(v, input(0, static_cast<std::uint32_t>(step), len)));
      }
      if (r + 1 < 3) {
        ASSERT_TRUE(g.send(r + 1, step, v)) << "rank " << r;
      }
    }
    // Collectives and pipeline traffic interleave on one group.
    auto w = input(r, 1, 64);
    ASSERT_TRUE(g.all_reduce(w));
    EXPECT_TRUE(same_bits(w, rank_order_sum(3, 1, 64)));
  });
}

// --- epochs ----------------------------------------------------------------------------------------

TEST_P(collectives, traffic_of_an_old_epoch_is_dropped_never_summed) {
  auto mesh = make_local_mesh(GetParam(), 2);
  ASSERT_TRUE(mesh);
  auto o0 = opts(1024);
  auto o1 = opts(1024);
  o1.timeout_ms = std::chrono::milliseconds(300);  // rank 1's stale call gives up quickly
  result<std::unique_ptr<group>> g1 = make_error(errc::internal, "not run");
  std::thread t([&] { g1 = group::create(1, row(*mesh, 1), o1); });
  auto g0 = group::create(0, row(*mesh, 0), o0);
  t.join();
  ASSERT_TRUE(g0) << g0.error().describe();
  ASSERT_TRUE(g1) << g1.error().describe();

  std::atomic<bool> rank0_done{false};
  std::vector<float> r0 = input(0, 3, 256);
  // Rank 0 re-plans to epoch 2 while rank 1 still runs an epoch-1 all-reduce: rank 1's data
  // reaches rank 0 tagged with epoch 1.
  std::thread rank0([&] {
    auto a = (*g0)->set_epoch(2);
    ASSERT_TRUE(a) << a.error().describe();
    auto b = (*g0)->all_reduce(r0);
    ASSERT_TRUE(b) << b.error().describe();
    rank0_done = true;
  });
  std::vector<float> stale(256, 1e30f);  // would show in any sum it entered
  auto res = (*g1)->all_reduce(stale);
  // Rank 1 follows the plan; the group works again at epoch 2.
  (*g1)->set_timeout(std::chrono::milliseconds(30'000));
  auto moved = (*g1)->set_epoch(2);
  std::vector<float> r1 = input(1, 3, 256);
  auto reduced = moved ? (*g1)->all_reduce(r1) : moved;
  rank0.join();
  ASSERT_FALSE(res);  // rank 0 never answers epoch 1
  EXPECT_EQ(res.error().code, errc::timeout) << res.error().describe();
  ASSERT_TRUE(moved) << moved.error().describe();
  ASSERT_TRUE(reduced) << reduced.error().describe();
  ASSERT_TRUE(rank0_done);
  EXPECT_TRUE(same_bits(r0, rank_order_sum(2, 3, 256)));
  EXPECT_TRUE(same_bits(r1, r0));
  EXPECT_GE((*g0)->stats().stale_dropped, 1u);  // the epoch-1 write (and rank 1's abort)
  EXPECT_EQ((*g0)->epoch(), 2u);
}

// --- failures --------------------------------------------------------------------------------------

TEST_P(collectives, a_rank_that_leaves_mid_collective_fails_every_pending_call) {
  auto mesh = make_local_mesh(GetParam(), 3);
  ASSERT_TRUE(mesh);
  std::vector<std::thread> threads;
  std::vector<std::optional<error>> errors(3);
  for (std::uint32_t r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto g = group::create(r, row(*mesh, r), opts(1 << 14));
      ASSERT_TRUE(g) << g.error().describe();
      auto v = input(r, 0, 5000);
      auto first = (*g)->all_reduce(v, algorithm::ring);
      ASSERT_TRUE(first) << "rank " << r << ": " << first.error().describe();
      if (r == 2) {
        // Rank 2 goes away instead of taking part in the second all-reduce.
        for (auto& l : (*mesh)[2]) {
          if (l) l->close();
        }
        return;
      }
      for (auto algo : {algorithm::ring}) {
        auto res = (*g)->all_reduce(v, algo);
        ASSERT_FALSE(res) << "rank " << r;
        errors[r] = res.error();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << r;
    // closed (the link; also a write into the leaver's buffers, deregistered as it left, before
    // its link reported down) or cancelled (a peer's abort).
    EXPECT_TRUE(errors[r]->code == errc::closed || errors[r]->code == errc::cancelled)
        << errors[r]->describe();
  }
}

TEST_P(collectives, an_abort_from_outside_ends_a_wait_on_a_silent_peer_at_once) {
  // Rank 2 stays connected but silent (a paused process: its links report nothing). Without the
  // abort, ranks 0 and 1 would wait out the whole timeout (30 s here).
  auto mesh = make_local_mesh(GetParam(), 3);
  ASSERT_TRUE(mesh);
  std::vector<std::unique_ptr<group>> groups(3);
  {
    std::vector<std::thread> forming;
    for (std::uint32_t r = 0; r < 3; ++r) {
      forming.emplace_back([&, r] {
        auto g = group::create(r, row(*mesh, r), opts(1 << 14));
        ASSERT_TRUE(g) << g.error().describe();
        groups[r] = std::move(*g);
      });
    }
    for (auto& t : forming) t.join();
  }
  ASSERT_TRUE(groups[0] && groups[1] && groups[2]);
  std::vector<std::optional<error>> errors(2);
  std::vector<double> waited_s(2);
  std::vector<std::thread> ranks;
  for (std::uint32_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto v = input(r, 0, 3000);
      const auto t0 = std::chrono::steady_clock::now();
      auto res = groups[r]->all_reduce(v);
      waited_s[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!res) errors[r] = res.error();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  groups[0]->abort("member 2a left the view");
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(errors[0] && errors[1]);
  // Rank 0 names the reason; rank 1 learns it from rank 0's abort message.
  EXPECT_EQ(errors[0]->code, errc::cancelled) << errors[0]->describe();
  EXPECT_NE(errors[0]->message.find("member 2a left the view"), std::string::npos)
      << errors[0]->describe();
  EXPECT_EQ(errors[1]->code, errc::cancelled) << errors[1]->describe();
  EXPECT_NE(errors[1]->message.find("rank 0"), std::string::npos) << errors[1]->describe();
  for (std::uint32_t r = 0; r < 2; ++r) EXPECT_LT(waited_s[r], 10.0) << "rank " << r;
  // The group stays failed, and a second abort keeps the first reason.
  groups[0]->abort("another reason");
  auto v = input(0, 1, 100);
  auto again = groups[0]->all_reduce(v);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message.find("member 2a left the view"), std::string::npos)
      << again.error().describe();
}

INSTANTIATE_TEST_SUITE_P(backends, collectives,
                         ::testing::Values(backend_kind::tcp, backend_kind::shm),
                         [](const auto& p) { return std::string(bulk::to_string(p.param)); });

// --- separate processes ------------------------------------------------------------------------------

class collectives_processes : public ::testing::TestWithParam<backend_kind> {};

std::vector<std::vector<std::string>> peer_args(backend_kind kind, std::uint32_t n,
                                                const std::vector<std::string>& modes) {
  std::vector<std::vector<std::string>> a(n);
  for (std::uint32_t r = 1; r < n; ++r) {
    a[r] = {TESSERA_COLLECTIVES_PEER_PATH, std::string(bulk::to_string(kind)), std::to_string(n),
            std::to_string(r), modes[r]};
  }
  return a;
}

TEST_P(collectives_processes, three_processes_agree_bit_for_bit) {
  const std::uint32_t n = 3;
  auto m = launch_mesh(GetParam(), n, peer_args(GetParam(), n, {"", "reduce", "reduce"}));
  ASSERT_TRUE(m) << m.error().describe();
  auto g = group::create(0, pointers(m->links), opts(1 << 16));
  ASSERT_TRUE(g) << g.error().describe();
  // The peers run the same sequence (tessera_collectives_peer "reduce") and print fingerprints.
  std::vector<std::uint64_t> mine;
  for (std::uint32_t round = 0; round < 4; ++round) {
    const std::size_t len = round % 2 == 0 ? 1024 : 40000;
    auto v = input(0, round, len);
    ASSERT_TRUE((*g)->all_reduce(v)) << round;
    const auto want = len >= default_ring_threshold_floats ? ring_order_sum(n, round, len, 1 << 16)
                                                           : rank_order_sum(n, round, len);
    EXPECT_TRUE(same_bits(v, want)) << round;
    mine.push_back(fingerprint(v));
  }
  for (std::uint32_t r = 1; r < n; ++r) {
    for (std::uint32_t round = 0; round < 4; ++round) {
      EXPECT_EQ(m->children[r - 1]->read_line(), "sum " + std::to_string(mine[round]))
          << "rank " << r << " round " << round;
    }
    EXPECT_EQ(m->children[r - 1]->reap(), 0);
  }
}

TEST_P(collectives_processes, a_killed_peer_process_fails_the_pending_calls_of_every_rank) {
  const std::uint32_t n = 3;
  auto m = launch_mesh(GetParam(), n, peer_args(GetParam(), n, {"", "until-error", "stall"}));
  ASSERT_TRUE(m) << m.error().describe();
  auto g = group::create(0, pointers(m->links), opts(1 << 16));
  ASSERT_TRUE(g) << g.error().describe();
  auto v = input(0, 0, 1024);
  ASSERT_TRUE((*g)->all_reduce(v));
  // Rank 2 answered one all-reduce and now stalls; rank 1 is already waiting in the next one.
  EXPECT_EQ(m->children[1]->read_line(), "stalling");
  ::kill(m->children[1]->pid, SIGKILL);
  EXPECT_EQ(m->children[1]->reap(), 128 + SIGKILL);
  auto res = (*g)->all_reduce(v);
  ASSERT_FALSE(res);
  EXPECT_TRUE(res.error().code == errc::closed || res.error().code == errc::cancelled)
      << res.error().describe();
  const std::string line = m->children[0]->read_line();
  EXPECT_EQ(line.rfind("error ", 0), 0u) << line;
  EXPECT_EQ(m->children[0]->reap(), 0);
}

INSTANTIATE_TEST_SUITE_P(backends, collectives_processes,
                         ::testing::Values(backend_kind::tcp, backend_kind::shm),
                         [](const auto& p) { return std::string(bulk::to_string(p.param)); });

}  // namespace
}  // namespace tessera::inference::collectives
