// Two processes: this test's node and tessera_control_peer (a real second process). A peer with
// the cluster secret exchanges messages and survives a restart; a process holding another
// cluster's secret can neither join, read nor inject.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "tests/transport/control/test_support.hpp"
#include "transport/control/control_node.hpp"

namespace tessera::transport::control {
namespace {

using test::inbox;
using test::int_body;
using test::wait_for;

class child_process {
 public:
  explicit child_process(const std::vector<std::string>& args) {
    int in[2], out[2];
    EXPECT_EQ(::pipe(in), 0);
    EXPECT_EQ(::pipe(out), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[1]);
      ::close(out[0]);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = ::fdopen(out[0], "r");
  }
  ~child_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_) std::fclose(stdout_);
  }
  /// The next line of the child's stdout ("" at EOF).
  std::string line() {
    char buf[512];
    if (std::fgets(buf, sizeof buf, stdout_) == nullptr) return {};
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  /// Closes the child's stdin and returns its "final ..." line.
  std::string finish() {
    ::close(stdin_);
    stdin_ = -1;
    std::string last, l;
    while (!(l = line()).empty()) last = l;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return last;
  }
  void kill9() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  std::FILE* stdout_ = nullptr;
};

class control_process_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-ctl-proc-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    mine_ = write_key("mine");
    theirs_ = write_key("theirs");
    auto secret = read_cluster_secret_file(mine_);
    ASSERT_TRUE(secret.has_value());
    auto c = test::config("node", *derive_cluster_keys(*secret), 800);
    auto r = control_node::start(c, in_.handlers());
    ASSERT_TRUE(r.has_value());
    node_ = std::move(*r);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write_key(const char* name) {
    auto path = (dir_ / name).string();
    auto s = generate_cluster_secret();
    EXPECT_TRUE(write_secret_file(path, format_cluster_secret(*s, secret_format::hex), false));
    return path;
  }
  std::unique_ptr<child_process> spawn(const std::string& key, const std::string& bind) {
    auto c = std::make_unique<child_process>(std::vector<std::string>{
        TESSERA_CONTROL_PEER, "--id", "peer", "--key", key, "--bind", bind, "--peer",
        "node=" + node_->endpoint()});
    auto l = c->line();
    EXPECT_TRUE(l.starts_with("endpoint ")) << l;
    endpoint_ = l.size() > 9 ? l.substr(9) : std::string();
    return c;
  }
  bool ping(std::int64_t v) {
    const auto before = in_.message_count();
    const auto body = int_body(v);
    if (!node_->send("peer", 64, as_bytes(body))) return false;
    return wait_for([&] { return in_.message_count() > before; });
  }

  std::filesystem::path dir_;
  std::string mine_, theirs_, endpoint_;
  inbox in_;
  std::unique_ptr<control_node> node_;
};

TEST_F(control_process_test, a_process_with_another_clusters_secret_cannot_join_read_or_inject) {
  auto child = spawn(theirs_, "tcp://127.0.0.1:*");
  ASSERT_TRUE(node_->add_peer("peer", endpoint_).has_value());
  for (int i = 0; i < 5; ++i) {
    const auto body = int_body(i);
    ASSERT_TRUE(node_->send("peer", 64, as_bytes(body)).has_value());
  }
  // Both directions are refused: the child's DEALER at our ROUTER, ours at the child's.
  ASSERT_TRUE(wait_for([&] {
    auto s = node_->stats();
    return s.handshake_failed_outbound >= 2 && s.handshake_failed_inbound >= 2;
  }));
  auto final_line = child->finish();
  EXPECT_NE(final_line.find("final received=0 "), std::string::npos) << final_line;
  EXPECT_EQ(in_.message_count(), 0u);
  EXPECT_EQ(in_.count_events(peer_event_kind::up, "peer"), 0u);
}

TEST_F(control_process_test, a_member_process_exchanges_messages_and_survives_a_restart) {
  auto child = spawn(mine_, "tcp://127.0.0.1:*");
  ASSERT_TRUE(node_->add_peer("peer", endpoint_).has_value());
  ASSERT_TRUE(ping(1));
  EXPECT_EQ(in_.messages().back().sender, "peer");
  EXPECT_EQ(test::body_int(in_.messages().back().body), 1);
  child->kill9();
  ASSERT_TRUE(wait_for([&] { return in_.count_events(peer_event_kind::down, "peer") == 1; }));
  const std::string ep = endpoint_;
  std::unique_ptr<child_process> again;
  // The old port is free again once the kernel has closed the dead process's sockets.
  ASSERT_TRUE(wait_for([&] {
    again = std::make_unique<child_process>(std::vector<std::string>{
        TESSERA_CONTROL_PEER, "--id", "peer", "--key", mine_, "--bind", ep, "--peer",
        "node=" + node_->endpoint()});
    return again->line() == "endpoint " + ep;
  }));
  ASSERT_TRUE(wait_for([&] { return in_.count_events(peer_event_kind::up, "peer") == 2; }));
  ASSERT_TRUE(ping(2));
  EXPECT_EQ(test::body_int(in_.messages().back().body), 2);
  auto final_line = again->finish();
  EXPECT_NE(final_line.find("final received=1 "), std::string::npos) << final_line;
}

}  // namespace
}  // namespace tessera::transport::control
