#include "mesh/node/config.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

namespace fs = std::filesystem;

class config_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-config-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string file(const std::string& text) {
    std::string p = (root_ / fmt::format("c{}.toml", n_++)).string();
    std::ofstream(p) << text;
    return p;
  }
  // Resolves with just a file; returns the error message ("" on success).
  std::string file_error(const std::string& text) {
    config_layers l;
    l.file = file(text);
    auto r = resolve_config(l);
    return r ? "" : r.error().message;
  }
  std::string env_error(std::vector<std::string> env) {
    config_layers l;
    l.environment = std::move(env);
    auto r = resolve_config(l);
    return r ? "" : r.error().message;
  }
  std::string flag_error(std::string key, std::string value) {
    config_layers l;
    l.flags = {{std::move(key), std::move(value)}};
    auto r = resolve_config(l);
    return r ? "" : r.error().message;
  }
  static bool has(const std::string& hay, const std::string& needle) {
    return hay.find(needle) != std::string::npos;
  }
  fs::path root_;
  int n_ = 0;
};

TEST_F(config_test, a_missing_file_is_an_error_naming_it) {
  config_layers l;
  l.file = (root_ / "absent.toml").string();
  auto r = resolve_config(l);
  ASSERT_FALSE(r);
  EXPECT_TRUE(has(r.error().message, "absent.toml")) << r.error().message;
}

TEST_F(config_test, a_toml_syntax_error_names_file_line_and_column) {
  auto m = file_error("data_dir = \"/x\"\n[listen\ncontrol_port = 1\n");
  EXPECT_TRUE(has(m, ".toml:2:")) << m;
  EXPECT_TRUE(has(m, "TOML syntax error")) << m;
}

TEST_F(config_test, an_unknown_key_names_the_key_and_line) {
  auto m = file_error("data_dir = \"/x\"\n[discovery]\nmdsn = true\n");
  EXPECT_TRUE(has(m, ".toml:3:1: unknown key 'discovery.mdsn'")) << m;
}

TEST_F(config_test, an_unknown_section_is_an_error) {
  auto m = file_error("[lisen]\ncontrol_port = 1\n");
  EXPECT_TRUE(has(m, "unknown section [lisen]")) << m;
}

TEST_F(config_test, a_flag_only_key_in_the_file_is_refused) {
  auto m = file_error("reset_identity = true\n");
  EXPECT_TRUE(has(m, "unknown key 'reset_identity' (allowed only as a flag")) << m;
}

TEST_F(config_test, wrong_types_in_the_file_name_key_and_expected_type) {
  EXPECT_TRUE(has(file_error("[listen]\ncontrol_port = \"7400\"\n"),
                  ":2:16: key 'listen.control_port': expected an integer, got a TOML string"));
  EXPECT_TRUE(
      has(file_error("[discovery]\nmdns = 1\n"), "key 'discovery.mdns': expected true or false"));
  EXPECT_TRUE(has(file_error("data_dir = 3\n"), "key 'data_dir': expected a string"));
  EXPECT_TRUE(has(file_error("[discovery]\nseeds = \"a:1\"\n"), "expected an array of strings"));
  EXPECT_TRUE(
      has(file_error("[discovery]\nseeds = [\"a:1\", 2]\n"), "array items must be strings"));
}

TEST_F(config_test, out_of_range_and_malformed_values_in_the_file_are_errors) {
  auto m = file_error("[listen]\ncontrol_port = 70000\n");
  EXPECT_TRUE(has(m, "key 'listen.control_port': 70000 is out of range 0..65535")) << m;
  EXPECT_TRUE(has(file_error("[listen]\ncontrol_port = -1\n"), "-1 is negative"));
  EXPECT_TRUE(has(file_error("[discovery]\nbeacon_interval_ms = 10\n"), "out of range 50..60000"));
  EXPECT_TRUE(has(file_error("[discovery]\nbeacon_port = 0\n"), "out of range 1..65535"));
  EXPECT_TRUE(has(file_error("[discovery]\nseeds = [\"nohost\"]\n"), "expected host:port"));
  EXPECT_TRUE(has(file_error("[discovery]\nseeds = [\"h:0\"]\n"), "port must be a number"));
  EXPECT_TRUE(
      has(file_error("[discovery]\nbeacon_address = \"239.1\"\n"), "is not an IPv4 address"));
  EXPECT_TRUE(has(file_error("[discovery]\nbeacon_interface = \"an-interface-name-too-long\"\n"),
                  "longer than an interface name"));
  EXPECT_TRUE(has(file_error("[log]\nlevel = \"loud\"\n"), "'loud' is not one of: trace"));
  EXPECT_TRUE(has(file_error("cluster_name = \"a b\"\n"), "key 'cluster_name'"));
  EXPECT_TRUE(has(file_error("data_dir = \"\"\n"), "must not be empty"));
}

