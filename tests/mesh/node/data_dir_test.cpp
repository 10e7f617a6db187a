#include "mesh/node/data_dir.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/support/child_process.hpp"

namespace tessera::mesh {
namespace {

namespace fs = std::filesystem;

class data_dir_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-datadir-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path dir(const char* name) const { return root_ / name; }
  static void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  static bool contains(const std::string& hay, const std::string& needle) {
    return hay.find(needle) != std::string::npos;
  }
  fs::path root_;
};

TEST_F(data_dir_test, a_data_dir_path_that_is_a_file_is_refused) {
  write(dir("file"), "x");
  auto d = data_dir::open(dir("file"));
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, errc::invalid_argument);
  EXPECT_TRUE(contains(d.error().message, "not a directory")) << d.error().message;
}

// A directory the node creates is 0700; an existing one keeps its mode, and one that group or
// others may write (they could replace the identity) is used with a warning that says so.
TEST_F(data_dir_test, an_existing_dir_others_can_write_is_used_with_a_warning) {
  auto fresh = data_dir::open(dir("fresh"));
  ASSERT_TRUE(fresh) << fresh.error().describe();
  EXPECT_EQ(fs::status(dir("fresh")).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(fresh->warning(), "");
  fs::create_directories(dir("open"));
  fs::permissions(dir("open"), fs::perms::all);
  auto open = data_dir::open(dir("open"));
  ASSERT_TRUE(open) << open.error().describe();
  EXPECT_TRUE(contains(open->warning(), "writable by group or others (mode 777)"))
      << open->warning();
  EXPECT_TRUE(contains(open->warning(), dir("open").string())) << open->warning();
}

TEST_F(data_dir_test, an_empty_path_is_refused) {
  EXPECT_EQ(data_dir::open("").error().code, errc::invalid_argument);
}

TEST_F(data_dir_test, a_corrupt_node_id_file_is_refused_naming_the_file) {
  fs::create_directories(dir("a"));
  write(dir("a") / "node.id", "this is not json");
  auto d = data_dir::open(dir("a"));
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, errc::corrupt);
  EXPECT_TRUE(contains(d.error().message, (dir("a") / "node.id").string())) << d.error().message;
  EXPECT_TRUE(contains(d.error().message, "--reset-identity"));
}

TEST_F(data_dir_test, node_id_files_with_bad_fields_are_refused) {
  auto record = [] {
    identity_record r;
    r.id = node_id{1, 2};
    r.created_in.path = "/x";
    r.created_in.inode = 5;
    return r;
  }();
  std::string good = encode_identity(record);
  ASSERT_TRUE(decode_identity(good, "node.id"));
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_EQ(decode_identity(replace("\"format\": 1", "\"format\": 2"), "f").error().code,
            errc::unsupported);
  EXPECT_EQ(
      decode_identity(
          replace("00000000000000010000000000000002", "00000000000000000000000000000000"), "f")
          .error()
          .code,
      errc::corrupt);
  EXPECT_EQ(decode_identity(replace("00000000000000010000000000000002", "xyz"), "f").error().code,
            errc::corrupt);
  EXPECT_EQ(decode_identity(replace("\"inode\": 5", "\"inode\": \"5\""), "f").error().code,
            errc::corrupt);
  EXPECT_EQ(decode_identity(replace("\"created_in\"", "\"elsewhere\""), "f").error().code,
            errc::corrupt);
  EXPECT_EQ(decode_identity("[1,2]", "f").error().code, errc::corrupt);
}

TEST_F(data_dir_test, a_copied_data_dir_is_refused_as_a_duplicate_identity) {
  node_id original;
  {
    auto d = data_dir::open(dir("a"));
    ASSERT_TRUE(d) << d.error().describe();
    original = d->id();
  }
  fs::copy(dir("a"), dir("copy"), fs::copy_options::recursive);
  auto c = data_dir::open(dir("copy"));
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, errc::invalid_argument);
  const auto& m = c.error().message;
  EXPECT_TRUE(contains(m, "duplicate node identity")) << m;
  EXPECT_TRUE(contains(m, (dir("copy") / "node.id").string())) << m;
  EXPECT_TRUE(contains(m, dir("a").string())) << m;
  EXPECT_TRUE(contains(m, original.to_string())) << m;
  EXPECT_TRUE(contains(m, "--reset-identity")) << m;
  // Not silently repaired: the copy is refused again, and the original still opens.
  EXPECT_FALSE(data_dir::open(dir("copy")));
  auto a = data_dir::open(dir("a"));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id(), original);
}

TEST_F(data_dir_test, a_copy_put_in_place_of_the_original_is_refused_by_inode) {
  {
    auto d = data_dir::open(dir("a"));
    ASSERT_TRUE(d);
  }
  fs::rename(dir("a"), dir("a.orig"));
  fs::copy(dir("a.orig"), dir("a"), fs::copy_options::recursive);
  auto d = data_dir::open(dir("a"));
  ASSERT_FALSE(d);
  EXPECT_TRUE(contains(d.error().message, "inode")) << d.error().message;
}

