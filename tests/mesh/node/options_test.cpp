#include "mesh/node/options.hpp"

#include <unistd.h>

#include <cstdlib>

#include <gtest/gtest.h>

namespace tessera::mesh {
namespace {

struct parsed {
  node_config config;
  std::unique_ptr<node_options> options;
};

// Parses argv (without the program name) as the `node` subcommand would.
result<resolved_config> parse(std::vector<std::string> args, node_config& config,
                              std::vector<std::string> env = {}) {
  CLI::App app{"test"};
  auto opts = add_node_options(app, config);
  std::reverse(args.begin(), args.end());  // CLI11's vector form takes arguments reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return make_error(errc::invalid_argument, "{}", e.what());
  }
  return opts->resolve(env);
}

TEST(node_options, a_bad_flag_value_is_an_error_naming_the_flag) {
  node_config c;
  auto r = parse({"--control-port", "seventy"}, c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("flag --control-port"), std::string::npos) << r.error().message;
}

TEST(node_options, an_unknown_flag_is_refused_by_the_parser) {
  node_config c;
  EXPECT_FALSE(parse({"--contrl-port", "1"}, c));
}

TEST(node_options, flags_set_the_config_and_override_env) {
  node_config c;
  auto r = parse({"--control-port", "9000", "--seed", "a:1", "--seed", "b:2", "--no-mdns",
                  "--data-dir", "/tmp/x", "--reset-identity"},
                 c, {"TESSERA_LISTEN_CONTROL_PORT=8000", "TESSERA_THREADS=2"});
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(c.listen.control_port, 9000);
  EXPECT_EQ(c.threads, 2u);
  EXPECT_EQ(c.discovery.seeds, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_FALSE(c.discovery.mdns);
  EXPECT_TRUE(c.reset_identity);
  EXPECT_EQ(c.data_dir, "/tmp/x");
  EXPECT_EQ(r->origin.at("discovery.mdns"), "flag --mdns");
}

TEST(node_options, untouched_flags_leave_lower_layers_alone) {
  node_config c;
  auto r = parse({}, c, {"TESSERA_DISCOVERY_MDNS=off"});
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_FALSE(c.discovery.mdns);
  EXPECT_EQ(c.listen.control_port, 7400);
}

TEST(node_options, config_flag_reads_the_file_below_env_and_flags) {
  char tmpl[] = "/tmp/tessera-options-XXXXXX.toml";
  int fd = ::mkstemps(tmpl, 5);
  ASSERT_GE(fd, 0);
  std::string text = "threads = 7\n[listen]\nhttp_port = 8080\ncontrol_port = 1\n";
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  node_config c;
  auto r = parse({"--config", tmpl, "--control-port", "2"}, c, {"TESSERA_THREADS=8"});
  ::unlink(tmpl);
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(c.listen.http_port, 8080);
  EXPECT_EQ(c.threads, 8u);
  EXPECT_EQ(c.listen.control_port, 2);
  EXPECT_EQ(r->config_file, tmpl);
}

TEST(node_options, help_names_key_env_and_default) {
  node_config c;
  CLI::App app{"test"};
  auto opts = add_node_options(app, c);
  std::string help = app.help();
  EXPECT_NE(help.find("--control-port"), std::string::npos);
  EXPECT_NE(help.find("TESSERA_LISTEN_CONTROL_PORT"), std::string::npos);
  EXPECT_NE(help.find("7400"), std::string::npos);
  EXPECT_NE(help.find("--no-mdns"), std::string::npos);
}

}  // namespace
}  // namespace tessera::mesh
