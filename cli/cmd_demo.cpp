#include "cli/command.hpp"

namespace tessera::cli {

void register_demo(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("demo", "run the demo");
  cmd->callback([&exit_code] { exit_code = not_yet("demo", 2); });
}

}  // namespace tessera::cli