TEST_F(data_dir_test, reset_identity_gives_a_copy_a_new_identity_that_then_sticks) {
  node_id original;
  {
    auto d = data_dir::open(dir("a"));
    ASSERT_TRUE(d);
    original = d->id();
  }
  fs::copy(dir("a"), dir("copy"), fs::copy_options::recursive);
  node_id fresh;
  {
    auto c = data_dir::open(dir("copy"), {.reset_identity = true});
    ASSERT_TRUE(c) << c.error().describe();
    EXPECT_TRUE(c->created_identity());
    fresh = c->id();
    EXPECT_NE(fresh, original);
  }
  auto again = data_dir::open(dir("copy"));
  ASSERT_TRUE(again) << again.error().describe();
  EXPECT_EQ(again->id(), fresh);
  EXPECT_FALSE(again->created_identity());
}

TEST_F(data_dir_test, identity_is_created_once_then_persisted_and_reused) {
  node_id first;
  {
    auto d = data_dir::open(dir("nested/a"));
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_TRUE(d->created_identity());
    first = d->id();
    EXPECT_FALSE(first.is_zero());
    EXPECT_EQ(d->identity().created_in.path, fs::canonical(dir("nested/a")).string());
    EXPECT_TRUE(fs::exists(dir("nested/a") / "node.id"));
    EXPECT_EQ(fs::status(dir("nested/a")).permissions() & fs::perms::others_all, fs::perms::none);
  }
  auto d = data_dir::open(dir("nested/a"));
  ASSERT_TRUE(d) << d.error().describe();
  EXPECT_FALSE(d->created_identity());
  EXPECT_EQ(d->id(), first);
}

TEST_F(data_dir_test, a_data_dir_locked_by_a_running_process_is_refused) {
  fs::create_directories(dir("a"));
  int to_child[2];
  int to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto d = data_dir::open(dir("a"));
    char c = d ? 'y' : 'n';
    [[maybe_unused]] auto w = ::write(to_parent[1], &c, 1);
    [[maybe_unused]] auto r = ::read(to_child[0], &c, 1);  // hold the lock until told
    ::_exit(d ? 0 : 1);
  }
  char ready = 0;
  ASSERT_EQ(::read(to_parent[0], &ready, 1), 1);
  ASSERT_EQ(ready, 'y');
  auto refused = data_dir::open(dir("a"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::io);
  EXPECT_TRUE(contains(refused.error().message, fmt::format("pid {}", pid)))
      << refused.error().message;
  EXPECT_TRUE(contains(refused.error().message, "in use by another process"));
  char go = 'x';
  ASSERT_EQ(::write(to_child[1], &go, 1), 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The lock dies with its process.
  auto after = data_dir::open(dir("a"));
  EXPECT_TRUE(after) << after.error().describe();
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]})
    ::close(fd);
}

TEST_F(data_dir_test, the_lock_is_held_while_open_and_released_on_destruction) {
  {
    auto d = data_dir::open(dir("a"));
    ASSERT_TRUE(d);
    auto moved = std::move(d).value();  // moving keeps the lock
    EXPECT_FALSE(data_dir::open(dir("a")));
  }
  EXPECT_TRUE(data_dir::open(dir("a")));
}

dir_fingerprint place(std::string machine, std::string host, std::string path = "/d",
                      std::uint64_t inode = 9, std::uint64_t device = 1) {
  return {std::move(path), device, inode, std::move(machine), std::move(host), "boot"};
}

TEST(identity_home, a_record_from_another_machine_is_refused) {
  identity_record r;
  r.id = node_id{3, 4};
  r.created_in = place("m1", "host-a");
  auto e = check_identity_home(r, place("m2", "host-b"), "/d/node.id");
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("machine m1 (host host-a)"), std::string::npos)
      << e.error().message;
}

TEST(identity_home, without_machine_ids_the_hostname_decides) {
  identity_record r;
  r.created_in = place("", "host-a");
  EXPECT_FALSE(check_identity_home(r, place("", "host-b"), "/d/node.id"));
  EXPECT_TRUE(check_identity_home(r, place("", "host-a"), "/d/node.id"));
}

TEST(identity_home, a_changed_device_number_alone_is_accepted) {
  identity_record r;
  r.created_in = place("m1", "h", "/d", 9, 1);
  EXPECT_TRUE(check_identity_home(r, place("m1", "h", "/d", 9, 2), "/d/node.id"));
  EXPECT_FALSE(check_identity_home(r, place("m1", "h", "/d", 10, 1), "/d/node.id"));
  EXPECT_FALSE(check_identity_home(r, place("m1", "h", "/e", 9, 1), "/d/node.id"));
}

}  // namespace
}  // namespace tessera::mesh
