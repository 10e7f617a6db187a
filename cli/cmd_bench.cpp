#include "cli/command.hpp"

namespace tessera::cli {

void register_bench(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("bench", "measure decode and prefill speed");
  cmd->callback([&exit_code] { exit_code = not_yet("bench", 5); });
}

}  // namespace tessera::cli
