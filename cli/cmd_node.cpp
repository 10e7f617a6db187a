#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "cli/progress.hpp"
#include "mesh/node/options.hpp"
#include "mesh/runtime/runtime.hpp"

namespace tessera::cli {

void register_node(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("node", "start a peer: discover others, join the mesh, serve");
  // Owned here for the life of the process: CLI11 writes flag text into them while parsing.
  static mesh::node_config config;
  static std::unique_ptr<mesh::node_options> options = mesh::add_node_options(*cmd, config);
  static bool print_config = false;
  static bool print_json = false;
  cmd->add_flag("--print-config", print_config,
                "print the effective configuration (flags > env > file > defaults) as a TOML "
                "config file, with each key's help, and exit");
  cmd->add_flag("--json", print_json, "with --print-config: JSON instead of TOML");
  cmd->callback([&exit_code] {
    auto resolved = options->resolve(mesh::process_environment());
    if (!resolved) {
      log::say(fmt::format("tessera node: {}", resolved.error().message), true);
      exit_code = 2;
      return;
    }
    if (print_config) {
      if (print_json)
        std::printf("%s\n", mesh::to_json(config).dump(2).c_str());
      else
        std::fputs(mesh::to_toml(config).c_str(), stdout);
      exit_code = 0;
      return;
    }
    // The node's own log settings (flag, TESSERA_LOG_*, the config file's [log]) apply over
    // `tessera --log-level/--log-format` given before the command, unless left at their defaults.
    const mesh::node_config defaults;
    if (config.log_level != defaults.log_level || config.log_format != defaults.log_format) {
      const bool json = config.log_format == "json" || (config.log_format == defaults.log_format &&
                                                        log::current_format() == log::format::json);
      auto r = log::init(
          config.log_level != defaults.log_level ? config.log_level : log::current_level(),
          json ? log::format::json : log::format::text);
      if (!r) {
        log::say(fmt::format("tessera node: {}", r.error().message), true);
        exit_code = 2;
        return;
      }
    }
    // SIGTERM/SIGINT are taken synchronously by this thread (sigtimedwait); blocked before any
    // thread starts so that every thread inherits the mask and none is interrupted.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    // Two malloc arenas, not glibc's 8 per core: a thread that allocates in a burst (a flood of
    // client subscriptions, read on the client and libzmq I/O threads) otherwise got an arena of
    // its own, up to 64 MiB resident that no later allocation of another thread reuses. Measured
    // (ServingCluster.ASubscriptionFloodCostsThePeerBoundedMemory, peak RSS growth): default
    // arenas +62 / +66 MiB in 2 of 6 runs; two arenas +1 to +26 in 8 of 8. Before any thread
    // starts; an explicit MALLOC_ARENA_MAX in the environment wins.
    if (std::getenv("MALLOC_ARENA_MAX") == nullptr) (void)::mallopt(M_ARENA_MAX, 2);
    mesh::runtime::runtime_options ro{config};
    // Weights load on the engine's loader threads, whenever the plan gives this peer a replica:
    // one bar per load, drawn under a mutex (two models may load at once).
    std::mutex bar_mu;
    std::unique_ptr<progress_bar> bar;
    std::string loading;
    ro.on_model_load = [&](const std::string& model, std::uint64_t done, std::uint64_t total) {
      std::lock_guard lock(bar_mu);
      if (!bar || "loading model " + model != loading) {
        bar = std::make_unique<progress_bar>("loading model " + model);
        loading = "loading model " + model;
      }
      bar->update(done, total);
      if (done >= total) {
        bar->finish();
        bar.reset();
      }
    };
    // Shards fetched from peers (--fetch-models): the same bar, labelled as a fetch.
    ro.on_model_fetch = [&](const std::string& model, std::uint64_t done, std::uint64_t total) {
      std::lock_guard lock(bar_mu);
      const std::string label = "fetching model " + model;
      if (!bar || label != loading) {
        bar = std::make_unique<progress_bar>(label);
        loading = label;
      }
      bar->update(done, total);
      if (done >= total) {
        bar->finish();
        bar.reset();
      }
    };
    auto rt = mesh::runtime::node_runtime::start(ro);
    if (!rt) {
      log::say(fmt::format("tessera node: {}", rt.error().message), true);
      exit_code = 1;
      return;
    }
    log::say(fmt::format("tessera node: {} listening on {}", (*rt)->node_id(), (*rt)->endpoint()));
    for (;;) {
      timespec ts{0, 100'000'000};
      int sig = sigtimedwait(&set, nullptr, &ts);
      if (sig == SIGTERM || sig == SIGINT) {
        (*rt)->leave_and_stop();
        log::say(fmt::format("tessera node: left the mesh (signal {})", sig));
        exit_code = 0;
        return;
      }
      if ((*rt)->failed()) {
        log::say(fmt::format("tessera node: {}", (*rt)->fatal_error()), true);
        exit_code = 1;
        return;
      }
    }
  });
}

}  // namespace tessera::cli
