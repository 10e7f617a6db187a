// Decode and prefill speed of a model split over N ranks (threads of this process, one compute
// thread each, a real tcp or shm bulk link between every pair) against the same model on one rank,
// with an optional delay added to every message by the transport's fault layer (faulty_link) —
// the link-latency effect that motivates RDMA.
//
//   tessera_sharded_bench --model M.gguf --ranks 2 --layout tp --backend shm --delay-us 0,5,300
//                         [--also-decorated]
//
// --also-decorated: each 0 µs row is followed by one whose links are wrapped in the fault layer
// with no fault in force, as every `tessera node` wraps its split groups' links: what the fault
// layer costs while nobody uses it.
#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "inference/gguf/gguf.hpp"
#include "inference/kernels/thread_pool.hpp"
#include "inference/sharded/runner.hpp"
#include "tests/inference/collectives/support.hpp"
#include "transport/faults/faulty_link.hpp"

namespace {

using namespace tessera;
using namespace tessera::inference;
namespace bulk = transport::bulk;
namespace ct = collectives::testing;
using clock_type = std::chrono::steady_clock;

struct figures {
  double prefill_tok_s = 0, decode_tok_s = 0;
};

model::shard_spec shard_for(sharded::layout kind, std::uint32_t rank, std::uint32_t n,
                            const model::hparams& hp) {
  if (kind == sharded::layout::pipeline)
    return model::shard_spec::layers(hp.n_layer * rank / n, hp.n_layer * (rank + 1) / n);
  // Whole GQA groups per rank, FFN columns in blocks of 32; of a mixture of experts, whole
  // experts (expert parallelism: uneven when the ranks do not divide the experts).
  const std::int64_t groups = hp.n_head_kv, per = hp.n_head / hp.n_head_kv;
  const std::int64_t unit = hp.is_moe() ? hp.expert_ffn : 32;
  const std::int64_t blocks = hp.ffn / unit;
  model::shard_spec s;
  s.head_begin = groups * rank / n * per;
  s.head_end = groups * (rank + 1) / n * per;
  s.ffn_begin = blocks * rank / n * unit;
  s.ffn_end = rank + 1 == n ? hp.ffn : blocks * (rank + 1) / n * unit;
  return s;
}

result<figures> run(const std::string& path, sharded::layout kind, std::uint32_t n,
                    bulk::backend_kind backend, std::int64_t delay_us, bool decorate, int prompt_n,
                    int decode_n, int compute_threads) {
  auto f = gguf::file::open(path, {gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  auto hp = model::read_hparams(*f);
  if (!hp) return hp.error();
  std::vector<std::unique_ptr<model::model>> shards(n);
  std::vector<std::unique_ptr<thread_pool>> pools(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    auto m =
        model::model::load(*f, {n == 1 ? model::shard_spec::full() : shard_for(kind, r, n, *hp)});
    if (!m) return m.error();
    shards[r] = std::move(*m);
  }
  auto injector = std::make_shared<transport::faults::fault_injector>(1);
  if (delay_us > 0) {
    transport::faults::link_rule rule;
    rule.delay = std::chrono::microseconds(delay_us);
    auto s = injector->update([&](auto& p) { return p.set_rule("*", "*", rule); });
    if (!s) return s.error();
  }
  ct::mesh_links mesh(n);
  if (n > 1) {
    auto m = ct::make_local_mesh(backend, n);
    if (!m) return m.error();
    mesh = std::move(*m);
    for (std::uint32_t i = 0; i < n; ++i)
      for (std::uint32_t j = 0; j < n; ++j)
        if (i != j && (delay_us > 0 || decorate))
          mesh[i][j] = std::make_unique<transport::faults::faulty_link>(
              std::move(mesh[i][j]), injector, std::to_string(i), std::to_string(j));
  } else {
    mesh[0].resize(1);
  }
  std::vector<std::unique_ptr<collectives::group>> groups(n);
  std::vector<result<void>> errors(n, ok());
  figures out;
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto pool = thread_pool::create(compute_threads, {.pin = false});
      if (!pool) return void(errors[r] = pool.error());
      collectives::group_options go;
      go.timeout_ms = std::chrono::milliseconds(60'000);
      auto g = collectives::group::create(r, ct::row(mesh, r), go);
      if (!g) return void(errors[r] = g.error());
      auto ru = sharded::runner::create(*shards[r], **g, kind, pool->get());
      if (!ru) return void(errors[r] = ru.error());
      if (r != 0) return void(errors[r] = (*ru)->follow());
      auto body = [&]() -> result<void> {
        std::vector<model::token_id> prompt(static_cast<std::size_t>(prompt_n));
        for (int i = 0; i < prompt_n; ++i)
          prompt[static_cast<std::size_t>(i)] = 1 + (i * 37) % 1000;
        std::vector<float> logits(static_cast<std::size_t>(hp->n_vocab));
        TESSERA_TRY((*ru)->open(0, prompt_n + decode_n + 1));
        auto t0 = clock_type::now();
        TESSERA_TRY((*ru)->eval(0, prompt, logits));
        auto t1 = clock_type::now();
        for (int s = 0; s < decode_n; ++s) {
          const auto t = static_cast<model::token_id>(
              std::max_element(logits.begin(), logits.end()) - logits.begin());
          const model::token_id one[1] = {t};
          TESSERA_TRY((*ru)->eval(0, one, logits));
        }
        auto t2 = clock_type::now();
        out.prefill_tok_s = prompt_n / std::chrono::duration<double>(t1 - t0).count();
        out.decode_tok_s = decode_n / std::chrono::duration<double>(t2 - t1).count();
        return (*ru)->shutdown();
      };
      errors[0] = body();
    });
  for (auto& t : threads)
    t.join();
  for (auto& e : errors)
    if (!e) return e.error();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"decode/prefill speed of a model split over ranks (threads) over real bulk links"};
  std::string model_path;
  std::vector<std::uint32_t> ranks{1, 2};
  std::string layout_name = "tp,pp";
  std::string backend_name = "shm";
  std::vector<std::int64_t> delays{0};
  int prompt_n = 64, decode_n = 32, reps = 3;
  bool also_decorated = false;
  std::vector<int> one_rank_threads{1};
  app.add_option("--model", model_path, "GGUF model")->required();
  app.add_option("--ranks", ranks, "rank counts (1 = the unsplit model)")->delimiter(',');
  app.add_option("--layout", layout_name, "tp, pp or both (tp,pp)");
  app.add_option("--backend", backend_name, "shm or tcp");
  app.add_option("--delay-us", delays, "extra latency per message (fault layer)")->delimiter(',');
  app.add_option("--prompt", prompt_n, "prompt tokens");
  app.add_option("--tokens", decode_n, "decode steps");
  app.add_option("--reps", reps, "repetitions (median reported)");
  app.add_flag("--also-decorated", also_decorated,
               "after each 0 us row, the same with the fault layer on the links, no fault set");
  app.add_option("--one-rank-threads", one_rank_threads,
                 "compute threads of the unsplit baseline, e.g. 1,2 (split ranks have 1 each)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  const auto backend = backend_name == "tcp" ? bulk::backend_kind::tcp : bulk::backend_kind::shm;
  std::vector<std::pair<std::string, sharded::layout>> layouts;
  if (layout_name.find("tp") != std::string::npos)
    layouts.push_back({"tp", sharded::layout::tensor});
  if (layout_name.find("pp") != std::string::npos)
    layouts.push_back({"pp", sharded::layout::pipeline});
  std::printf(
      "| layout | ranks x threads | backend | added latency | prefill tok/s | decode tok/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (auto n : ranks)
    for (const auto& [lname, kind] : layouts) {
      if (n == 1 && lname != layouts.front().first) continue;  // one baseline
      for (auto d : delays)
        for (bool decorate : {false, true})
          for (int threads : n == 1 ? one_rank_threads : std::vector<int>{1}) {
            if (n == 1 && d != delays.front()) continue;
            if (decorate && (n == 1 || d != 0 || !also_decorated)) continue;
            std::vector<figures> runs;
            for (int k = 0; k < reps; ++k) {
              auto r = run(model_path, kind, n, backend, d, decorate, prompt_n, decode_n, threads);
              if (!r) {
                std::fprintf(stderr, "%s x%u delay %lld us: %s\n", lname.c_str(), n,
                             static_cast<long long>(d), r.error().describe().c_str());
                return 1;
              }
              runs.push_back(*r);
            }
            auto med = [&](auto get) {
              std::vector<double> v;
              for (auto& f : runs)
                v.push_back(get(f));
              std::sort(v.begin(), v.end());
              return v[v.size() / 2];
            };
            std::printf(
                "| %s | %u x %d | %s | %s | %.1f | %.1f |\n", n == 1 ? "-" : lname.c_str(), n,
                threads, n == 1 ? "-" : backend_name.c_str(),
                n == 1
                    ? "-"
                    : fmt::format("{} µs{}", d, decorate ? " (fault layer, no fault)" : "").c_str(),
                med([](const figures& f) { return f.prefill_tok_s; }),
                med([](const figures& f) { return f.decode_tok_s; }));
            std::fflush(stdout);
          }
    }
  return 0;
}
