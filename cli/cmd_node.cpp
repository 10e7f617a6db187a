#include <cstdio>
#include <memory>

#include "cli/command.hpp"
#include "mesh/node/options.hpp"

namespace tessera::cli {

void register_node(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("node", "start a peer: discover others, join the mesh, serve");
  // Owned here for the life of the process: CLI11 writes flag text into them while parsing.
  static mesh::node_config config;
  static std::unique_ptr<mesh::node_options> options = mesh::add_node_options(*cmd, config);
  static bool print_config = false;
  cmd->add_flag("--print-config", print_config,
                "print the effective configuration (flags > env > file > defaults) as JSON, exit");
  cmd->callback([&exit_code] {
    auto resolved = options->resolve(mesh::process_environment());
    if (!resolved) {
      std::fprintf(stderr, "tessera node: %s\n", resolved.error().message.c_str());
      exit_code = 2;
      return;
    }
    if (print_config) {
      std::printf("%s\n", mesh::to_json(config).dump(2).c_str());
      exit_code = 0;
      return;
    }
    exit_code = not_yet("node", 4);
  });
}

}  // namespace tessera::cli
