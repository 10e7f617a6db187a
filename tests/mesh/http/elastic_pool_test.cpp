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

// At max_queued the caller waits (the gateway's accept loop: connections then stay in the kernel's
// backlog, holding none of the process's descriptors) until a thread takes a task, or until
// `release` is set.
TEST(ElasticPool, AtTheQueueBoundEnqueueWaitsUntilATaskIsTakenOrReleased) {
  std::atomic<bool> release{false};
  elastic_pool pool({.min_threads = 1,
                     .max_threads = 2,
                     .idle_exit_ms = 1000,
                     .name_prefix = "qb",
                     .max_queued = 2,
                     .release = &release});
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  std::atomic<int> started{0};
  for (int i = 0; i < 2; ++i)
    pool.enqueue([&, gate] {
      ++started;
      gate.wait();
    });
  ASSERT_TRUE(eventually([&] { return started.load() == 2; }));
  pool.enqueue([] {});  // queued: 1
  pool.enqueue([] {});  // queued: 2, the bound
  std::atomic<bool> fifth_in{false};
  std::thread caller([&] {
    pool.enqueue([] {});
    fifth_in = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(fifth_in.load()) << "enqueue past max_queued returned";
  open.set_value();  // the threads take the queued tasks: room again
  ASSERT_TRUE(eventually([&] { return fifth_in.load(); }));
  caller.join();
  // Released: no wait, whatever the queue holds.
  std::promise<void> open2;
  std::shared_future<void> gate2 = open2.get_future().share();
  for (int i = 0; i < 4; ++i)
    pool.enqueue([gate2] { gate2.wait(); });
  std::atomic<bool> released_in{false};
  std::thread late([&] {
    pool.enqueue([] {});
    released_in = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(released_in.load());
  release = true;
  ASSERT_TRUE(eventually([&] { return released_in.load(); }));
  late.join();
  open2.set_value();
  pool.shutdown();
}

}  // namespace
}  // namespace tessera::mesh::http