TEST_F(config_test, cross_key_rules_name_both_keys_and_their_origin) {
  auto m = file_error("[listen]\nbulk_port = 7400\n");
  EXPECT_TRUE(has(m, "listen.control_port (default) and listen.bulk_port (file ")) << m;
  m = file_error("[timeouts]\nelection_timeout_min_ms = 900\n");
  EXPECT_TRUE(has(m, "timeouts.election_timeout_min_ms (file ")) << m;
  EXPECT_TRUE(has(m, "must be less than timeouts.election_timeout_max_ms (default) = 600")) << m;
  EXPECT_TRUE(has(file_error("[timeouts]\nheartbeat_interval_ms = 500\n"),
                  "timeouts.heartbeat_interval_ms"));
  // Port 0 (any free port) may repeat.
  EXPECT_EQ(file_error("[listen]\ncontrol_port = 0\nbulk_port = 0\n"), "");
}

TEST_F(config_test, unknown_and_bad_environment_variables_are_errors) {
  EXPECT_TRUE(has(env_error({"TESSERA_DISCOVERY_MDSN=1"}), "env TESSERA_DISCOVERY_MDSN: unknown"));
  auto m = env_error({"TESSERA_LISTEN_CONTROL_PORT=abc"});
  EXPECT_TRUE(has(m, "env TESSERA_LISTEN_CONTROL_PORT: key 'listen.control_port': 'abc' is not"))
      << m;
  EXPECT_TRUE(has(env_error({"TESSERA_DISCOVERY_MDNS=maybe"}), "'maybe' is not a boolean"));
  EXPECT_TRUE(has(env_error({"TESSERA_DISCOVERY_SEEDS=a:1,,b:2"}), "empty item"));
  EXPECT_TRUE(has(env_error({"TESSERA_DISCOVERY_SEEDS=a:1,"}), "empty item"));
  EXPECT_TRUE(has(env_error({"TESSERA_THREADS=-2"}), "not a non-negative integer"));
  EXPECT_TRUE(has(env_error({"TESSERA_THREADS=4096"}), "out of range 0..1024"));
  // Other programs' variables are not ours to judge.
  EXPECT_EQ(env_error({"PATH=/bin", "TESSERA_CONFIG="}), "");
  // Variables other tessera commands read (the secret itself, ask's client key, the demo's model,
  // the kernels' ISA) are not node settings, and exported they must not stop a node.
  EXPECT_EQ(env_error({"TESSERA_CLUSTER_KEY=@/k", "TESSERA_CLIENT_KEY=x", "TESSERA_DEMO_MODEL=m",
                       "TESSERA_KERNEL_ISA=avx2"}),
            "");
}

TEST_F(config_test, bad_flag_values_name_the_flag) {
  EXPECT_TRUE(has(flag_error("listen.control_port", "7x"), "flag --control-port: key"));
  EXPECT_TRUE(has(flag_error("discovery.seeds", "[::1]"), "flag --seed"));
  EXPECT_TRUE(has(flag_error("no.such.key", "1"), "unknown configuration key 'no.such.key'"));
}

TEST_F(config_test, list_bounds_are_enforced) {
  std::string seeds;
  for (int i = 0; i < 257; ++i)
    seeds += fmt::format("{}h{}:1", i ? "," : "", i);
  EXPECT_TRUE(has(env_error({"TESSERA_DISCOVERY_SEEDS=" + seeds}), "257 items, at most 256"));
}

TEST_F(config_test, defaults_apply_when_nothing_is_given) {
  auto r = resolve_config({});
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(r->config.listen.control_port, 7400);
  EXPECT_TRUE(r->config.discovery.mdns);
  EXPECT_EQ(r->origin.at("listen.control_port"), "default");
  EXPECT_EQ(r->config_file, "");
}

