// The `tessera` executable's subcommands. Each cmd_*.cpp registers one subcommand on the root app;
// its callback stores the process exit code (0 only on success) in `exit_code`.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace tessera::cli {

void register_node(CLI::App& root, int& exit_code);
void register_ask(CLI::App& root, int& exit_code);
void register_status(CLI::App& root, int& exit_code);
void register_run(CLI::App& root, int& exit_code);
void register_bench(CLI::App& root, int& exit_code);
void register_model(CLI::App& root, int& exit_code);
void register_fault(CLI::App& root, int& exit_code);
void register_keygen(CLI::App& root, int& exit_code);
void register_demo(CLI::App& root, int& exit_code);

/// For subcommands whose feature has not landed yet: says so and which issue brings it, exit 2.
/// Honest about the gap rather than pretending to work.
int not_yet(const char* command, int issue);

/// Prints "tessera <command>: <message>" on stderr and returns exit code 1.
int fail(const char* command, const std::string& message);

}  // namespace tessera::cli
