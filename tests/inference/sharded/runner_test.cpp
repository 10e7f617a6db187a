// Distributed forward passes over real bulk links (ranks as threads): pipeline-parallel logits are
// bit-identical to one model's, tensor-parallel ones within a stated tolerance, and greedy
// generation gives the same tokens, on 2 and 3 ranks, over tcp and shm.
#include "inference/sharded/runner.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "inference/gguf/gguf.hpp"
#include "inference/gguf/synth.hpp"
#include "tests/inference/collectives/support.hpp"

namespace tessera::inference::sharded {
namespace {

namespace bulk = transport::bulk;
namespace ct = collectives::testing;
using model::logits_mode;
using model::token_id;

constexpr int kSteps = 12;

struct model_path {
  std::string path;
  explicit model_path(const char* arch) {
    auto cfg = gguf::synth_preset("tiny", arch);
    EXPECT_TRUE(cfg);
    cfg->dim = 192;
    cfg->layers = 4;
    cfg->heads = 6;
    cfg->kv_heads = 3;
    cfg->ffn = 256;
    cfg->vocab = 2000;
    cfg->context = 256;
    cfg->type = tensor_type::q8_0;
    path = (std::filesystem::temp_directory_path() /
            ("tessera-sharded-" + std::string(arch) + "-" + std::to_string(::getpid()) + ".gguf"))
               .string();
    auto w = gguf::write_synthetic_model(*cfg, path);
    EXPECT_TRUE(w) << w.error().describe();
  }
  ~model_path() { std::filesystem::remove(path); }
};

std::vector<float> argmax_run(const model::model& m, std::vector<token_id> prompt,
                              std::vector<std::vector<float>>& logits_per_step) {
  auto c = model::context::create(m, {256, 64, nullptr, {}});
  EXPECT_TRUE(c);
  std::vector<float> logits(static_cast<std::size_t>(m.params().n_vocab));
  std::vector<float> tokens;
  std::vector<token_id> feed = prompt;
  for (int s = 0; s < kSteps; ++s) {
    auto r = (*c)->eval(feed, logits_mode::last, logits);
    EXPECT_TRUE(r) << r.error().describe();
    logits_per_step.push_back(logits);
    const auto t =
        static_cast<token_id>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    tokens.push_back(static_cast<float>(t));
    feed = {t};
  }
  return tokens;
}

// Hybrid: 3 ranks = a tensor-parallel stage of 2 then one full-width rank; 4 ranks = two stages of
// 2 tensor-parallel ranks. Layers [0, 2) and [2, 4).
std::vector<std::uint32_t> stages_for(std::uint32_t n) {
  return n == 3 ? std::vector<std::uint32_t>{0, 0, 1} : std::vector<std::uint32_t>{0, 0, 1, 1};
}

model::shard_spec shard_for(layout kind, std::uint32_t rank, std::uint32_t n) {
  model::shard_spec s;
  if (kind == layout::hybrid) {
    const auto stage = stages_for(n)[rank];
    const bool alone = n == 3 && stage == 1;
    s = alone ? model::shard_spec::layers(2, 4) : shard_for(layout::tensor, rank % 2, 2);
    s.first_layer = stage == 0 ? 0 : 2;
    s.last_layer = stage == 0 ? 2 : 4;
    return s;
  }
  if (kind == layout::pipeline) {
    // 4 layers over n ranks: [0,2),[2,4) or [0,2),[2,3),[3,4).
    const std::int64_t bounds2[] = {0, 2, 4}, bounds3[] = {0, 2, 3, 4};
    const auto* b = n == 2 ? bounds2 : bounds3;
    return model::shard_spec::layers(b[rank], b[rank + 1]);
  }
  // 6 query heads in 3 GQA groups of 2 and 256 FFN columns in blocks of 32; uneven for 2 ranks
  // (heads: 3 + 3 cuts the middle GQA group, whose KV head both ranks hold; 3 + 2 + 1 cuts two)
  // and 3 ranks (FFN).
  const std::int64_t heads2[] = {0, 3, 6}, heads3[] = {0, 3, 5, 6};
  const std::int64_t ffn2[] = {0, 128, 256}, ffn3[] = {0, 96, 192, 256};
  s.head_begin = (n == 2 ? heads2 : heads3)[rank];
  s.head_end = (n == 2 ? heads2 : heads3)[rank + 1];
  s.ffn_begin = (n == 2 ? ffn2 : ffn3)[rank];
  s.ffn_end = (n == 2 ? ffn2 : ffn3)[rank + 1];
  return s;
}

void run_case(const std::string& path, layout kind, std::uint32_t n, bulk::backend_kind backend) {
  SCOPED_TRACE(::testing::Message() << (kind == layout::pipeline ? "pipeline"
                                        : kind == layout::tensor ? "tensor"
                                                                 : "hybrid")
                                    << " x" << n << " over " << static_cast<int>(backend));
  auto make_runner = [&](const model::model& m, collectives::group& g) {
    return kind == layout::hybrid ? runner::create(m, g, stages_for(n), nullptr)
                                  : runner::create(m, g, kind, nullptr);
  };
  auto f = gguf::file::open(path, {gguf::load_mode::headers_only, {}});
  ASSERT_TRUE(f);
  auto full = model::model::load(*f);
  ASSERT_TRUE(full);
  const std::vector<token_id> prompt = {1, 17, 300, 45, 599, 2, 88};
  std::vector<std::vector<float>> want_logits;
  const auto want = argmax_run(**full, prompt, want_logits);

  std::vector<std::unique_ptr<model::model>> shards(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    auto m = model::model::load(*f, {shard_for(kind, r, n)});
    ASSERT_TRUE(m) << m.error().describe();
    shards[r] = std::move(*m);
  }
  auto mesh = ct::make_local_mesh(backend, n);
  ASSERT_TRUE(mesh) << mesh.error().describe();
  collectives::group_options go;
  go.timeout_ms = std::chrono::milliseconds(20'000);
  std::vector<std::unique_ptr<collectives::group>> groups(n);
  {
    std::vector<std::thread> ts;
    for (std::uint32_t r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        auto g = collectives::group::create(r, ct::row(*mesh, r), go);
        ASSERT_TRUE(g) << g.error().describe();
        groups[r] = std::move(*g);
      });
    for (auto& t : ts)
      t.join();
  }
  for (auto& g : groups)
    ASSERT_TRUE(g);

  std::vector<std::thread> followers;
  std::vector<result<void>> follow_results(n, ok());
  for (std::uint32_t r = 1; r < n; ++r)
    followers.emplace_back([&, r] {
      auto ru = make_runner(*shards[r], *groups[r]);
      if (!ru) {
        follow_results[r] = ru.error();
        return;
      }
      follow_results[r] = (*ru)->follow();
    });
  auto lead = make_runner(*shards[0], *groups[0]);
  ASSERT_TRUE(lead) << lead.error().describe();
  ASSERT_TRUE((*lead)->open(3, 256));
  std::vector<float> logits(static_cast<std::size_t>(shards[0]->params().n_vocab));
  std::vector<float> got;
  std::vector<token_id> feed = prompt;
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) {
    auto r = (*lead)->eval(3, feed, logits);
    ASSERT_TRUE(r) << r.error().describe();
    if (kind == layout::pipeline) {
      EXPECT_EQ(logits, want_logits[static_cast<std::size_t>(s)]) << "step " << s;
    } else {
      double num = 0, den = 0;
      const auto& w = want_logits[static_cast<std::size_t>(s)];
      for (std::size_t i = 0; i < w.size(); ++i) {
        num += (logits[i] - w[i]) * (logits[i] - w[i]);
        den += w[i] * w[i];
      }
      worst = std::max(worst, std::sqrt(num / den));
    }
    const auto t =
        static_cast<token_id>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    got.push_back(static_cast<float>(t));
    feed = {t};
  }
  // Tensor parallel: only the order of f32 additions differs (and, for q8_0, the activation
  // rounding that order can flip): relative RMS error within 2e-2 (1.02e-2 measured since q8_0
  // sums exact blocks, issue 35; the numpy reference allows q8_0 3e-2 against float64).
  EXPECT_LT(worst, 2e-2);
  EXPECT_EQ(got, want);
  EXPECT_EQ((*lead)->pos(3), static_cast<std::int64_t>(prompt.size()) + kSteps - 1);
  EXPECT_TRUE((*lead)->ping());
  EXPECT_TRUE((*lead)->close(3));
  EXPECT_FALSE((*lead)->eval(3, feed, logits));  // closed

