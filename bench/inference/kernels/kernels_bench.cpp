// Kernel benchmarks: memory read bandwidth, mat-vec GB/s per type and ISA, batched mat-mul
// GFLOP/s, and the mat-muls of one whole token of the `tiny`/`large` presets (decode tokens/s with
// its bandwidth roofline; prefill of 128 tokens). Weights live in anonymous memory (huge pages
// requested) and decode rotates through enough copies to defeat the caches.
//
//   build/<dir>/bench/inference/kernels/tessera_kernels_bench --benchmark_filter=...
//
// Figures and the exact commands: bench/RESULTS.md, "Inference engine (issue 5)" / "Kernels".
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "inference/kernels/attention.hpp"
#include "inference/kernels/bandwidth.hpp"
#include "inference/kernels/cpu.hpp"
#include "inference/kernels/matmul.hpp"

namespace tessera::inference {
namespace {

constexpr tensor_type bench_types[] = {tensor_type::f32,  tensor_type::f16,  tensor_type::bf16,
                                       tensor_type::q8_0, tensor_type::q4_0, tensor_type::q4_k,
                                       tensor_type::q6_k};

// Anonymous memory with transparent huge pages requested, populated.
struct buffer {
  std::uint8_t* data = nullptr;
  std::size_t bytes = 0;
  explicit buffer(std::size_t n, bool huge_pages = true) : bytes(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    if (huge_pages) madvise(p, n, MADV_HUGEPAGE);
    data = static_cast<std::uint8_t*>(p);
  }
  ~buffer() { munmap(data, bytes); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
};

// Random weights with sane scales, written directly in the block format (quantizing hundreds of
// millions of floats would dominate the set-up time).
void fill_weights(tensor_type type, std::uint8_t* p, std::int64_t rows, std::int64_t cols,
                  std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t rb = *row_bytes(type, cols);
  const std::size_t total = rb * static_cast<std::size_t>(rows);
  for (std::size_t i = 0; i + 8 <= total; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  const std::uint16_t small = fp32_to_fp16(0.01f);
  const std::int64_t n = rows * cols;
  switch (type) {
    case tensor_type::f32:
      for (std::int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(p)[i] = static_cast<float>(rng() % 2001) * 1e-5f - 0.01f;
      break;
    case tensor_type::f16:
      for (std::int64_t i = 0; i < n; ++i) reinterpret_cast<std::uint16_t*>(p)[i] = static_cast<std::uint16_t>(0x2000 | (rng() & 0x83ff));
      break;
    case tensor_type::bf16:
      for (std::int64_t i = 0; i < n; ++i) reinterpret_cast<std::uint16_t*>(p)[i] = static_cast<std::uint16_t>(0x3c00 | (rng() & 0x807f));
      break;
    case tensor_type::q8_0:
      for (std::int64_t b = 0; b < n / 32; ++b) reinterpret_cast<block_q8_0*>(p)[b].d = small;
      break;
    case tensor_type::q4_0:
      for (std::int64_t b = 0; b < n / 32; ++b) reinterpret_cast<block_q4_0*>(p)[b].d = small;
      break;
    case tensor_type::q4_k:
      for (std::int64_t b = 0; b < n / 256; ++b) {
        reinterpret_cast<block_q4_k*>(p)[b].d = small;
        reinterpret_cast<block_q4_k*>(p)[b].dmin = small;
      }
      break;
    case tensor_type::q6_k:
      for (std::int64_t b = 0; b < n / 256; ++b) reinterpret_cast<block_q6_k*>(p)[b].d = small;
      break;
  }
}

std::vector<float> random_activations(std::int64_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

thread_pool* pool_of(int threads) {
  static std::map<int, std::unique_ptr<thread_pool>> pools;
  if (threads <= 1) return nullptr;
  auto& p = pools[threads];
  if (!p) p = std::move(*thread_pool::create(threads));
  return p.get();
}

// isa argument widest_isa: the widest tier this CPU has (the label names it), so the shape lists
// below also run on a CPU without AVX-512; 0, 1, 2 pick scalar, avx2, avx512 for comparisons.
constexpr std::int64_t widest_isa = -1;

bool select_isa(benchmark::State& state, std::int64_t level) {
  if (level == widest_isa) level = static_cast<std::int64_t>(best_isa());
  if (!isa_supported(static_cast<isa>(level))) {
    state.SkipWithError("ISA not supported by this CPU");
    return false;
  }
  (void)set_active_isa(static_cast<isa>(level));
  state.SetLabel(std::string(to_string(static_cast<isa>(level))));
  return true;
}

// ---- bandwidth ---------------------------------------------------------------------------------

void BM_read_bandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  double gbs = 0;
  for (auto _ : state) {
    auto r = measure_read_bandwidth(256u << 20, 7, pool_of(threads));
    if (!r) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    gbs = r->median_gb_per_s;
  }
  state.counters["GB/s"] = gbs;
}
BENCHMARK(BM_read_bandwidth)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);

// ---- mat-vec (decode) ---------------------------------------------------------------------------

// args: type slot, rows, cols, isa, threads
void BM_matvec(benchmark::State& state) {
  const tensor_type type = bench_types[state.range(0)];
  const std::int64_t rows = state.range(1), cols = state.range(2);
  if (!select_isa(state, state.range(3))) return;
  const int threads = static_cast<int>(state.range(4));
  const std::size_t bytes = *row_bytes(type, cols) * static_cast<std::size_t>(rows);
  // Enough copies to exceed ~256 MiB, so every call streams its weights from DRAM.
  const std::size_t copies = std::max<std::size_t>(1, (std::size_t{256} << 20) / bytes);
  buffer weights(bytes * copies);
  for (std::size_t c = 0; c < copies; ++c) fill_weights(type, weights.data + c * bytes, rows, cols, c);
  const auto x = random_activations(cols);
  std::vector<float> y(static_cast<std::size_t>(rows));
  std::size_t c = 0;
  for (auto _ : state) {
    const weight_view w{type, rows, cols, weights.data + c * bytes, 0};
    if (!matmul(w, x.data(), 1, y.data(), pool_of(threads))) std::abort();
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.SetLabel(std::string(to_string(type)) + " " + std::string(to_string(active_isa())));
}

void matvec_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "isa", "threads"});
  // tiny: 512x512 (q, o), 1408x512 (gate, up); large: 1024x1024, 2816x1024, 1024x2816 (down),
  // 32000x1024 (output).
  const std::int64_t shapes[][2] = {{512, 512},   {1408, 512},  {1024, 1024},
                                    {2816, 1024}, {1024, 2816}, {32000, 1024}};
  for (std::int64_t t = 0; t < 7; ++t) {
    for (const auto& s : shapes) {
      if (s[1] % block_elements(bench_types[t]) == 0) b->Args({t, s[0], s[1], widest_isa, 1});
    }
  }
  // The other ISA paths and 2 threads for the types the presets use (f16, q8_0).
  for (std::int64_t t : {1, 3}) {
    for (std::int64_t level : {0, 1}) {
      b->Args({t, 1024, 1024, level, 1});
      b->Args({t, 32000, 1024, level, 1});
    }
    b->Args({t, 32000, 1024, widest_isa, 2});
  }
}
BENCHMARK(BM_matvec)->Apply(matvec_args)->UseRealTime();

// ---- batched mat-mul (prefill) --------------------------------------------------------------------

// One timed mat-mul of `type` weights (rows x cols, `layout`) over `tokens` activation rows.
void time_matmul(benchmark::State& state, tensor_type type, std::int64_t rows, std::int64_t cols,
                 std::int64_t tokens, int threads, weight_layout layout) {
  const std::size_t bytes = *row_bytes(type, cols) * static_cast<std::size_t>(rows);
  buffer weights(bytes);
  fill_weights(type, weights.data, rows, cols, 1);
  if (layout == weight_layout::panels) pack_panels(type, weights.data, rows, cols);
  const auto x = random_activations(cols * tokens);
  std::vector<float> y(static_cast<std::size_t>(rows * tokens));
  const weight_view w{type, rows, cols, weights.data, 0, layout};
  for (auto _ : state) {
    if (!matmul(w, x.data(), tokens, y.data(), pool_of(threads))) std::abort();
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(rows * cols * tokens) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(std::string(to_string(type)) + " " + std::string(to_string(active_isa())) +
                 (layout == weight_layout::panels ? " panels" : ""));
}

// args: type slot, rows, cols, tokens, isa, threads
void BM_matmul(benchmark::State& state) {
  if (!select_isa(state, state.range(4))) return;
  time_matmul(state, bench_types[state.range(0)], state.range(1), state.range(2), state.range(3),
              static_cast<int>(state.range(5)), weight_layout::rows);
}

void matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "tokens", "isa", "threads"});
  for (std::int64_t t = 0; t < 7; ++t) {
    const std::int64_t cols = block_elements(bench_types[t]) == 256 ? 1024 : 512;
    for (std::int64_t level = 0; level < 3; ++level) b->Args({t, 1408, cols, 128, level, 1});
  }
  for (std::int64_t t : {1, 3}) b->Args({t, 1408, 512, 128, widest_isa, 2});
  // In-cache mat-vec (512 x 1024 stays in L2): the kernels' compute speed without DRAM.
  for (std::int64_t t = 0; t < 7; ++t) {
    for (std::int64_t level = 0; level < 3; ++level) b->Args({t, 512, 1024, 1, level, 1});
  }
  // Batched decode (continuous batching's 2-16 rows), the best tier, one thread: q8_0 from DRAM
  // (32768 x 4096, 136 MiB, 4x this host's L3) and from L2 (512 x 1024).
  for (std::int64_t tokens : {1, 2, 4, 8, 16}) {
    b->Args({3, 32768, 4096, tokens, widest_isa, 1});
    b->Args({3, 512, 1024, tokens, widest_isa, 1});
  }
}
BENCHMARK(BM_matmul)->Apply(matmul_args)->UseRealTime()->Unit(benchmark::kMillisecond);

