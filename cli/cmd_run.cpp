#include "cli/command.hpp"

namespace tessera::cli {

void register_run(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("run", "run a GGUF model locally and stream generated text");
  cmd->callback([&exit_code] { exit_code = not_yet("run", 5); });
}

}  // namespace tessera::cli