  // Continuous batching: two sequences in one pass per step — the second starts (its prompt's
  // prefill) while the first decodes — each with the logits it gets alone.
  {
    const std::vector<token_id> prompt2 = {5, 1999, 64, 64, 3};
    std::vector<std::vector<float>> want2_logits;
    const auto want2 = argmax_run(**full, prompt2, want2_logits);
    ASSERT_TRUE((*lead)->open(5, 256));
    ASSERT_TRUE((*lead)->open(6, 256));
    const std::vector<const std::vector<std::vector<float>>*> refs = {&want_logits, &want2_logits};
    std::vector<std::vector<token_id>> feeds = {prompt, prompt2};
    std::vector<std::vector<float>> outs(2, std::vector<float>(logits.size()));
    std::vector<std::size_t> step(2, 0);
    double worst_batch = 0;
    for (int round = 0; round <= kSteps; ++round) {
      std::vector<batch_request> reqs;
      std::vector<std::size_t> who;
      for (std::size_t q = 0; q < 2; ++q) {
        if (q == 1 && round == 0) continue;  // starts one round later
        if (step[q] >= static_cast<std::size_t>(kSteps)) continue;
        reqs.push_back({static_cast<std::uint32_t>(5 + q), feeds[q], outs[q]});
        who.push_back(q);
      }
      if (reqs.empty()) break;
      auto r = (*lead)->eval_batch(reqs);
      ASSERT_TRUE(r) << r.error().describe();
      for (auto q : who) {
        const auto& w = (*refs[q])[step[q]];
        if (kind == layout::pipeline) {
          EXPECT_EQ(outs[q], w) << "batched sequence " << q << " step " << step[q];
        } else {
          double num = 0, den = 0;
          for (std::size_t i = 0; i < w.size(); ++i) {
            num += (outs[q][i] - w[i]) * (outs[q][i] - w[i]);
            den += w[i] * w[i];
          }
          worst_batch = std::max(worst_batch, std::sqrt(num / den));
        }
        const auto t = static_cast<token_id>(std::max_element(outs[q].begin(), outs[q].end()) -
                                             outs[q].begin());
        EXPECT_EQ(static_cast<float>(t), (q == 0 ? want : want2)[step[q]]) << "sequence " << q;
        feeds[q] = {t};
        ++step[q];
      }
    }
    EXPECT_LT(worst_batch, 2e-2);
    EXPECT_EQ(step[0], static_cast<std::size_t>(kSteps));
    EXPECT_EQ(step[1], static_cast<std::size_t>(kSteps));
    // Refused before anything is sent: a repeated or closed sequence, too many tokens.
    std::vector<batch_request> twice = {{5, feeds[0], {}}, {5, feeds[0], {}}};
    EXPECT_FALSE((*lead)->eval_batch(twice));
    std::vector<batch_request> closed = {{3, feeds[0], {}}};
    EXPECT_FALSE((*lead)->eval_batch(closed));
    const std::vector<token_id> many(max_chunk + 1, 7);
    std::vector<batch_request> big = {{5, many, {}}};
    EXPECT_FALSE((*lead)->eval_batch(big));
    EXPECT_TRUE((*lead)->close(5));
    EXPECT_TRUE((*lead)->close(6));
  }
  ASSERT_TRUE((*lead)->shutdown());
  for (auto& t : followers)
    t.join();
  for (std::uint32_t r = 1; r < n; ++r)
    EXPECT_TRUE(follow_results[r]) << "rank " << r << ": " << follow_results[r].error().describe();
}

TEST(ShardedRunner, PipelineAndTensorParallelMatchOneModel) {
  model_path mp("llama");
  for (auto backend : {bulk::backend_kind::tcp, bulk::backend_kind::shm})
    for (auto kind : {layout::pipeline, layout::tensor})
      for (std::uint32_t n : {2u, 3u})
        run_case(mp.path, kind, n, backend);
}

// A follower that dies (its links close) fails rank 0's next eval with an error — never a hang.
// Pipeline stages of tensor-parallel teams: a stage of 2 then a full-width rank, and two stages of
// 2. Within the tensor-parallel tolerance of one model, the same greedy tokens, batched too.
TEST(ShardedRunner, HybridStagesOfTensorParallelTeamsMatchOneModel) {
  model_path mp("llama");
  for (auto backend : {bulk::backend_kind::tcp, bulk::backend_kind::shm})
    for (std::uint32_t n : {3u, 4u})
      run_case(mp.path, layout::hybrid, n, backend);
}

TEST(ShardedRunner, ADeadFollowerFailsTheLeaderInsteadOfHanging) {
  model_path mp("llama");
  auto f = gguf::file::open(mp.path, {gguf::load_mode::headers_only, {}});
  ASSERT_TRUE(f);
  auto head = model::model::load(*f, {model::shard_spec::layers(0, 2)});
  auto tail = model::model::load(*f, {model::shard_spec::layers(2, 4)});
  ASSERT_TRUE(head && tail);
  auto mesh = ct::make_local_mesh(bulk::backend_kind::tcp, 2);
  ASSERT_TRUE(mesh);
  collectives::group_options go;
  go.timeout_ms = std::chrono::milliseconds(20'000);
  std::vector<std::unique_ptr<collectives::group>> groups(2);
  std::thread t(
      [&] { groups[1] = std::move(*collectives::group::create(1, ct::row(*mesh, 1), go)); });
  groups[0] = std::move(*collectives::group::create(0, ct::row(*mesh, 0), go));
  t.join();
  auto lead = runner::create(**head, *groups[0], layout::pipeline, nullptr);
  ASSERT_TRUE(lead);
  std::thread follower([&] {
    auto ru = runner::create(**tail, *groups[1], layout::pipeline, nullptr);
    ASSERT_TRUE(ru);
    (void)(*ru)->follow();
  });
  ASSERT_TRUE((*lead)->open(0, 64));
  std::vector<float> logits(static_cast<std::size_t>((*head)->params().n_vocab));
  const std::vector<token_id> prompt = {1, 17, 300};
  ASSERT_TRUE((*lead)->eval(0, prompt, logits));
  (*mesh)[1][0]->close();                     // rank 1 dies: its link to rank 0 goes down
  auto r = (*lead)->eval(0, prompt, logits);  // a hang here is caught by ctest's time-out
  EXPECT_FALSE(r);
  follower.join();
}

TEST(ShardedRunner, ShardsThatDoNotFitTheLayoutAreRefused) {
  model_path mp("llama");
  auto f = gguf::file::open(mp.path, {gguf::load_mode::headers_only, {}});
  ASSERT_TRUE(f);
  auto mesh = ct::make_local_mesh(bulk::backend_kind::tcp, 2);
  ASSERT_TRUE(mesh);
  std::vector<std::unique_ptr<collectives::group>> groups(2);
  std::thread t(
      [&] { groups[1] = std::move(*collectives::group::create(1, ct::row(*mesh, 1), {})); });
  groups[0] = std::move(*collectives::group::create(0, ct::row(*mesh, 0), {}));
  t.join();
  auto tail = model::model::load(*f, {model::shard_spec::layers(2, 4)});
  ASSERT_TRUE(tail);
  auto e = runner::create(**tail, *groups[0], layout::pipeline, nullptr);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("embedding"), std::string::npos) << e.error().message;
  auto e2 = runner::create(**tail, *groups[0], layout::tensor, nullptr);
  ASSERT_FALSE(e2);
  EXPECT_NE(e2.error().message.find("every layer"), std::string::npos) << e2.error().message;
  auto full = model::model::load(*f);
  ASSERT_TRUE(full);
  auto e3 = runner::create(**full, *groups[1], layout::pipeline, nullptr);  // rank 1 of 2
  ASSERT_FALSE(e3);
}

}  // namespace
}  // namespace tessera::inference::sharded
