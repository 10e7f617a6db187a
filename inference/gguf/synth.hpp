// Synthetic llama / qwen3 models (deterministic random weights + a working tokenizer) for tests,
// benchmarks and the demo, and a summary of any GGUF model file (`tessera model info`).
//
// Weights: every 2-D weight ~ N(0, 1/fan_in) (std 1/sqrt(fan_in), an Irwin-Hall approximation of
// the normal), the embedding ~ N(0, 1), norm weights 1 + U(-0.1, 0.1); so activations stay O(1)
// through any depth. Each row is seeded from (seed, tensor name, row), so the same arguments give
// the same bytes on any machine and rows can be generated in parallel. Norms (1-D) are F32 like
// llama.cpp; 2-D weights take the requested type, except that rows whose length is not a multiple
// of a K-quant's 256 fall back to q8_0 (as llama.cpp's quantizer does).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "actors/base/result.hpp"
#include "inference/gguf/gguf.hpp"

namespace tessera::inference::gguf {

struct synth_config {
  std::string arch = "llama";  ///< "llama" (SentencePiece vocab) or "qwen3" (BPE vocab, q/k norm)
  std::uint32_t dim = 512;
  std::uint32_t layers = 8;
  std::uint32_t heads = 8;
  std::uint32_t kv_heads = 4;
  std::uint32_t ffn = 1408;
  std::uint32_t vocab = 32000;
  std::uint32_t context = 2048;
  tensor_type type = tensor_type::f16;
  std::uint64_t seed = 1;
  bool tied_embeddings = false;  ///< omit output.weight (the engine reuses token_embd)
  std::string name;              ///< general.name; derived from the arguments when empty
};

/// "tiny" (dim 512, 8 layers, 8/4 heads, FFN 1408, vocab 32000, ~56M params) or "large"
/// (dim 1024, 24 layers, 16/4 heads, FFN 2816, vocab 32000, ~336M params), for `arch`.
result<synth_config> synth_preset(std::string_view preset, std::string_view arch = "llama");

/// Checks the shape: heads divide dim, kv_heads divide heads, head_dim even, bounds on every
/// number (dim <= 16384, layers <= 256, vocab within the synthetic vocabulary limits, ...).
result<void> validate(const synth_config& c);

struct synth_summary {
  std::uint64_t params = 0;
  std::uint64_t file_bytes = 0;
  std::uint64_t tensors = 0;
};

/// Writes the model to `path`. Errors: invalid config, io.
result<synth_summary> write_synthetic_model(const synth_config& c, const std::string& path);

/// What `tessera model info` prints.
struct model_summary {
  std::string file;
  std::uint64_t file_bytes = 0;
  std::uint32_t version = 0;
  std::string architecture;
  std::string name;
  std::map<std::string, std::uint64_t> dims;  ///< embedding_length, block_count, head_count, ...
  std::uint64_t params = 0;
  std::uint64_t tensor_count = 0;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> types;  ///< type -> (tensors, bytes)
  std::string tokenizer;  ///< "spm", "bpe (qwen2)", or "none"
  std::uint64_t vocab = 0;
  std::string chat_template;  ///< family chosen for the model
};

/// Summarises a GGUF file, reading only its header (no tensor bytes).
result<model_summary> summarize_model(const std::string& path);
std::string to_text(const model_summary& s);
std::string to_json(const model_summary& s);

}  // namespace tessera::inference::gguf
