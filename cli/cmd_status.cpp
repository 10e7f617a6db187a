#include "cli/command.hpp"

namespace tessera::cli {

void register_status(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("status", "show members, leader, links and plan");
  cmd->callback([&exit_code] { exit_code = not_yet("status", 4); });
}

}  // namespace tessera::cli
