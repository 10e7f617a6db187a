#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "actors/base/log.hpp"
#include "cli/command.hpp"

namespace tessera::cli {
int not_yet(const char* command, int issue) {
  std::fprintf(stderr, "tessera %s: not available in this build yet (tracked in issue #%d)\n",
               command, issue);
  return 2;
}

int fail(const char* command, const std::string& message) {
  tessera::log::say(fmt::format("tessera {}: {}", command, message), true);
  return 1;
}
}  // namespace tessera::cli

int main(int argc, char** argv) {
  CLI::App app{"tessera — pool several machines into one LLM inference service"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera 0.1.0");
  std::string log_level = "info";
  std::string log_format = "text";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_option("--log-format", log_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  int exit_code = 0;
  namespace c = tessera::cli;
  c::register_node(app, exit_code);
  c::register_ask(app, exit_code);
  c::register_status(app, exit_code);
  c::register_run(app, exit_code);
  c::register_bench(app, exit_code);
  c::register_model(app, exit_code);
  c::register_fault(app, exit_code);
  c::register_keygen(app, exit_code);
  c::register_demo(app, exit_code);

  // Logging must be configured before any subcommand callback runs.
  app.parse_complete_callback([&] {
    auto r = tessera::log::init(log_level, log_format == "json" ? tessera::log::format::json
                                                                 : tessera::log::format::text);
    if (!r) throw CLI::ValidationError("--log-level", r.error().message);
  });
  // Exit codes: 0 success, 1 failure, 2 usage (an unknown command, option or value), whatever
  // the CLI library's own numbers are.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "tessera: unknown command '%s' (commands: %s; tessera --help)\n",
                   argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help, the version or the error
    return code == 0 ? 0 : 2;
  }
  return exit_code;
}
