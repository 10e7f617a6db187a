// Model distribution (mesh/serving/model_share): chunk tables, the byte ranges a shard reads, and
// real fetches over bulk links (tcp) between a holder and a fetcher in one process — verified
// chunk by chunk, refusing a holder whose bytes do not match the content id.
#include "mesh/serving/model_share.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "inference/gguf/synth.hpp"
#include "inference/model/model.hpp"
#include "tests/support/child_process.hpp"

namespace tessera::mesh::serving {
namespace {

namespace fs = std::filesystem;
namespace gguf = inference::gguf;
namespace mdl = inference::model;
using namespace std::chrono_literals;

// Several MiB (4 layers of ~2.6 MB in F32): several chunks, so a shard is a strict subset.
gguf::synth_config several_chunks() {
  gguf::synth_config c;
  c.dim = 256;
  c.layers = 4;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 512;
  c.vocab = 600;
  c.context = 64;
  c.type = inference::tensor_type::f32;
  c.seed = 9;
  return c;
}

class ModelShare : public ::testing::Test {
 protected:
  void SetUp() override {
    // spdlog's registry is made on first use; made here, before holder and fetcher threads log at
    // once (libspdlog is not built with ThreadSanitizer, which then cannot see the guard).
    spdlog::default_logger_raw();
    dir_ = fs::temp_directory_path() /
           ("tessera-share-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    model_ = (dir_ / "m.gguf").string();
    auto r = gguf::write_synthetic_model(several_chunks(), model_);
    ASSERT_TRUE(r) << r.error().describe();
  }
  void TearDown() override {
    // The holders' callbacks reach fetch_ under mu_ (from their worker threads, or from the
    // fetch's own thread for a refusal): take it away under mu_, destroy it outside (its
    // destructor joins that thread, which may be waiting for mu_).
    std::unique_ptr<model_fetch> gone;
    {
      std::lock_guard lock(mu_);
      gone = std::move(fetch_);
    }
    gone.reset();
    servers_.clear();
    fs::remove_all(dir_);
  }

  /// A holder named `hex` serving `path` as model "m" with `table` (of the original by default).
  void add_holder(const std::string& hex, const std::string& path,
                  std::optional<chunk_table> table = std::nullopt) {
    auto s = std::make_unique<share_server>(transport::bulk::link_addresses{"127.0.0.1", ""},
                                            [this, hex](const std::string&, const share_setup& m) {
                                              std::lock_guard lock(mu_);
                                              if (fetch_) fetch_->on_answer(hex, m);
                                            });
    if (!table) {
      auto t = hash_model_file(path);
      ASSERT_TRUE(t) << t.error().describe();
      table = *t;
    }
    s->add("m", path, *table);
    servers_[hex] = std::move(s);
  }

  void make_fetch(const std::string& root) {
    model_fetch::options o;
    o.model = "m";
    o.root = root;
    o.dir = (dir_ / "fetched").string();
    o.addresses = {"127.0.0.1", ""};
    o.fetch_id = 7;
    o.send = [this](const std::string& to, const share_setup& m) {
      auto it = servers_.find(to);
      if (it != servers_.end()) it->second->on_offer("fetcher", m);
    };
    auto fresh = std::make_unique<model_fetch>(std::move(o));
    {
      std::lock_guard lock(mu_);
      std::swap(fetch_, fresh);
    }
    fresh.reset();  // an earlier fetch goes outside the lock (see TearDown)
  }

  /// Waits (30 s at most) until the fetch is ready for `shard`, or its `attempt`th try failed.
  model_fetch::progress wait(const mdl::shard_spec& shard, std::uint64_t attempt = 1) {
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < end) {
      auto p = fetch_->snapshot();
      if (fetch_->ready_for(shard) || (p.st == model_fetch::state::failed && p.attempts >= attempt))
        return p;
      std::this_thread::sleep_for(10ms);
    }
    return fetch_->snapshot();
  }

