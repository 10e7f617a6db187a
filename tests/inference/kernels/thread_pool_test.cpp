// Compute thread pool: every index runs exactly once per task, results are visible to the caller,
// pools start and stop cleanly (also under ThreadSanitizer), bad sizes are refused.
#include "inference/kernels/thread_pool.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "inference/kernels/matmul.hpp"

namespace tessera::inference {
namespace {

TEST(thread_pool, refuses_sizes_outside_the_bounds) {
  for (int n : {0, -1, thread_pool::max_threads + 1}) {
    auto p = thread_pool::create(n);
    ASSERT_FALSE(p) << n;
    EXPECT_EQ(p.error().code, errc::invalid_argument);
  }
}

TEST(thread_pool, runs_every_index_once_per_task) {
  for (int n : {1, 2, 3, 5}) {
    auto pool = thread_pool::create(n);
    ASSERT_TRUE(pool);
    ASSERT_EQ((*pool)->size(), n);
    std::vector<int> counts(static_cast<std::size_t>(n), 0);  // plain ints: the pool orders them
    for (int task = 0; task < 300; ++task) {
      (*pool)->run([&](int index, int size) {
        ASSERT_EQ(size, n);
        counts[static_cast<std::size_t>(index)] += 1;
      });
    }
    for (int c : counts) EXPECT_EQ(c, 300) << "pool of " << n;
  }
}

TEST(thread_pool, wakes_sleeping_workers) {
  // A zero spin budget makes every hand-off go through the futex path.
  auto pool = thread_pool::create(3, {.pin = false, .spin_us = 0});
  ASSERT_TRUE(pool);
  std::atomic<int> sum{0};
  for (int task = 0; task < 200; ++task) {
    (*pool)->run([&](int index, int) { sum.fetch_add(index + 1, std::memory_order_relaxed); });
  }
  EXPECT_EQ(sum.load(), 200 * (1 + 2 + 3));
}

// Two pools of `size` threads, `gate` shared or not: pool a runs `runs_a` tasks from this thread
// while pool b runs `runs_b` from another. Every task sleeps a while (so tasks of the two pools
// would overlap whatever the scheduler does, unless the gate keeps them apart). Returns the most
// task bodies seen running at once, and how many of a's tasks had ended when b's last one did.
struct overlap_result {
  int most = 0;
  int a_done_when_b_finished = 0;
};
overlap_result run_two_pools(std::shared_ptr<compute_gate> gate, int size, int runs_a, int runs_b) {
  auto a = thread_pool::create(size, {.pin = false, .gate = gate});
  auto b = thread_pool::create(size, {.pin = false, .gate = gate});
  EXPECT_TRUE(a && b);
  std::atomic<int> inside{0}, most{0}, a_done{0};
  auto task = [&](int, int) {
    const int now = inside.fetch_add(1) + 1;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    inside.fetch_sub(1);
  };
  overlap_result r;
  std::thread tb([&] {
    for (int i = 0; i < runs_b; ++i)
      (*b)->run(task);
    r.a_done_when_b_finished = a_done.load();
  });
  for (int i = 0; i < runs_a; ++i) {
    (*a)->run(task);
    a_done.fetch_add(1);
  }
  tb.join();
  r.most = most.load();
  return r;
}

// Pools sharing a compute_gate (a node's engine and its split groups) never run tasks at the same
// time: at most the largest pool's threads compute at once. And the gate is fair: a pool that
// runs task after task does not shut out another that asks in between.
TEST(compute_gate, pools_sharing_a_gate_run_one_task_at_a_time_and_take_turns) {
  auto gate = std::make_shared<compute_gate>();
  const auto r = run_two_pools(gate, 2, 400, 50);
  EXPECT_LE(r.most, 2) << "two pools' tasks overlapped";
  // Taking turns, b's 50 tasks end while a is still far from its 400.
  EXPECT_LT(r.a_done_when_b_finished, 300) << "pool b waited behind a's tasks";
  EXPECT_GT(gate->waits(), 0u);
}

// Without a gate the same two pools overlap: the measure above can tell.
TEST(compute_gate, pools_without_a_gate_overlap) {
  EXPECT_GT(run_two_pools(nullptr, 1, 100, 100).most, 1);
}

TEST(thread_pool, threaded_matmul_is_race_free_and_matches) {
  const std::int64_t rows = 33, cols = 64, tokens = 3;
  std::vector<float> src(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>((i * 37) % 19) - 9.0f;
  std::vector<std::uint8_t> w(*row_bytes(tensor_type::q8_0, cols) * rows);
  ASSERT_TRUE(quantize_row(tensor_type::q8_0, src.data(), w.data(), rows * cols));
  std::vector<float> x(static_cast<std::size_t>(tokens * cols), 0.5f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.25f;
  std::vector<float> y1(static_cast<std::size_t>(rows * tokens)), y2(y1.size());
  const weight_view view{tensor_type::q8_0, rows, cols, w.data(), 0};
  ASSERT_TRUE(matmul(view, x.data(), tokens, y1.data()));
  auto pool = thread_pool::create(2);
  ASSERT_TRUE(pool);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(matmul(view, x.data(), tokens, y2.data(), pool->get()));
    ASSERT_EQ(y1, y2);
  }
}

}  // namespace
}  // namespace tessera::inference