// The client endpoints: loopback by default; an explicit --listen moves them; off this host only
// with --client-auth or --insecure-clients, and the refusal says which flags and why.
TEST_F(config_test, client_endpoints_stay_on_loopback_unless_guarded_or_opened_on_purpose) {
  auto resolve = [](std::vector<std::pair<std::string, std::string>> flags) {
    config_layers l;
    l.flags = std::move(flags);
    return resolve_config(l);
  };
  auto d = resolve({});
  ASSERT_TRUE(d) << d.error().describe();
  EXPECT_EQ(d->config.listen.address, "0.0.0.0");  // the control plane: every interface
  EXPECT_EQ(d->config.listen.client_address, "127.0.0.1");
  auto lo = resolve({{"listen.address", "127.0.0.1"}});
  ASSERT_TRUE(lo) << lo.error().describe();
  EXPECT_EQ(lo->config.listen.client_address, "127.0.0.1");

  auto open = resolve({{"listen.address", "10.1.2.3"}});
  ASSERT_FALSE(open);
  for (const char* part : {"10.1.2.3", "--client-auth", "--insecure-clients", "--listen",
                           "--client-address 127.0.0.1"})
    EXPECT_TRUE(has(open.error().message, part)) << part << ": " << open.error().message;
  auto wildcard = resolve({{"listen.client_address", "0.0.0.0"}});
  ASSERT_FALSE(wildcard);
  EXPECT_TRUE(has(wildcard.error().message, "--client-address")) << wildcard.error().message;

  auto insecure = resolve({{"listen.address", "10.1.2.3"}, {"insecure_clients", "true"}});
  ASSERT_TRUE(insecure) << insecure.error().describe();
  EXPECT_EQ(insecure->config.listen.client_address, "10.1.2.3");
  auto authed = resolve({{"listen.client_address", "0.0.0.0"}, {"client_auth", "true"}});
  ASSERT_TRUE(authed) << authed.error().describe();
  EXPECT_EQ(authed->config.listen.client_address, "0.0.0.0");
  auto kept = resolve({{"listen.address", "10.1.2.3"}, {"listen.client_address", "127.0.0.1"}});
  ASSERT_TRUE(kept) << kept.error().describe();
  EXPECT_EQ(kept->config.listen.client_address, "127.0.0.1");
}

TEST_F(config_test, precedence_is_flags_over_env_over_file_over_defaults) {
  config_layers l;
  l.file = file(
      "data_dir = \"/from/file\"\ncluster_name = \"file-cluster\"\n"
      "[listen]\ncontrol_port = 1000\nbulk_port = 1001\nhttp_port = 1002\n"
      "[discovery]\nseeds = [\"f1:1\", \"f2:2\"]\nmdns = false\n");
  l.environment = {"HOME=/root", "TESSERA_LISTEN_CONTROL_PORT=2000",
                   "TESSERA_LISTEN_BULK_PORT=2001", "TESSERA_DISCOVERY_SEEDS=e1:1"};
  l.flags = {{"listen.control_port", "3000"},
             {"discovery.seeds", "x1:1"},
             {"discovery.seeds", "[fe80::1]:7"}};
  auto r = resolve_config(l);
  ASSERT_TRUE(r) << r.error().describe();
  const auto& c = r->config;
  EXPECT_EQ(c.listen.control_port, 3000);         // flag over env over file
  EXPECT_EQ(c.listen.bulk_port, 2001);            // env over file
  EXPECT_EQ(c.listen.http_port, 1002);            // file over default
  EXPECT_EQ(c.listen.client_request_port, 7402);  // default
  EXPECT_EQ(c.data_dir, "/from/file");
  EXPECT_FALSE(c.discovery.mdns);
  EXPECT_EQ(c.discovery.seeds, (std::vector<std::string>{"x1:1", "[fe80::1]:7"}));
  EXPECT_EQ(r->origin.at("listen.control_port"), "flag --control-port");
  EXPECT_EQ(r->origin.at("listen.bulk_port"), "env TESSERA_LISTEN_BULK_PORT");
  EXPECT_EQ(r->origin.at("listen.http_port").rfind("file " + *l.file + ":6:", 0), 0u)
      << r->origin.at("listen.http_port");
  EXPECT_EQ(r->origin.at("threads"), "default");
  EXPECT_EQ(r->config_file, *l.file);
}

TEST_F(config_test, the_config_file_can_come_from_the_environment) {
  config_layers l;
  l.environment = {"TESSERA_CONFIG=" + file("threads = 3\n")};
  auto r = resolve_config(l);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(r->config.threads, 3u);
  // --config (layers.file) wins over TESSERA_CONFIG.
  l.file = file("threads = 5\n");
  EXPECT_EQ(resolve_config(l)->config.threads, 5u);
}

TEST_F(config_test, an_empty_environment_list_clears_the_file_list) {
  config_layers l;
  l.file = file("model_paths = [\"/m/a.gguf\"]\n");
  l.environment = {"TESSERA_MODEL_PATHS="};
  auto r = resolve_config(l);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_TRUE(r->config.model_paths.empty());
}

TEST_F(config_test, json_is_nested_by_key_and_covers_every_section) {
  node_config c;
  c.discovery.seeds = {"a:1"};
  auto j = to_json(c);
  EXPECT_EQ(j["listen"]["control_port"], 7400);
  EXPECT_EQ(j["discovery"]["seeds"][0], "a:1");
  EXPECT_EQ(j["timeouts"]["election_timeout_max_ms"], 600);
  EXPECT_EQ(j["log"]["level"], "info");
  EXPECT_EQ(j["data_dir"], "/var/lib/tessera");
  EXPECT_EQ(env_name_of("listen.control_port"), "TESSERA_LISTEN_CONTROL_PORT");
}

}  // namespace
}  // namespace tessera::mesh