  std::string root() {
    auto t = hash_model_file(model_);
    EXPECT_TRUE(t);
    return t ? content_root(*t) : std::string();
  }

  fs::path dir_;
  std::string model_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<share_server>> servers_;
  std::unique_ptr<model_fetch> fetch_;
};

TEST_F(ModelShare, ChunkTableRoundTripsAndRejectsCorruption) {
  auto t = hash_model_file(model_);
  ASSERT_TRUE(t) << t.error().describe();
  EXPECT_EQ(t->file_size, fs::file_size(model_));
  EXPECT_EQ(t->chunk_bytes, kMinChunkBytes);
  EXPECT_EQ(t->chunks(), (t->file_size + kMinChunkBytes - 1) / kMinChunkBytes);
  EXPECT_GE(t->chunks(), 4u);
  EXPECT_GT(t->data_offset, 0u);
  const auto enc = encode(*t);
  auto back = decode_chunk_table(enc);
  ASSERT_TRUE(back) << back.error().describe();
  EXPECT_EQ(content_root(*back), content_root(*t));
  EXPECT_EQ(content_root(*t).size(), 64u);
  // The same file hashes the same; one changed byte changes the root.
  EXPECT_EQ(content_root(*hash_model_file(model_)), content_root(*t));
  {
    std::fstream f(model_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t->file_size - 10));
    f.put('\x55');
  }
  EXPECT_NE(content_root(*hash_model_file(model_)), content_root(*t));
  // Truncated, inconsistent (a hash short, a size that needs more chunks), garbage.
  auto cut = enc;
  cut.resize(cut.size() / 2);
  EXPECT_EQ(decode_chunk_table(cut).error().code, errc::corrupt);
  auto short_hashes = *t;
  short_hashes.hashes.pop_back();
  EXPECT_EQ(decode_chunk_table(encode(short_hashes)).error().code, errc::corrupt);
  auto bigger = *t;
  bigger.file_size += 2 * kMinChunkBytes;
  EXPECT_EQ(decode_chunk_table(encode(bigger)).error().code, errc::corrupt);
  std::vector<std::uint8_t> junk(100, 0xc1);
  EXPECT_EQ(decode_chunk_table(junk).error().code, errc::corrupt);
  // Chunk cover: a range inside one chunk, one across a boundary, one past the end.
  std::vector<gguf::byte_range> rs{{10, 5}, {kMinChunkBytes - 1, 2}, {t->file_size + 5, 10}};
  EXPECT_EQ(chunks_covering(*t, rs), (std::vector<std::uint64_t>{0, 1}));
}

// A copy holding only the header and the ranges file_ranges() names for a shard serves that shard
// exactly as the whole file does: load() reads nothing else.
TEST_F(ModelShare, FileRangesAreEverythingAShardReads) {
  auto whole = gguf::file::open(model_, {gguf::load_mode::headers_only, {}});
  ASSERT_TRUE(whole);
  const auto shard = mdl::shard_spec::layers(2, 4);  // the last layers, the output
  auto ranges = mdl::model::file_ranges(*whole, {shard});
  ASSERT_TRUE(ranges) << ranges.error().describe();
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < ranges->size(); ++i) {
    covered += (*ranges)[i].size;
    if (i > 0) {
      EXPECT_GT((*ranges)[i].offset, (*ranges)[i - 1].offset + (*ranges)[i - 1].size);
    }
  }
  EXPECT_LT(covered, whole->file_size() * 3 / 4);
  // The sparse copy: zeros everywhere but the header and those ranges.
  const std::string original = test::read_file(model_);
  std::string sparse(original.size(), '\0');
  std::memcpy(sparse.data(), original.data(), whole->data_offset());
  for (const auto& r : *ranges)
    std::memcpy(sparse.data() + r.offset, original.data() + r.offset, r.size);
  const std::string copy = (dir_ / "sparse.gguf").string();
  std::ofstream(copy, std::ios::binary).write(sparse.data(), static_cast<std::streamsize>(sparse.size()));
  auto part = gguf::file::open(copy, {gguf::load_mode::headers_only, {}});
  ASSERT_TRUE(part);
  auto a = mdl::model::load(*whole, {shard});
  auto b = mdl::model::load(*part, {shard});
  ASSERT_TRUE(a && b);
  auto ca = mdl::context::create(**a), cb = mdl::context::create(**b);
  ASSERT_TRUE(ca && cb);
  const std::int64_t dim = 256, n = 3;
  std::vector<float> ha(dim * n), la(600), lb(600);
  for (std::size_t i = 0; i < ha.size(); ++i) ha[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  auto hb = ha;
  ASSERT_TRUE((*ca)->eval_hidden(ha, n, mdl::logits_mode::last, la));
  ASSERT_TRUE((*cb)->eval_hidden(hb, n, mdl::logits_mode::last, lb));
  EXPECT_EQ(la, lb);
  // And the sparse copy lacks what another shard needs: its first layer's bytes are zeros.
  auto other = mdl::model::file_ranges(*whole, {mdl::shard_spec::layers(0, 1)});
  ASSERT_TRUE(other);
  bool zeros = true;
  const auto& r0 = other->back();
  for (std::uint64_t k = 0; k < r0.size; ++k) zeros = zeros && sparse[r0.offset + k] == '\0';
  EXPECT_TRUE(zeros);
}

TEST_F(ModelShare, FetchesAShardOverABulkLinkThenTheRestForAReplica) {
  add_holder("holder-a", model_);
  make_fetch(root());
  const auto shard = mdl::shard_spec::layers(0, 1);
  fetch_->want({{"holder-a", transport::bulk::backend_kind::tcp}}, {shard});
  auto p = wait(shard);
  ASSERT_TRUE(fetch_->ready_for(shard)) << p.error;
  EXPECT_EQ(p.st, model_fetch::state::ready);
  EXPECT_EQ(p.from, "holder-a");
  const auto size = fs::file_size(model_);
  EXPECT_LT(p.bytes_total, size * 3 / 4) << "a one-layer shard fetched most of the file";
  EXPECT_EQ(p.bytes_done, p.bytes_total);
  EXPECT_FALSE(fetch_->ready_for(mdl::shard_spec::full()));
  EXPECT_FALSE(fetch_->complete());
  // The bytes the shard reads are the original's.
  {
    auto f = gguf::file::open(fetch_->path(), {gguf::load_mode::headers_only, {}});
    ASSERT_TRUE(f) << f.error().describe();
    auto ranges = mdl::model::file_ranges(*f, {shard});
    ASSERT_TRUE(ranges);
    const auto a = test::read_file(model_), b = test::read_file(fetch_->path());
    ASSERT_EQ(a.size(), b.size());
    for (const auto& r : *ranges)
      EXPECT_EQ(a.compare(r.offset, r.size, b, r.offset, r.size), 0) << "range at " << r.offset;
  }
  // A replica: the rest comes too (what is here already is not fetched again).
  const auto first = p.fetched_bytes;
  fetch_->want({{"holder-a", transport::bulk::backend_kind::tcp}}, {mdl::shard_spec::full()});
  p = wait(mdl::shard_spec::full());
  ASSERT_TRUE(fetch_->ready_for(mdl::shard_spec::full())) << p.error;
  EXPECT_TRUE(fetch_->ready_for(shard));
  EXPECT_EQ(p.bytes_total, size);
  EXPECT_EQ(p.fetched_bytes, size) << "chunks fetched twice (first fetch " << first << ")";
  EXPECT_EQ(test::read_file(model_), test::read_file(fetch_->path()));
  ASSERT_TRUE(fetch_->complete());
  EXPECT_EQ(content_root(*fetch_->complete_table()), root());
  const auto c = servers_["holder-a"]->counters();
  EXPECT_EQ(c.sessions, 2u);
  EXPECT_EQ(c.bytes, size);
}

// Over shm, and more chunks than a link has room for outstanding operations (64): the fetcher
// must poll its own sends' completions while replies keep arriving (a backend may hand received
// completions first).
TEST_F(ModelShare, FetchesManyChunksOverShm) {
  auto c = several_chunks();
  c.dim = 512;
  c.ffn = 1408;
  c.layers = 6;  // ~77 MiB in F32
  const std::string big = (dir_ / "big.gguf").string();
  ASSERT_TRUE(gguf::write_synthetic_model(c, big));
  auto t = hash_model_file(big);
  ASSERT_TRUE(t);
  ASSERT_GT(t->chunks(), 64u);
  add_holder("holder-a", big, *t);
  make_fetch(content_root(*t));
  fetch_->want({{"holder-a", transport::bulk::backend_kind::shm}}, {mdl::shard_spec::full()});
  auto p = wait(mdl::shard_spec::full());
  ASSERT_TRUE(fetch_->ready_for(mdl::shard_spec::full())) << p.error;
  EXPECT_EQ(p.fetched_bytes, fs::file_size(big));
  EXPECT_EQ(test::read_file(big), test::read_file(fetch_->path()));
}

// A holder whose file changed after it was hashed sends chunks that do not match the table: the
// fetcher refuses them, names the chunk, and fetches from the next holder.
TEST_F(ModelShare, ChunksThatDoNotMatchAreRefusedAndTheNextHolderServes) {
  const std::string bad = (dir_ / "bad.gguf").string();
  fs::copy_file(model_, bad);
  auto t = hash_model_file(model_);
  ASSERT_TRUE(t);
  add_holder("holder-good", model_);
  add_holder("holder-bad", bad, *t);  // announces the original's table
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t->file_size - 100));
    f.put('\x7f');
  }
  make_fetch(content_root(*t));
  // Only the bad holder: the fetch fails, naming the chunk.
  fetch_->want({{"holder-bad", transport::bulk::backend_kind::tcp}}, {mdl::shard_spec::full()});
  auto p = wait(mdl::shard_spec::full());
  EXPECT_EQ(p.st, model_fetch::state::failed);
  EXPECT_NE(p.error.find("does not match the model's hash"), std::string::npos) << p.error;
  EXPECT_FALSE(fetch_->ready_for(mdl::shard_spec::full()));
  // The bad holder first, then a good one: served, and the copy is the original.
  fetch_->want({{"holder-bad", transport::bulk::backend_kind::tcp},
                {"holder-good", transport::bulk::backend_kind::tcp}},
               {mdl::shard_spec::full()});
  p = wait(mdl::shard_spec::full(), 2);
  ASSERT_TRUE(fetch_->ready_for(mdl::shard_spec::full())) << p.error;
  EXPECT_EQ(p.from, "holder-good");
  EXPECT_EQ(p.attempts, 2u);
  EXPECT_EQ(test::read_file(model_), test::read_file(fetch_->path()));
}

TEST_F(ModelShare, AHolderOfOtherContentOrNoneRefuses) {
  add_holder("holder-a", model_);
  make_fetch(std::string(64, 'a'));
  fetch_->want({{"holder-a", transport::bulk::backend_kind::tcp}}, {mdl::shard_spec::full()});
  auto p = wait(mdl::shard_spec::full());
  EXPECT_EQ(p.st, model_fetch::state::failed);
  EXPECT_NE(p.error.find("other content"), std::string::npos) << p.error;
  EXPECT_EQ(servers_["holder-a"]->counters().refused, 1u);
  // Nobody to ask: an error that says so.
  fetch_->want({}, {mdl::shard_spec::layers(0, 2)});
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < end &&
         fetch_->snapshot().error.find("no live peer") == std::string::npos)
    std::this_thread::sleep_for(10ms);
  EXPECT_NE(fetch_->snapshot().error.find("no live peer holds"), std::string::npos)
      << fetch_->snapshot().error;
}

}  // namespace
}  // namespace tessera::mesh::serving
