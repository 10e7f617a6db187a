// Synthetic vocabularies that really tokenize text, for `tessera model synth`: deterministic (no
// randomness), built from a list of common English words, their prefixes and generated syllables.
//   SentencePiece style (llama): <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, then pieces
//   with ▁ word starts, scored so common pieces merge first.
//   GPT-2 BPE style (qwen3): the 256 byte symbols, merges that build the same words left to right,
//   and ChatML specials <|endoftext|> <|im_start|> <|im_end|> at the end.
#pragma once

#include <cstddef>

#include "actors/base/result.hpp"
#include "inference/tokenizer/tokenizer.hpp"

namespace tessera::inference::tokenizer {

/// Smallest vocabulary the generators make (bytes, specials and the single characters).
inline constexpr std::size_t min_synth_vocab = 512;
/// Largest: bounded so a typo cannot ask for gigabytes of metadata.
inline constexpr std::size_t max_synth_vocab = 1u << 18;

/// Exactly `n_vocab` tokens. Error when n_vocab is outside [min_synth_vocab, max_synth_vocab].
result<vocab_data> synth_spm_vocab(std::size_t n_vocab);
result<vocab_data> synth_bpe_vocab(std::size_t n_vocab);

}  // namespace tessera::inference::tokenizer