// The same q8_0 mat-muls with the weights in panels (weight_layout::panels, packed once before
// the timed loop): args rows, cols, tokens; the best tier, one thread.
void BM_matmul_q8_0_panels(benchmark::State& state) {
  if (!select_isa(state, widest_isa)) return;
  time_matmul(state, tensor_type::q8_0, state.range(0), state.range(1), state.range(2), 1,
              weight_layout::panels);
}
void matmul_panels_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "tokens"});
  for (std::int64_t tokens : {1, 2, 4, 8, 16}) {
    b->Args({32768, 4096, tokens});
    b->Args({512, 1024, tokens});
  }
}
BENCHMARK(BM_matmul_q8_0_panels)
    ->Apply(matmul_panels_args)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- attention over a filled KV cache ------------------------------------------------------------

// One decode token's attention at depth n of the large preset's shape: 24 layers x 4 KV heads of
// head_dim 64, 4 query heads per KV head, every head's cache a distinct region (96 heads x n
// positions: 100 MB of f16 at 4096, from DRAM as in the model). args: positions, huge pages (0: 4
// KiB pages, where a 100 MB stream's TLB misses show), cache type (0 f16, 1 q8_0); the widest
// tier, one thread.
void BM_attention_decode(benchmark::State& state) {
  if (!select_isa(state, widest_isa)) return;
  const std::int64_t n = state.range(0), hd = 64, heads = 96, group = 4;
  const bool huge = state.range(1) != 0;
  const auto type = state.range(2) != 0 ? kv_cache_type::q8_0 : kv_cache_type::f16;
  const std::size_t per_head = static_cast<std::size_t>(key_cache_positions(n)) *
                               kv_position_bytes(type, hd);
  buffer keys(per_head * heads, huge), values(per_head * heads, huge);
  const std::vector<float> kv = random_activations(4096 * hd);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t j = 0; j < n; ++j) {
      const float* x = kv.data() + (h * 7 + j) % 4096 * hd;  // any values: only the reads count
      store_key(type, x, hd, keys.data + h * per_head, j);
      store_value(type, x, hd, values.data + h * per_head, j);
    }
  }
  const std::vector<float> q = random_activations(group * hd);
  std::vector<float> out(static_cast<std::size_t>(group * hd));
  std::vector<float> scratch(attention_scratch_floats(group, n, hd));
  const float* qs[4];
  float* outs[4];
  std::int64_t n_att[4];
  for (int i = 0; i < 4; ++i) {
    qs[i] = q.data() + i * hd;
    outs[i] = out.data() + i * hd;
    n_att[i] = n;
  }
  for (auto _ : state) {
    for (std::int64_t h = 0; h < heads; ++h) {
      attention_block a;
      a.q = qs;
      a.out = outs;
      a.n_att = n_att;
      a.n_q = group;
      a.type = type;
      a.keys = keys.data + h * per_head;
      a.values = values.data + h * per_head;
      a.head_dim = hd;
      a.scale = 0.125f;
      a.scratch = scratch.data();
      attend(a);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(to_string(type)));
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(2 * heads * n) *
                                                  static_cast<double>(kv_position_bytes(type, hd)),
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_attention_decode)
    ->ArgNames({"positions", "huge", "type"})
    ->ArgsProduct({{1024, 4096, 16384}, {0, 1}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- one token of a whole preset model ------------------------------------------------------------

struct preset {
  const char* name;
  std::int64_t dim, ffn, heads, kv_heads, layers, vocab;
};
constexpr preset presets[] = {{"tiny", 512, 1408, 8, 4, 8, 32000},
                              {"large", 1024, 2816, 16, 4, 24, 32000}};

struct model_weights {
  std::vector<weight_view> mats;  // every mat-mul of one token; output last
  std::unique_ptr<buffer> storage;
  std::size_t bytes = 0;
};

model_weights make_model(const preset& p, tensor_type type) {
  const std::int64_t kv = p.dim / p.heads * p.kv_heads;
  const std::int64_t layer_shapes[][2] = {{p.dim, p.dim}, {kv, p.dim},    {kv, p.dim},
                                          {p.dim, p.dim}, {p.ffn, p.dim}, {p.ffn, p.dim},
                                          {p.dim, p.ffn}};
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
  for (std::int64_t l = 0; l < p.layers; ++l) {
    for (const auto& s : layer_shapes) shapes.emplace_back(s[0], s[1]);
  }
  shapes.emplace_back(p.vocab, p.dim);
  model_weights m;
  for (const auto& [r, c] : shapes) m.bytes += *row_bytes(type, c) * static_cast<std::size_t>(r);
  m.storage = std::make_unique<buffer>(m.bytes);
  std::size_t off = 0;
  for (const auto& [r, c] : shapes) {
    fill_weights(type, m.storage->data + off, r, c, off);
    m.mats.push_back({type, r, c, m.storage->data + off, 0});
    off += *row_bytes(type, c) * static_cast<std::size_t>(r);
  }
  return m;
}

double bandwidth_1t() {
  static const double gbs = [] {
    auto r = measure_read_bandwidth(256u << 20, 7);
    return r ? r->median_gb_per_s : 0.0;
  }();
  return gbs;
}

// args: preset, type slot, threads, tokens (1 = decode incl. output; >1 = prefill, like
// llama-bench's pp: the output mat-mul only for the last token)
void BM_model(benchmark::State& state) {
  const preset& p = presets[state.range(0)];
  const tensor_type type = bench_types[state.range(1)];
  const int threads = static_cast<int>(state.range(2));
  const std::int64_t tokens = state.range(3);
  (void)set_active_isa(best_isa());
  if (!row_bytes(type, p.ffn) || !row_bytes(type, p.dim)) {
    state.SkipWithError("preset dimensions are not a multiple of this type's block size");
    return;
  }
  const double gbs = tokens == 1 ? bandwidth_1t() : 0.0;
  auto m = make_model(p, type);
  const std::int64_t widest = std::max(p.ffn, p.vocab);
  const auto x = random_activations(std::max(p.dim, p.ffn) * tokens);
  std::vector<float> y(static_cast<std::size_t>(widest * tokens));
  for (auto _ : state) {
    for (std::size_t i = 0; i < m.mats.size(); ++i) {
      const bool output = i + 1 == m.mats.size();
      const std::int64_t n = output ? 1 : tokens;
      if (!matmul(m.mats[i], x.data(), n, y.data(), pool_of(threads))) std::abort();
    }
    benchmark::DoNotOptimize(y.data());
  }
  const double tok = static_cast<double>(tokens);
  state.counters["tok/s"] =
      benchmark::Counter(tok * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["weight_MB"] = static_cast<double>(m.bytes) / 1e6;
  if (tokens == 1 && gbs > 0) {
    state.counters["roofline_tok/s"] = roofline_tokens_per_s(m.bytes, gbs);
    state.counters["bw_1t_GB/s"] = gbs;
  }
  state.SetLabel(std::string(p.name) + " " + std::string(to_string(type)) + " " +
                 std::string(to_string(active_isa())));
}

void model_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"preset", "type", "threads", "tokens"});
  for (std::int64_t p = 0; p < 2; ++p) {
    for (std::int64_t t : {1, 3, 0, 5, 6}) {
      for (std::int64_t threads : {1, 2}) {
        b->Args({p, t, threads, 1});
        b->Args({p, t, threads, 128});
      }
    }
  }
}
BENCHMARK(BM_model)->Apply(model_args)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera::inference

BENCHMARK_MAIN();
