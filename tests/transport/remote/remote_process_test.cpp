// Remote actors across two processes: node 2 is tessera_remote_peer, a real separate process.
// Killing it with SIGKILL (no goodbye on the wire) must give every watcher of its actors a `down`
// naming the lost node, and fail the requests waiting on it long before their deadline.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <future>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/transport/remote/test_support.hpp"
#include "transport/remote/control_router.hpp"

namespace tessera::transport::remote {
namespace {
using namespace std::chrono_literals;
using actors::actor_ref;
using test::ping;
using test::pong;
using test::wait_for;

class peer_process {
 public:
  peer_process(const std::string& secret_hex, const std::string& our_endpoint) {
    int in[2], out[2];
    EXPECT_EQ(::pipe(in), 0);
    EXPECT_EQ(::pipe(out), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      ::execl(TESSERA_REMOTE_PEER, TESSERA_REMOTE_PEER, secret_hex.c_str(), our_endpoint.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = ::fdopen(out[0], "r");
  }
  ~peer_process() {
    kill9();
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ != nullptr) std::fclose(stdout_);
  }
  /// Parses "ready <endpoint> <echo id> <silent id>"; false at EOF or on anything else.
  bool ready() {
    char buf[512];
    if (std::fgets(buf, sizeof buf, stdout_) == nullptr) return false;
    std::istringstream line(buf);
    std::string word;
    line >> word >> endpoint >> echo_id >> silent_id;
    return word == "ready" && !endpoint.empty() && echo_id != 0 && silent_id != 0;
  }
  void kill9() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  std::string endpoint;
  actors::actor_id echo_id = 0;
  actors::actor_id silent_id = 0;

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  std::FILE* stdout_ = nullptr;
};

TEST(remote_process, KilledNodeGivesDownsWithReasonAndFailsPendingRequestsPromptly) {
  actors::config cfg;
  cfg.node = 1;
  cfg.workers = 2;
  actors::actor_system sys(cfg);
  auto node = remote_node::start(sys, test::control_config("node-1", test::kSecretHex));
  ASSERT_TRUE(node) << node.error().describe();
  peer_process peer(test::kSecretHex, (*node)->endpoint());
  ASSERT_TRUE(peer.ready());
  ASSERT_TRUE((*node)->add_node(2, "node-2", peer.endpoint));
  const actor_ref echo(2, peer.echo_id);
  const actor_ref silent(2, peer.silent_id);

  // Working across processes: request/response, a missing actor, a deadline.
  auto r = sys.ask<pong>(echo, ping{41}, 30s);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(r->seq, 41u);
  auto missing = sys.ask<pong>(actor_ref(2, 777777), ping{1}, 30s);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::not_found);
  auto late = sys.ask<pong>(silent, ping{1}, 200ms);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, errc::timeout);

  test::down_log log;
  auto w = sys.spawn<test::watcher>(log);
  ASSERT_TRUE(w);
  ASSERT_TRUE(sys.monitor(echo, *w));
  ASSERT_TRUE(sys.monitor(silent, *w));
  ASSERT_TRUE(wait_for([&] { return (*node)->router().stats().watches_sent == 2; }));
  // The timed-out request above is still tracked (its late answer may yet come): count from here.
  const std::size_t tracked_before = (*node)->router().tracked_requests();
  std::promise<result<pong>> answer;
  auto future = answer.get_future();
  ASSERT_TRUE(sys.request<pong>(silent, ping{2}, std::chrono::hours(1),
                                [&answer](result<pong> v) { answer.set_value(std::move(v)); }));
  ASSERT_TRUE(wait_for([&] { return (*node)->router().tracked_requests() == tracked_before + 1; }));
  // The watches reached node 2 before the kill: a round trip on the same link proves it.
  ASSERT_TRUE(sys.ask<pong>(echo, ping{3}, 30s));

  peer.kill9();

  ASSERT_TRUE(wait_for([&] { return log.size() == 2; })) << log.size();
  for (const auto& d : log.all()) {
    EXPECT_TRUE(d.who == echo || d.who == silent);
    EXPECT_EQ(d.reason.kind, actors::exit_kind::unknown);
    EXPECT_EQ(d.reason.detail.rfind("node 2 lost: ", 0), 0u) << d.reason.detail;
  }
  ASSERT_EQ(future.wait_for(test::kWait), std::future_status::ready);
  auto failed = future.get();
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, errc::closed);
  EXPECT_NE(failed.error().message.find("node 2 lost"), std::string::npos)
      << failed.error().message;
  auto after = sys.ask<pong>(echo, ping{4}, std::chrono::hours(1));
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, errc::closed);
  sys.shutdown();
  (*node)->stop();
}

TEST(remote_process, APeerProcessWithAnotherSecretCannotReachOurActors) {
  actors::config cfg;
  cfg.node = 1;
  cfg.workers = 1;
  actors::actor_system sys(cfg);
  std::atomic<std::uint64_t> seen{0};
  auto e = sys.spawn<test::echo>(&seen);
  ASSERT_TRUE(e);
  auto node = remote_node::start(sys, test::control_config("node-1", test::kSecretHex));
  ASSERT_TRUE(node);
  // The foreign process knows our endpoint and maps node 1, but holds another cluster's secret.
  peer_process peer(test::kForeignSecretHex, (*node)->endpoint());
  ASSERT_TRUE(peer.ready());
  ASSERT_TRUE((*node)->add_node(2, "node-2", peer.endpoint));
  ASSERT_TRUE(wait_for([&] {
    auto s = (*node)->control().stats();
    return s.zap_denied + s.handshake_failed_inbound > 0 && s.handshake_failed_outbound > 0;
  }));
  // Our requests to it cannot get through either.
  auto r = sys.ask<pong>(actor_ref(2, peer.echo_id), ping{1}, 500ms);
  ASSERT_FALSE(r);
  EXPECT_EQ((*node)->router().stats().envelopes_received, 0u);
  EXPECT_EQ(seen.load(), 0u);
  sys.shutdown();
  (*node)->stop();
}

}  // namespace
}  // namespace tessera::transport::remote
