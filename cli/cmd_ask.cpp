#include "cli/command.hpp"

namespace tessera::cli {

void register_ask(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("ask", "send a prompt to the cluster and stream the answer");
  cmd->callback([&exit_code] { exit_code = not_yet("ask", 6); });
}

}  // namespace tessera::cli
