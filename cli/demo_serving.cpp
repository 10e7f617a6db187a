// `tessera demo`: the product on one machine. Takes the trained demo model (or synthesises one),
// starts N identical
// `tessera node` processes on loopback, waits for the mesh (a leader, a view, a serving plan),
// sends requests through the pub-sub client and prints the streamed answers and the cluster status,
// then shuts every peer down with SIGTERM. Self-checking: exit 0 only if every step held.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/demo.hpp"
#include "inference/gguf/synth.hpp"
#include "mesh/runtime/runtime.hpp"
#include "mesh/serving/client.hpp"
#include "transport/control/cluster_key.hpp"

extern char** environ;

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;
namespace sv = mesh::serving;
using namespace std::chrono_literals;

struct peer_proc {
  pid_t pid = -1;
  std::uint16_t port = 0;  // control; +2 request, +3 response
  std::string log;
};

// Set by SIGINT / SIGTERM: the demo stops waiting and shuts its peers down cleanly.
std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  // The peers get a process group of their own: a Ctrl-C at the terminal reaches the demo only,
  // which then stops them with SIGTERM (a graceful leave) instead of the terminal killing all.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> argv;
  for (const auto& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

/// SIGTERM, then up to `grace` for a clean exit; SIGKILL after. The exit status, -1 if killed.
int stop_peer(peer_proc& p, std::chrono::milliseconds grace) {
  if (p.pid <= 0) return -1;
  ::kill(p.pid, SIGTERM);
  const auto end = std::chrono::steady_clock::now() + grace;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
      p.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(20ms);
  }
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, &status, 0);
  p.pid = -1;
  return -1;
}

/// Ready when the peer reports a plan that serves `model` from `groups` groups.
bool plan_ready(const std::string& status_json, const std::string& model, std::size_t groups) {
  try {
    auto j = nlohmann::json::parse(status_json);
    if (j.at("plan").is_null()) return false;
    for (const auto& m : j.at("plan").at("models"))
      if (m.at("name") == model) return m.at("groups").size() >= groups;
  } catch (const std::exception&) {
  }
  return false;
}

}  // namespace

std::string find_demo_model() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TESSERA_DEMO_MODEL"); env != nullptr && *env != '\0')
    candidates.emplace_back(env);
  candidates.emplace_back(TESSERA_SOURCE_DIR "/examples/demo-model/kjv.gguf");
  candidates.emplace_back(TESSERA_DATA_DIR "/kjv.gguf");
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c;
  }
  return {};
}

