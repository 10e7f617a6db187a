#include "cli/command.hpp"

namespace tessera::cli {

void register_keygen(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("keygen", "write a new cluster secret");
  cmd->callback([&exit_code] { exit_code = not_yet("keygen", 3); });
}

}  // namespace tessera::cli
