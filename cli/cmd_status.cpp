#include <cstdio>
#include <string>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "mesh/runtime/runtime.hpp"

namespace tessera::cli {

void register_status(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("status", "show members, leader, links and plan");
  static bool as_json = false;
  static std::string connect = "127.0.0.1:7400";
  static std::string key_file;
  static std::uint32_t timeout_ms = 3000;
  cmd->add_flag("--json", as_json, "print the node's status document as JSON (stable fields)");
  cmd->add_option("--connect", connect, "control endpoint of a node, host:port")
      ->capture_default_str();
  cmd->add_option("--cluster-key", key_file, "cluster secret file (default: $TESSERA_CLUSTER_KEY)");
  cmd->add_option("--timeout-ms", timeout_ms, "give up when nothing answers within this time")
      ->capture_default_str()
      ->check(CLI::Range(1u, 600'000u));
  cmd->callback([&exit_code] {
    auto doc = mesh::runtime::query_status(connect, key_file, timeout_ms);
    if (!doc) {
      log::say(fmt::format("tessera status: {}", doc.error().message), true);
      exit_code = 1;
      return;
    }
    if (as_json) {
      std::printf("%s\n", doc->c_str());
      exit_code = 0;
      return;
    }
    auto text = mesh::runtime::format_status(*doc);
    if (!text) {
      log::say(fmt::format("tessera status: {}", text.error().message), true);
      exit_code = 1;
      return;
    }
    std::fputs(text->c_str(), stdout);
    exit_code = 0;
  });
}

}  // namespace tessera::cli
