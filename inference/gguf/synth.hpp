// Synthetic llama / qwen3 / qwen3moe models (deterministic random weights + a working tokenizer)
// for tests, benchmarks and the demo, and a summary of any GGUF model file (`tessera model info`).
// With experts > 0 the FFN of every layer is a mixture of experts: a router `ffn_gate_inp` and the
// experts stacked in `ffn_{gate,up,down}_exps` (3-D), as llama.cpp writes qwen3moe and Mixtral.
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
  /// "llama" (SentencePiece vocab; with experts: Mixtral's layout), "qwen3" (BPE vocab, q/k
  /// norm) or "qwen3moe" (qwen3 with experts)
  std::string arch = "llama";
  std::uint32_t dim = 512;
  std::uint32_t layers = 8;
  std::uint32_t heads = 8;
  std::uint32_t kv_heads = 4;
  std::uint32_t ffn = 1408;
  std::uint32_t experts = 0;       ///< expert_count; 0: dense FFN (qwen3moe needs > 0)
  std::uint32_t experts_used = 0;  ///< expert_used_count
  std::uint32_t expert_ffn = 0;    ///< one expert's FFN width
  std::uint32_t vocab = 32000;
  std::uint32_t context = 2048;
  tensor_type type = tensor_type::f16;
  std::uint64_t seed = 1;
  bool tied_embeddings = false;  ///< omit output.weight (the engine reuses token_embd)
  std::string name;              ///< general.name; derived from the arguments when empty
  /// tokenizer.chat_template (Jinja); empty: ChatML for qwen3, Mistral's for llama.
  std::string chat_template;
};

/// "tiny" (dim 512, 8 layers, 8/4 heads, FFN 1408, vocab 32000, ~56M params), "large" (dim 1024,
/// 24 layers, 16/4 heads, FFN 2816, vocab 32000, ~336M params) or "moe" (dim 1024, 16 layers,
/// 16/4 heads, 48 experts of FFN 512, 4 used, vocab 32000: ~1.3B params, ~13% of them read per
/// token), for `arch`. "moe" with arch "qwen3" means qwen3moe; tiny/large with qwen3moe get 8
/// experts (2 used) of FFN width 512 / 1024.
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
  std::string chat_template;  ///< "jinja" (the file's own) or the built-in family used
};

/// Summarises a GGUF file, reading only its header (no tensor bytes).
result<model_summary> summarize_model(const std::string& path);
std::string to_text(const model_summary& s);
std::string to_json(const model_summary& s);

}  // namespace tessera::inference::gguf
