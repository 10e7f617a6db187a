// Tessera's actor runtime against CAF 0.17 on three workloads, interleaved in one run.
//
//   build/release/bench/actors/tessera_actors_bench --benchmark_repetitions=7
//       --benchmark_enable_random_interleaving=true      (one command line)
//
// Prints Google Benchmark's table, then medians per workload and the Tessera/CAF ratio.
// Both runtimes get 2 scheduler threads. Counters: items_per_second = round trips/s (ping-pong),
// messages/s (fan-in), hops/s (ring).
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/actors/workloads.hpp"

namespace tessera::bench {
namespace {

constexpr unsigned threads = 2;
constexpr std::uint64_t round_trips = 20'000;
constexpr unsigned senders = 8;
constexpr std::uint64_t per_sender = 25'000;
constexpr unsigned ring_actors = 1000;
constexpr std::uint64_t ring_hops = 200'000;

void run_workload(benchmark::State& state, workload& w, std::uint64_t items) {
  w.run();  // warm-up: first touch of every actor and mailbox
  for (auto _ : state) w.run();
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * items));
}

void BM_ping_pong_tessera(benchmark::State& s) {
  auto w = tessera_ping_pong(threads, round_trips, false);
  run_workload(s, *w, round_trips);
}
void BM_ping_pong_tessera_pinned(benchmark::State& s) {
  auto w = tessera_ping_pong(threads, round_trips, true);
  run_workload(s, *w, round_trips);
}
void BM_ping_pong_caf(benchmark::State& s) {
  auto w = caf_ping_pong(threads, round_trips);
  run_workload(s, *w, round_trips);
}
void BM_fan_in_tessera(benchmark::State& s) {
  auto w = tessera_fan_in(threads, senders, per_sender);
  run_workload(s, *w, senders * per_sender);
}
void BM_fan_in_caf(benchmark::State& s) {
  auto w = caf_fan_in(threads, senders, per_sender);
  run_workload(s, *w, senders * per_sender);
}
void BM_ring_tessera(benchmark::State& s) {
  auto w = tessera_ring(threads, ring_actors, ring_hops);
  run_workload(s, *w, ring_hops);
}
void BM_ring_caf(benchmark::State& s) {
  auto w = caf_ring(threads, ring_actors, ring_hops);
  run_workload(s, *w, ring_hops);
}

BENCHMARK(BM_ping_pong_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ping_pong_tessera_pinned)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ping_pong_caf)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fan_in_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fan_in_caf)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ring_tessera)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ring_caf)->UseRealTime()->Unit(benchmark::kMillisecond);

/// Console output plus a collection of items/s per run for the summary.
class summary_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      auto it = r.counters.find("items_per_second");
      if (it != r.counters.end()) rates_[r.run_name.function_name].push_back(it->second.value);
    }
  }
  void print_summary() const {
    auto median = [&](const std::string& name) -> double {
      auto it = rates_.find(name);
      if (it == rates_.end() || it->second.empty()) return 0;
      auto v = it->second;
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    std::printf("\nmedians over %zu repetitions (Tessera / CAF 0.17, %u threads each)\n",
                rates_.empty() ? 0 : rates_.begin()->second.size(), threads);
    auto latency = [&](const char* label, const std::string& ours) {
      double a = median(ours), b = median("BM_ping_pong_caf");
      if (a > 0 && b > 0) {
        std::printf("  %-28s %8.3f us/round trip vs CAF %8.3f us  -> latency ratio %.2fx\n", label,
                    1e6 / a, 1e6 / b, b / a);
      }
    };
    latency("ping-pong", "BM_ping_pong_tessera");
    latency("ping-pong (pinned 2 threads)", "BM_ping_pong_tessera_pinned");
    auto rate = [&](const char* label, const char* unit, const std::string& ours,
                    const std::string& theirs) {
      double a = median(ours), b = median(theirs);
      if (a > 0 && b > 0) {
        std::printf("  %-28s %8.2f M %s vs CAF %8.2f M  -> throughput ratio %.2fx\n", label,
                    a / 1e6, unit, b / 1e6, a / b);
      }
    };
    rate("fan-in 8 -> 1", "msg/s", "BM_fan_in_tessera", "BM_fan_in_caf");
    rate("ring of 1000", "hops/s", "BM_ring_tessera", "BM_ring_caf");
    std::printf("  (latency ratio = Tessera time / CAF time, target <= 0.5x;\n"
                "   throughput ratio = Tessera / CAF, target >= 2x)\n");
  }

 private:
  std::map<std::string, std::vector<double>> rates_;
};

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tessera::bench::summary_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary();
  benchmark::Shutdown();
  return 0;
}
