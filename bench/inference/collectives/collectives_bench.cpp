// tessera_collectives_bench: all-reduce latency, ranks in separate processes.
//
//   tessera_collectives_bench [--reps 7] [--backends tcp,shm] [--ranks 2,3]
//
// For each backend and group size, rank 0 (this process) execs the other ranks (this program with
// --peer) and wires a full mesh of bulk links; then every size runs, per repetition, a timed batch
// of all-reduces by mesh and by ring, interleaved. A figure is the median over repetitions of the
// mean latency per all-reduce in a batch (best repetition in brackets), as rank 0 sees it (an
// all-reduce ends on every rank within one hand-off of the others).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "inference/collectives/group.hpp"
#include "tests/inference/collectives/support.hpp"

using namespace tessera;
using namespace tessera::inference::collectives;
namespace bulk = tessera::transport::bulk;

namespace {

const std::size_t sizes[] = {512, 1024, 16384, 65536, 262144};

int iterations(std::size_t floats) {
  if (floats <= 1024) return 400;
  if (floats <= 16384) return 100;
  return 20;
}

group_options bench_options() {
  group_options o;
  o.max_floats = 262144;
  o.timeout_ms = std::chrono::milliseconds(60'000);
  return o;
}

// The sequence every rank runs; rank 0 times it. Returns per size and algorithm the per-rep means.
struct figures {
  std::vector<double> us[2];  // [0] mesh, [1] ring
};

bool run(group& g, int reps, std::vector<figures>* out) {
  std::vector<float> v(262144);
  for (std::size_t si = 0; si < std::size(sizes); ++si) {
    const std::size_t n = sizes[si];
    const int iters = iterations(n);
    auto span = std::span<float>(v).first(n);
    for (int warm = 0; warm < 10; ++warm) {
      std::fill(span.begin(), span.end(), 0.5f);
      if (!g.all_reduce(span, algorithm::mesh) || !g.all_reduce(span, algorithm::ring)) return false;
    }
    for (int rep = 0; rep < reps; ++rep) {
      for (int a = 0; a < 2; ++a) {
        const auto algo = a == 0 ? algorithm::mesh : algorithm::ring;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          std::fill(span.begin(), span.end(), 0.5f);
          auto r = g.all_reduce(span, algo);
          if (!r) {
            std::fprintf(stderr, "all_reduce: %s\n", r.error().describe().c_str());
            return false;
          }
        }
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            iters;
        if (out) (*out)[si].us[a].push_back(us);
      }
    }
  }
  return true;
}

std::string fmt_figure(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f (%.1f)", v[v.size() / 2], v.front());
  return buf;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  std::vector<std::string> backends = {"tcp", "shm"};
  std::vector<std::string> ranks = {"2", "3"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--peer" && i + 4 < argc + 0) {
      // --peer <backend> <n> <rank> <reps>
      auto kind = bulk::parse_backend(argv[i + 1]);
      if (!kind) return 2;
      const auto n = static_cast<std::uint32_t>(std::stoul(argv[i + 2]));
      const auto rank = static_cast<std::uint32_t>(std::stoul(argv[i + 3]));
      auto links = testing::join_mesh(*kind, n, rank);
      if (!links) return 2;
      auto g = group::create(rank, testing::pointers(*links), bench_options());
      if (!g) return 2;
      return run(**g, std::stoi(argv[i + 4]), nullptr) ? 0 : 3;
    }
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::stoi(argv[++i]));
    else if (a == "--backends" && i + 1 < argc) backends = split(argv[++i]);
    else if (a == "--ranks" && i + 1 < argc) ranks = split(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--backends tcp,shm] [--ranks 2,3]\n", argv[0]);
      return 2;
    }
  }
  std::string self = "/proc/self/exe";
  char path[4096];
  const ssize_t len = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (len > 0) self.assign(path, static_cast<std::size_t>(len));
  std::printf("| backend | ranks | floats | mesh µs | ring µs |\n|---|---|---|---|---|\n");
  for (const auto& b : backends) {
    auto kind = bulk::parse_backend(b);
    if (!kind) return 2;
    for (const auto& rs : ranks) {
      const auto n = static_cast<std::uint32_t>(std::stoul(rs));
      std::vector<std::vector<std::string>> args(n);
      for (std::uint32_t r = 1; r < n; ++r) {
        args[r] = {self, "--peer", b, rs, std::to_string(r), std::to_string(reps)};
      }
      auto m = testing::launch_mesh(*kind, n, args);
      if (!m) {
        std::fprintf(stderr, "mesh: %s\n", m.error().describe().c_str());
        return 2;
      }
      auto g = group::create(0, testing::pointers(m->links), bench_options());
      if (!g) {
        std::fprintf(stderr, "group: %s\n", g.error().describe().c_str());
        return 2;
      }
      std::vector<figures> f(std::size(sizes));
      if (!run(**g, reps, &f)) return 3;
      for (std::size_t si = 0; si < std::size(sizes); ++si) {
        std::printf("| %s | %u | %zu (%zu KiB) | %s | %s |\n", b.c_str(), n, sizes[si],
                    sizes[si] * 4 / 1024, fmt_figure(f[si].us[0]).c_str(),
                    fmt_figure(f[si].us[1]).c_str());
        std::fflush(stdout);
      }
      g->reset();
      for (auto& c : m->children) {
        if (c->reap() != 0) std::fprintf(stderr, "a peer failed\n");
      }
    }
  }
  return 0;
}
