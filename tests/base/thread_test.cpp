#include "actors/base/thread.hpp"

#include <pthread.h>

#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(ThreadRoles, CountsNamedThreadsBySlotlessRole) {
  std::promise<void> named_a, named_b, release;
  auto gate = release.get_future().share();
  std::thread a([&, gate] {
    name_this_thread("roletest-0");
    named_a.set_value();
    gate.wait();
  });
  std::thread b([&, gate] {
    name_this_thread("roletest-1");
    named_b.set_value();
    gate.wait();
  });
  named_a.get_future().wait();
  named_b.get_future().wait();
  const auto roles = thread_roles();
  release.set_value();
  a.join();
  b.join();
  ASSERT_TRUE(roles.contains("roletest")) << "roles read: " << roles.size();
  EXPECT_EQ(roles.at("roletest"), 2u);
  EXPECT_FALSE(roles.contains("roletest-0"));
  EXPECT_FALSE(thread_roles().contains("roletest"));  // they are gone
}

TEST(ThreadNames, LongNamesAreCutToTheKernelsLimit) {
  std::thread t([] {
    name_this_thread("a-name-longer-than-fifteen-bytes");
    char buf[32] = {};
    pthread_getname_np(pthread_self(), buf, sizeof buf);
    EXPECT_STREQ(buf, "a-name-longer-t");
  });
  t.join();
}

}  // namespace
}  // namespace tessera
