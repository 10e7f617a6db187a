#include "cli/command.hpp"

namespace tessera::cli {

void register_node(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("node", "start a peer: discover others, join the mesh, serve");
  cmd->callback([&exit_code] { exit_code = not_yet("node", 4); });
}

}  // namespace tessera::cli