int run_serving_demo(const demo_options& o) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  bool all = true;
  auto check = [&](bool ok, const std::string& what) {
    std::printf("  [%s] %s\n", ok ? "ok" : "FAILED", what.c_str());
    all = all && ok;
    return ok;
  };
  char tmpl[] = "/tmp/tessera-demo.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "tessera demo: cannot create a temporary directory\n");
    return 1;
  }
  const fs::path dir = tmpl;
  std::printf("tessera demo: %u peers on this machine, working directory %s\n\n", o.peers,
              dir.c_str());

  // 1. A model the project makes itself: the one it trained (scripts/train-demo-model), else a
  // synthesised one with random weights (it serves just as well; it prints noise).
  std::string model_path = o.model.empty() ? find_demo_model() : o.model;
  const bool trained = !model_path.empty();
  if (trained) {
    std::error_code ec;
    if (!fs::is_regular_file(model_path, ec))
      return std::fprintf(stderr, "tessera demo: --model %s: no such file\n", model_path.c_str()), 1;
    std::printf("1. model %s (%s)\n", model_path.c_str(),
                o.model.empty() ? "trained by scripts/train-demo-model on the King James Bible"
                                : "given with --model");
  } else {
    model_path = (dir / "demo.gguf").string();
    auto cfg = inference::gguf::synth_preset("tiny", "llama");
    if (!cfg) return std::fprintf(stderr, "tessera demo: %s\n", cfg.error().message.c_str()), 1;
    cfg->type = inference::tensor_type::q8_0;
    auto w = inference::gguf::write_synthetic_model(*cfg, model_path);
    if (!w) return std::fprintf(stderr, "tessera demo: %s\n", w.error().message.c_str()), 1;
    std::printf("1. synthesised %s (%.1fM parameters, %s; random weights: the text is noise)\n",
                model_path.c_str(), static_cast<double>(w->params) / 1e6,
                inference::gguf::human_bytes(w->file_bytes).c_str());
  }
  const std::string model_name = fs::path(model_path).stem().string();
  const std::string key = (dir / "cluster.key").string();
  {
    namespace tc = transport::control;
    auto secret = tc::generate_cluster_secret();
    if (!secret)
      return std::fprintf(stderr, "tessera demo: %s\n", secret.error().describe().c_str()), 1;
    auto wr = tc::write_secret_file(key, tc::format_cluster_secret(*secret, tc::secret_format::hex),
                                    true);
    if (!wr) return std::fprintf(stderr, "tessera demo: %s\n", wr.error().describe().c_str()), 1;
  }

  // 2. N identical peers: same command, each its own data directory and ports.
  std::vector<peer_proc> peers(o.peers);
  for (std::uint32_t i = 0; i < o.peers; ++i) {
    peers[i].port = static_cast<std::uint16_t>(o.base_port + 10 * i);
    peers[i].log = (dir / fmt::format("peer{}.log", i)).string();
  }
  for (std::uint32_t i = 0; i < o.peers; ++i) {
    const auto p = peers[i].port;
    std::vector<std::string> args{"tessera",
                                  "node",
                                  "--cluster-key",
                                  key,
                                  "--data-dir",
                                  (dir / fmt::format("peer{}", i)).string(),
                                  "--listen",
                                  "127.0.0.1",
                                  "--control-port",
                                  std::to_string(p),
                                  "--bulk-port",
                                  std::to_string(p + 1),
                                  "--client-request-port",
                                  std::to_string(p + 2),
                                  "--client-response-port",
                                  std::to_string(p + 3),
                                  "--http-port",
                                  std::to_string(p + 4),
                                  "--no-mdns",
                                  "--no-beacon",
                                  "--threads",
                                  "1",
                                  "--model",
                                  model_path};
    for (std::uint32_t j = 0; j < o.peers; ++j)
      if (j != i) {
        args.push_back("--seed");
        args.push_back(fmt::format("127.0.0.1:{}", peers[j].port));
      }
    peers[i].pid = spawn(args, peers[i].log);
    if (peers[i].pid < 0) {
      std::fprintf(stderr, "tessera demo: cannot start peer %u\n", i);
      all = false;
    }
  }
  std::printf("2. started %u peers: tessera node --model %s --seed <the others> ...\n", o.peers,
              model_path.c_str());

  // 3. Wait for the mesh: every peer holds a plan serving the model from every peer.
  const auto t_start = std::chrono::steady_clock::now();
  bool ready = false;
  while (all && !ready && !g_stop.load() &&
         std::chrono::steady_clock::now() - t_start < std::chrono::seconds(o.wait_s)) {
    ready = true;
    for (const auto& p : peers) {
      auto st = mesh::runtime::query_status(fmt::format("127.0.0.1:{}", p.port), key, 1000);
      if (!st || !plan_ready(*st, model_name, o.peers)) {
        ready = false;
        break;
      }
    }
    if (!ready) std::this_thread::sleep_for(200ms);
  }
  const double mesh_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("3. waiting for the mesh: a leader, a view and a serving plan on every peer\n");
  check(ready, fmt::format("every peer holds the plan ({} replicas of '{}') after {:.2f} s",
                           o.peers, model_name, mesh_s));
  // Where a newcomer points a browser, curl or an OpenAI / Ollama client while the peers run.
  for (const auto& p : peers)
    std::printf(
        "   http://127.0.0.1:%u/  dashboard, OpenAI /v1/chat/completions, Ollama /api/chat\n",
        p.port + 4);

  // 4. Requests through the pub-sub client: any peer takes them in, the plan picks the server.
  if (ready && !g_stop.load()) {
    sv::client_options co;
    for (const auto& p : peers)
      co.peers.push_back({"127.0.0.1", static_cast<std::uint16_t>(p.port + 2),
                          static_cast<std::uint16_t>(p.port + 3)});
    co.deadline_ms = 60'000;
    auto c = sv::client::connect(co);
    if (!check(c.has_value(), "client connected to every peer's request and response endpoints"))
      goto shutdown;
    std::printf("\n4. streaming answers (tessera ask -m %s ...):\n", model_name.c_str());
    const char* trained_prompts[] = {"And God said", "In the beginning", "The LORD is my"};
    const char* synth_prompts[] = {"Once upon a time", "The mesh of peers", "A token at a time"};
    const char* const* prompts = trained ? trained_prompts : synth_prompts;
    for (std::uint32_t k = 0; k < 3; ++k) {
      sv::request r;
      r.id = fmt::format("demo-{}-{}", ::getpid(), k);
      r.model = model_name;
      r.prompt = prompts[k];
      r.max_tokens = trained ? 40 : 24;
      r.seed = k + 1;
      // The trained model at a low temperature: greedy decoding of a 1.7M-parameter model loops.
      r.temperature = 0.5f;
      r.repeat_penalty = 1.1f;
      std::printf("   > %s\n   < ", r.prompt.c_str());
      std::fflush(stdout);
      auto out = (*c)->ask(r, [](const sv::token_event& t) {
        std::fwrite(t.text.data(), 1, t.text.size(), stdout);
        std::fflush(stdout);
      });
      std::printf("\n");
      if (!out) {
        check(false, fmt::format("request {}: {}", r.id, out.error().describe()));
        continue;
      }
      check(out->tokens.size() == r.max_tokens || out->stop == "end_of_generation",
            fmt::format("{} tokens from peer {} ({}), first after {:.0f} ms", out->tokens.size(),
                        out->nodes.empty() ? std::string("?") : out->nodes.back().substr(0, 12),
                        out->stop, out->first_token_s * 1000));
    }
    // Concurrent requests spread over the replicas (rendezvous hashing of the ids).
    std::vector<std::future<result<sv::outcome>>> futures;
    for (std::uint32_t k = 0; k < 8; ++k)
      futures.push_back(std::async(std::launch::async, [&, k]() -> result<sv::outcome> {
        auto cc = sv::client::connect(co);
        if (!cc) return cc.error();
        sv::request r;
        r.id = fmt::format("demo-{}-c{}", ::getpid(), k);
        r.model = model_name;
        r.prompt = "Eight requests at once";
        r.max_tokens = 32;
        r.seed = 100 + k;
        return (*cc)->ask(r);
      }));
    std::map<std::string, int> served;
    std::size_t ok_count = 0;
    for (auto& f : futures) {
      auto out = f.get();
      if (out && !out->nodes.empty()) {
        ++ok_count;
        ++served[out->nodes.back().substr(0, 12)];
      }
    }
    std::string spread;
    for (const auto& [n, count] : served)
      spread += fmt::format(" {}:{}", n, count);
    check(ok_count == futures.size(),
          fmt::format("8 concurrent requests completed, served by{}", spread));
    sv::request bad;
    bad.id = fmt::format("demo-{}-unknown", ::getpid());
    bad.model = "no-such-model";
    bad.prompt = "hello";
    auto err = (*c)->ask(bad);
    check(!err && err.error().code == errc::not_found,
          fmt::format("a request for an unknown model gets one explicit error: {}",
                      err ? std::string("(none)") : err.error().message));

    // 5. The cluster as a peer sees it.
    auto st = mesh::runtime::query_status(fmt::format("127.0.0.1:{}", peers[0].port), key, 2000);
    if (st) {
      auto table = mesh::runtime::format_status(*st);
      std::printf("\n5. tessera status:\n%s\n", table ? table->c_str() : st->c_str());
    }
  }

  if (o.serve && ready && all && !g_stop.load()) {
    std::printf("\nserving until Ctrl-C. Try:\n");
    std::printf(
        "   curl -s http://127.0.0.1:%u/v1/chat/completions -d '{\"model\": \"%s\", "
        "\"messages\": [{\"role\": \"user\", \"content\": \"In the beginning\"}], "
        "\"max_tokens\": 32}'\n",
        peers[0].port + 4, model_name.c_str());
    std::printf("   tessera ask -m %s --peer 127.0.0.1:%u \"And God said\"\n", model_name.c_str(),
                peers[0].port + 2);
    std::printf("   a browser on http://127.0.0.1:%u/ (the dashboard)\n", peers[0].port + 4);
    std::fflush(stdout);
    while (!g_stop.load()) {
      std::this_thread::sleep_for(200ms);
      for (std::uint32_t i = 0; i < o.peers; ++i) {
        int status = 0;
        if (peers[i].pid > 0 && ::waitpid(peers[i].pid, &status, WNOHANG) == peers[i].pid) {
          check(false, fmt::format("peer {} exited while serving (log: {})", i, peers[i].log));
          peers[i].pid = -1;
          g_stop.store(true);
        }
      }
    }
    std::printf("\n");
  }

shutdown:
  // 6. Clean shutdown: each peer leaves the mesh on SIGTERM and exits 0.
  std::printf("6. shutting down\n");
  for (std::uint32_t i = 0; i < o.peers; ++i) {
    const int rc = stop_peer(peers[i], 10s);
    check(rc == 0, fmt::format("peer {} left the mesh and exited {}", i, rc));
  }
  if (all && !o.keep) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  } else {
    std::printf("logs kept in %s\n", dir.c_str());
  }
  std::printf("%s\n", all ? "demo: all checks passed" : "demo: SOME CHECKS FAILED");
  return all ? 0 : 1;
}

}  // namespace tessera::cli
