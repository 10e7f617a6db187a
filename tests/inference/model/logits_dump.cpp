// tessera_model_logits MODEL --tokens 1,2,3 [--batch N] [--threads N] [--generate N]
//                       [--layers-split L]
// The C++ engine's logits for every position of a token sequence (teacher forcing), as JSON, for
// tests/inference/model/compare_reference.py to check against the float64 numpy reference.
//   --batch N        feed the tokens N at a time (default: all at once; 1 = decode path)
//   --threads N      compute threads (default 1)
//   --generate N     after the tokens, greedy-decode N tokens ("generated" in the output)
//   --layers-split L run layers [0, L) and [L, n) as two shard models chained by hidden states
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "inference/gguf/gguf.hpp"
#include "inference/model/generator.hpp"
#include "inference/model/model.hpp"

namespace {

int fail(const std::string& m) {
  std::fprintf(stderr, "tessera_model_logits: %s\n", m.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera::inference;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL --tokens 1,2,3 [--batch N] [--threads N] [--generate N]"
                         " [--layers-split L]\n", argv[0]);
    return 2;
  }
  std::string path = argv[1];
  std::vector<model::token_id> tokens;
  long batch = 0, threads = 1, generate = 0, split = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokens") {
      std::size_t p = 0;
      while (p < v.size()) {
        auto q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        tokens.push_back(static_cast<model::token_id>(std::strtol(v.substr(p, q - p).c_str(), nullptr, 10)));
        p = q + 1;
      }
    } else if (k == "--batch") {
      batch = std::strtol(v.c_str(), nullptr, 10);
    } else if (k == "--threads") {
      threads = std::strtol(v.c_str(), nullptr, 10);
    } else if (k == "--generate") {
      generate = std::strtol(v.c_str(), nullptr, 10);
    } else if (k == "--layers-split") {
      split = std::strtol(v.c_str(), nullptr, 10);
    } else {
      return fail("unknown option " + k);
    }
  }
  if (tokens.empty()) return fail("--tokens is required");
  auto f = gguf::file::open(path, {gguf::load_mode::headers_only, {}});
  if (!f) return fail(f.error().message);
  auto pool = thread_pool::create(static_cast<int>(threads));
  if (!pool) return fail(pool.error().message);
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t n_ctx = n + generate;
  const std::int64_t max_batch = batch > 0 ? batch : n;

  nlohmann::json out;
  out["tokens"] = tokens;
  std::vector<float> logits;
  std::int64_t vocab = 0;
  if (split > 0) {
    auto a = model::model::load(*f, {model::shard_spec::layers(0, split)});
    if (!a) return fail(a.error().message);
    auto b = model::model::load(*f, {model::shard_spec::layers(split, -1)});
    if (!b) return fail(b.error().message);
    auto ca = model::context::create(**a, {n_ctx, max_batch, pool->get()});
    auto cb = model::context::create(**b, {n_ctx, max_batch, pool->get()});
    if (!ca || !cb) return fail("context");
    const auto& hp = (*a)->params();
    vocab = hp.n_vocab;
    // The first shard cannot produce logits and the second cannot embed tokens: both are errors.
    std::vector<float> dummy(static_cast<std::size_t>(vocab));
    if ((*ca)->eval(std::span(tokens).first(1), model::logits_mode::last, dummy))
      return fail("a shard without the output layer produced logits");
    if ((*cb)->eval(std::span(tokens).first(1), model::logits_mode::none, {}))
      return fail("a shard without the embedding accepted tokens");
    logits.resize(static_cast<std::size_t>(n * vocab));
    std::vector<float> hidden(static_cast<std::size_t>(n * hp.dim));
    if (auto r = (*ca)->eval(tokens, model::logits_mode::none, {}, hidden); !r)
      return fail(r.error().message);
    if (auto r = (*cb)->eval_hidden(hidden, n, model::logits_mode::all, logits); !r)
      return fail(r.error().message);
  } else {
    auto m = model::model::load(*f);
    if (!m) return fail(m.error().message);
    vocab = (*m)->params().n_vocab;
    auto c = model::context::create(**m, {n_ctx, max_batch, pool->get()});
    if (!c) return fail(c.error().message);
    logits.resize(static_cast<std::size_t>(n * vocab));
    if (auto r = (*c)->eval(tokens, model::logits_mode::all, logits); !r) return fail(r.error().message);
    if (generate > 0) {
      // Greedy continuation from a fresh context through the generator (prefill + steps).
      auto c2 = model::context::create(**m, {n_ctx, max_batch, pool->get()});
      if (!c2) return fail(c2.error().message);
      model::generator g(**m, **c2, nullptr, model::sampler_options::greedy());
      auto st = g.generate(tokens, generate, {});
      if (!st) return fail(st.error().message);
      out["generated"] = std::vector<model::token_id>(g.history().begin() + n, g.history().end());
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json argmax = nlohmann::json::array();
  for (std::int64_t t = 0; t < n; ++t) {
    const float* r = logits.data() + t * vocab;
    rows.push_back(std::vector<float>(r, r + vocab));
    argmax.push_back(std::max_element(r, r + vocab) - r);
  }
  out["logits"] = rows;
  out["argmax"] = argmax;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
