// add_node_options: the `tessera node` flags, one per configuration key (see config.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "mesh/node/config.hpp"

namespace tessera::mesh {

/// The flags' storage, owned by the caller until after parsing. CLI11 only records text here;
/// values are converted and validated by resolve(), so a bad flag gets the same error as a bad
/// environment variable or file entry.
class node_options {
 public:
  /// After CLI parsing: merges defaults < file < env < flags into the node_config given to
  /// add_node_options (and returns the provenance). `environment` is NAME=VALUE entries.
  [[nodiscard]] result<resolved_config> resolve(const std::vector<std::string>& environment);

  /// The flags given on the command line as (key, text) pairs, in table order.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> given_flags() const;

  /// --config FILE, if given.
  [[nodiscard]] const std::string& config_file() const noexcept { return config_file_; }

 private:
  friend std::unique_ptr<node_options> add_node_options(CLI::App& app, node_config& config);
  struct bound_flag {
    std::string key;
    CLI::Option* option = nullptr;
    std::string scalar;
    std::vector<std::string> items;
    bool is_list = false;
  };
  node_config* config_ = nullptr;
  CLI::Option* config_option_ = nullptr;
  std::string config_file_;
  std::vector<std::unique_ptr<bound_flag>> flags_;
};

/// Registers --config and one flag per configuration key on `app` (the `node` subcommand).
/// Defaults shown in --help come from `config`; resolve() writes the merged result into it.
[[nodiscard]] std::unique_ptr<node_options> add_node_options(CLI::App& app, node_config& config);

/// The process environment as NAME=VALUE strings (for resolve()).
[[nodiscard]] std::vector<std::string> process_environment();

}  // namespace tessera::mesh
