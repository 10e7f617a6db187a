#include "cli/command.hpp"

namespace tessera::cli {

void register_fault(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("fault", "inject faults into a live cluster");
  cmd->callback([&exit_code] { exit_code = not_yet("fault", 7); });
}

}  // namespace tessera::cli
