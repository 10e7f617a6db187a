// Cluster secret: parsing, files, environment, and deterministic key derivation.
#include "transport/control/cluster_key.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <sodium.h>

namespace tessera::transport::control {
namespace {

namespace fs = std::filesystem;

class temp_dir {
 public:
  temp_dir() {
    char tmpl[] = "/tmp/tessera-key-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~temp_dir() { fs::remove_all(path_); }
  [[nodiscard]] std::string file(const char* name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

cluster_secret fixed_secret(std::uint8_t fill) {
  cluster_secret s;
  for (std::size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = static_cast<std::uint8_t>(fill + i);
  return s;
}

TEST(cluster_key_test, malformed_secrets_are_refused_without_echoing_them) {
  auto r = parse_cluster_secret("abc", "test");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  EXPECT_NE(r.error().message.find("found 3 characters"), std::string::npos);
  std::string bad_hex(64, 'a');
  bad_hex[10] = 'g';
  r = parse_cluster_secret(bad_hex, "test");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("position 10"), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().message.find(bad_hex), std::string::npos);
  r = parse_cluster_secret(std::string(40, '~'), "test");  // '~' is not in the z85 alphabet
  ASSERT_FALSE(r.has_value());
}

TEST(cluster_key_test, hex_and_z85_forms_round_trip) {
  auto s = fixed_secret(3);
  for (auto f : {secret_format::hex, secret_format::z85}) {
    auto text = format_cluster_secret(s, f);
    EXPECT_EQ(text.size(), f == secret_format::hex ? 64u : 40u);
    auto back = parse_cluster_secret("  " + text + "\n", "test");
    ASSERT_TRUE(back.has_value()) << back.error().describe();
    EXPECT_EQ(back->bytes, s.bytes);
  }
}

TEST(cluster_key_test, files_readable_by_others_are_refused) {
  temp_dir dir;
  const auto path = dir.file("key");
  auto text = format_cluster_secret(fixed_secret(1), secret_format::hex);
  ASSERT_TRUE(write_secret_file(path, text, false).has_value());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto r = read_cluster_secret_file(path);
  ASSERT_TRUE(r.has_value()) << r.error().describe();
  EXPECT_EQ(r->bytes, fixed_secret(1).bytes);
  ::chmod(path.c_str(), 0644);
  r = read_cluster_secret_file(path);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::unauthorized);
  EXPECT_NE(r.error().message.find("chmod 600"), std::string::npos);
  // No silent overwrite; --force (overwrite) also tightens the mode back to 0600.
  auto w = write_secret_file(path, text, false);
  ASSERT_FALSE(w.has_value());
  EXPECT_NE(w.error().message.find("exists"), std::string::npos);
  ASSERT_TRUE(write_secret_file(path, text, true).has_value());
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(read_cluster_secret_file(dir.file("missing")).has_value());
}

TEST(cluster_key_test, environment_takes_the_secret_or_a_file) {
  temp_dir dir;
  ::unsetenv(kClusterKeyEnv);
  auto r = load_cluster_secret(std::nullopt);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::not_found);
  auto text = format_cluster_secret(fixed_secret(9), secret_format::z85);
  ::setenv(kClusterKeyEnv, text.c_str(), 1);
  r = load_cluster_secret(std::nullopt);
  ASSERT_TRUE(r.has_value()) << r.error().describe();
  EXPECT_EQ(r->bytes, fixed_secret(9).bytes);
  const auto path = dir.file("k");
  ASSERT_TRUE(write_secret_file(path, format_cluster_secret(fixed_secret(5), secret_format::hex),
                                false)
                  .has_value());
  ::setenv(kClusterKeyEnv, ("@" + path).c_str(), 1);
  r = load_cluster_secret(std::nullopt);
  ASSERT_TRUE(r.has_value()) << r.error().describe();
  EXPECT_EQ(r->bytes, fixed_secret(5).bytes);
  // An explicit file wins over the environment.
  const auto path2 = dir.file("k2");
  ASSERT_TRUE(write_secret_file(path2, format_cluster_secret(fixed_secret(6), secret_format::hex),
                                false)
                  .has_value());
  r = load_cluster_secret(path2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->bytes, fixed_secret(6).bytes);
  ::unsetenv(kClusterKeyEnv);
}

TEST(cluster_key_test, derivation_is_deterministic_and_separates_clusters) {
  auto a1 = derive_cluster_keys(fixed_secret(1));
  auto a2 = derive_cluster_keys(fixed_secret(1));
  auto b = derive_cluster_keys(fixed_secret(2));
  ASSERT_TRUE(a1.has_value() && a2.has_value() && b.has_value());
  EXPECT_EQ(a1->cluster_id, a2->cluster_id);
  EXPECT_EQ(a1->server.public_key, a2->server.public_key);
  EXPECT_EQ(a1->client.secret_key, a2->client.secret_key);
  EXPECT_EQ(a1->cluster_id.size(), 32u);
  EXPECT_NE(a1->cluster_id, b->cluster_id);
  EXPECT_NE(a1->server.public_key, b->server.public_key);
  EXPECT_NE(a1->client.public_key, b->client.public_key);
  EXPECT_NE(a1->server.secret_key, a1->client.secret_key);
  // The public keys really belong to the secret keys.
  std::array<std::uint8_t, 32> pk{};
  ASSERT_EQ(crypto_scalarmult_base(pk.data(), a1->server.secret_key.data()), 0);
  EXPECT_EQ(pk, a1->server.public_key);
  // The cluster id (public) is not the secret nor a prefix of its text forms.
  auto hex = format_cluster_secret(fixed_secret(1), secret_format::hex);
  EXPECT_EQ(hex.find(a1->cluster_id), std::string::npos);
}

TEST(cluster_key_test, generated_secrets_differ) {
  auto a = generate_cluster_secret();
  auto b = generate_cluster_secret();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_NE(a->bytes, b->bytes);
}

TEST(cluster_key_test, the_client_access_key_is_its_own_and_round_trips_through_a_file) {
  auto k = derive_cluster_keys(fixed_secret(1));
  ASSERT_TRUE(k.has_value());
  // Separate from the peers' keys: a client holding it cannot pass the peers' ZAP check.
  EXPECT_NE(k->access.client.public_key, k->client.public_key);
  EXPECT_NE(k->access.server_public, k->server.public_key);
  EXPECT_EQ(k->access.server_public, k->client_endpoint.public_key);
  // The file holds neither the cluster secret nor any peer key.
  const std::string text = format_client_access(k->access);
  EXPECT_EQ(text.find(format_cluster_secret(fixed_secret(1), secret_format::z85)),
            std::string::npos);
  EXPECT_EQ(text.find(z85_key(k->client.secret_key)), std::string::npos);
  EXPECT_EQ(text.find(z85_key(k->client_endpoint.secret_key)), std::string::npos);

  temp_dir dir;
  const std::string path = dir.file("client.key");
  ASSERT_TRUE(write_secret_file(path, text, false).has_value());
  auto back = read_client_access_file(path);
  ASSERT_TRUE(back.has_value()) << back.error().describe();
  EXPECT_EQ(back->server_public, k->access.server_public);
  EXPECT_EQ(back->client.secret_key, k->access.client.secret_key);
  EXPECT_EQ(back->cluster_id, k->cluster_id);
  // Like the cluster key: refused when others may read it.
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto open = read_client_access_file(path);
  ASSERT_FALSE(open.has_value());
  EXPECT_EQ(open.error().code, errc::unauthorized);
}

TEST(cluster_key_test, damaged_client_access_keys_are_refused_by_name) {
  auto k = derive_cluster_keys(fixed_secret(1));
  ASSERT_TRUE(k.has_value());
  const std::string good = format_client_access(k->access);
  auto refused = [](std::string_view text, std::string_view says) {
    auto r = parse_client_access(text, "client.key");
    ASSERT_FALSE(r.has_value()) << text;
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("client.key"), std::string::npos) << r.error().message;
  };
  refused("", "not a client access key");
  refused("server-public abc", "not a 40-character z85 key");
  refused("colour blue", "line 1: not a line of a client access key");
  // A cluster secret file given by mistake is not an access key, and the error does not show it.
  const std::string secret_text = format_cluster_secret(fixed_secret(1), secret_format::hex);
  refused(secret_text, "a cluster key file?");
  auto leak = parse_client_access(secret_text, "client.key");
  ASSERT_FALSE(leak.has_value());
  EXPECT_EQ(leak.error().message.find(secret_text.substr(0, 8)), std::string::npos);
  // A secret that does not match its public key (one character changed).
  std::string bad = good;
  const auto at = bad.find("client-secret ") + 14;
  bad[at] = bad[at] == 'a' ? 'b' : 'a';
  refused(bad, "does not belong to client-secret");
  EXPECT_TRUE(parse_client_access(good, "client.key").has_value());
}

}  // namespace
}  // namespace tessera::transport::control
