#include "cli/command.hpp"

namespace tessera::cli {

void register_model(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("model", "synthesise a model or inspect a GGUF file");
  cmd->callback([&exit_code] { exit_code = not_yet("model", 5); });
}

}  // namespace tessera::cli
