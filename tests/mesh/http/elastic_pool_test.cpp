#include "mesh/http/elastic_pool.hpp"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace tessera::mesh::http {
namespace {

using namespace std::chrono_literals;

template <class F>
bool eventually(F f, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f();
}

TEST(ElasticPool, GrowsWithBlockedTasksUpToTheBoundAndShrinksWhenIdle) {
  elastic_pool pool({.min_threads = 1, .max_threads = 4, .idle_exit_ms = 200, .name_prefix = "tp"});
  EXPECT_EQ(pool.threads(), 1u);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> started{0}, finished{0};
  for (int i = 0; i < 6; ++i)
    pool.enqueue([&, gate] {
      ++started;
      gate.wait();
      ++finished;
    });
  // Four run at once (the bound); two wait in the queue.
  ASSERT_TRUE(eventually([&] { return started.load() == 4; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(started.load(), 4);
  EXPECT_EQ(pool.threads(), 4u);
  release.set_value();
  ASSERT_TRUE(eventually([&] { return finished.load() == 6; }));
  EXPECT_EQ(pool.peak_threads(), 4u);
  // Idle threads leave, down to the minimum.
  ASSERT_TRUE(eventually([&] { return pool.threads() == 1; }));
  // And it grows again.
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i)
    pool.enqueue([&] { ++ran; });
  ASSERT_TRUE(eventually([&] { return ran.load() == 3; }));
}

TEST(ElasticPool, NamesItsThreadsAndRunsWhatIsQueuedBeforeShutdown) {
  elastic_pool pool(
      {.min_threads = 0, .max_threads = 2, .idle_exit_ms = 1000, .name_prefix = "np"});
  EXPECT_EQ(pool.threads(), 0u);
  std::promise<std::string> name;
  pool.enqueue([&] {
    char buf[16] = {};
    pthread_getname_np(pthread_self(), buf, sizeof buf);
    name.set_value(buf);
  });
  EXPECT_EQ(name.get_future().get(), "np-0");
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i)
    pool.enqueue([&] {
      std::this_thread::sleep_for(1ms);
      ++ran;
    });
  pool.shutdown();
  EXPECT_EQ(ran.load(), 20);
  EXPECT_EQ(pool.threads(), 0u);
  pool.shutdown();  // idempotent
}

}  // namespace
}  // namespace tessera::mesh::http
