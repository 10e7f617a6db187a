// Model distribution benchmark: how fast a peer without the file gets a model's bytes from a
// holder (mesh/serving/model_share: chunks over a bulk link, each verified by BLAKE2b, written into
// a sparse copy), against the floor measured in the same run — reading the file and writing a copy
// in the same chunks, each checked against the chunk table, with no network (`verified copy`: the
// fetcher's own work; `copy` without the check for reference). Also the holder's one-time cost at
// start (hashing the file), and a pipeline stage's share of the bytes.
//
//   tessera_share_bench [--model PATH] [--reps N]
//
// Without --model the `large` preset (Q8_0) is synthesised under build/bench-models/. The file is
// read once first so that every figure sees it in the page cache (a holder serving a model it
// loaded). Median of --reps.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inference/gguf/synth.hpp"
#include "mesh/serving/model_share.hpp"

namespace fs = std::filesystem;
namespace gguf = tessera::inference::gguf;
namespace mdl = tessera::inference::model;
namespace bulk = tessera::transport::bulk;
using namespace tessera::mesh::serving;
using clock_type = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "tessera_share_bench: %s\n", what.c_str());
  std::exit(1);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Read + write in 1 MiB pieces, as a fetch does, with nothing else — or, with `table`, checking
/// each piece against it as a fetcher does (the fetcher's own work without the network).
double copy_once(const std::string& src, const std::string& dst,
                 const chunk_table* table = nullptr) {
  const auto t0 = clock_type::now();
  const int in = ::open(src.c_str(), O_RDONLY);
  const int out = ::open(dst.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (in < 0 || out < 0) die("copy: cannot open");
  std::vector<char> buf(1 << 20);
  for (off_t off = 0;;) {
    const ssize_t n = ::pread(in, buf.data(), buf.size(), off);
    if (n <= 0) break;
    if (table && !table->matches(static_cast<std::uint64_t>(off) / table->chunk_bytes,
                                 {reinterpret_cast<const std::byte*>(buf.data()),
                                  static_cast<std::size_t>(n)}))
      die("copy: a chunk does not match");
    if (::pwrite(out, buf.data(), static_cast<std::size_t>(n), off) != n) die("copy: write");
    off += n;
  }
  ::fsync(out);
  ::close(in);
  ::close(out);
  return seconds_since(t0);
}

struct wiring {
  std::mutex mu;
  std::unique_ptr<share_server> server;
  std::unique_ptr<model_fetch> fetch;
};

/// One fetch of `shard` over `backend` into a fresh directory: seconds and bytes fetched.
std::pair<double, std::uint64_t> fetch_once(const std::string& model, const chunk_table& table,
                                            bulk::backend_kind backend, const mdl::shard_spec& shard,
                                            const std::string& dir) {
  fs::remove_all(dir);
  wiring w;
  w.server = std::make_unique<share_server>(bulk::link_addresses{"127.0.0.1", ""},
                                            [&w](const std::string&, const share_setup& m) {
                                              std::lock_guard lock(w.mu);
                                              if (w.fetch) w.fetch->on_answer("holder", m);
                                            });
  w.server->add("m", model, table);
  model_fetch::options o;
  o.model = "m";
  o.root = content_root(table);
  o.dir = dir;
  o.addresses = {"127.0.0.1", ""};
  o.fetch_id = 1;
  o.send = [&w](const std::string&, const share_setup& m) { w.server->on_offer("fetcher", m); };
  {
    std::lock_guard lock(w.mu);
    w.fetch = std::make_unique<model_fetch>(std::move(o));
  }
  const auto t0 = clock_type::now();
  w.fetch->want({{"holder", backend}}, {shard});
  while (!w.fetch->ready_for(shard)) {
    const auto p = w.fetch->snapshot();
    if (p.st == model_fetch::state::failed) die("fetch failed: " + p.error);
    if (seconds_since(t0) > 300) die("fetch did not finish in 300 s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double s = seconds_since(t0);
  const auto bytes = w.fetch->snapshot().fetched_bytes;
  {
    std::lock_guard lock(w.mu);
    w.fetch.reset();
  }
  w.server.reset();
  return {s, bytes};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: tessera_share_bench [--model PATH] [--reps N]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (model.empty()) {
    fs::create_directories("build/bench-models");
    model = "build/bench-models/large-q8_0.gguf";
    if (!fs::exists(model)) {
      auto c = gguf::synth_preset("large");
      if (!c) die(c.error().describe());
      c->type = tessera::inference::tensor_type::q8_0;
      if (auto r = gguf::write_synthetic_model(*c, model); !r) die(r.error().describe());
    }
  }
  const auto size = fs::file_size(model);
  const std::string work = fs::temp_directory_path() / ("tessera-share-bench-" + std::to_string(::getpid()));
  fs::create_directories(work);
  copy_once(model, work + "/warm");  // page cache

  std::vector<double> hash_s, copy_s, verify_s;
  std::optional<chunk_table> table;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    auto t = hash_model_file(model);
    if (!t) die(t.error().describe());
    hash_s.push_back(seconds_since(t0));
    table = *t;
    copy_s.push_back(copy_once(model, work + "/copy"));
    verify_s.push_back(copy_once(model, work + "/copy", &*table));
  }
  auto f = gguf::file::open(model, {gguf::load_mode::headers_only, {}});
  if (!f) die(f.error().describe());
  auto hp = mdl::read_hparams(*f);
  if (!hp) die(hp.error().describe());
  const auto half = mdl::shard_spec::layers(hp->n_layer / 2, hp->n_layer);

  std::printf("model %s: %.1f MiB in %llu chunks of %llu KiB; %d reps, medians\n\n", model.c_str(),
              static_cast<double>(size) / (1 << 20),
              static_cast<unsigned long long>(table->chunks()),
              static_cast<unsigned long long>(table->chunk_bytes >> 10), reps);
  const double mb = static_cast<double>(size) / 1e6;
  std::printf("| what | seconds | MB/s | vs verified copy |\n|---|---|---|---|\n");
  const double copy = median(verify_s);
  std::printf("| copy: read + write, 1 MiB pieces, no network, no hash | %.3f | %.0f | - |\n",
              median(copy_s), mb / median(copy_s));
  std::printf("| verified copy: the same, each piece checked against the table (floor) | %.3f | %.0f | 1.00x |\n",
              copy, mb / copy);
  std::printf("| holder at start: hash the file (BLAKE2b-256 per chunk) | %.3f | %.0f | - |\n",
              median(hash_s), mb / median(hash_s));
  for (auto backend : {bulk::backend_kind::tcp, bulk::backend_kind::shm}) {
    std::vector<double> whole, part;
    std::uint64_t part_bytes = 0;
    for (int r = 0; r < reps; ++r) {
      whole.push_back(fetch_once(model, *table, backend, mdl::shard_spec::full(), work + "/f").first);
      auto [s, b] = fetch_once(model, *table, backend, half, work + "/f");
      part.push_back(s);
      part_bytes = b;
    }
    const double w = median(whole), p = median(part);
    std::printf("| fetch the whole model over %s (verify every chunk, write) | %.3f | %.0f | %.2fx |\n",
                std::string(bulk::to_string(backend)).c_str(), w, mb / w, copy / w);
    std::printf("| fetch layers [%lld, %lld) over %s: %.1f MiB (%.0f%% of the file) | %.3f | %.0f | - |\n",
                static_cast<long long>(half.first_layer), static_cast<long long>(half.last_layer),
                std::string(bulk::to_string(backend)).c_str(),
                static_cast<double>(part_bytes) / (1 << 20), 100.0 * part_bytes / size, p,
                static_cast<double>(part_bytes) / 1e6 / p);
  }
  fs::remove_all(work);
  return 0;
}
