#include "inference/tokenizer/synth_vocab.hpp"

#include <string>
#include <unordered_set>
#include <vector>

namespace tessera::inference::tokenizer {

namespace {

constexpr const char* common_words[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
    "if", "more", "when", "will", "would", "who", "so", "no", "she", "other", "its", "may", "these",
    "what", "them", "than", "some", "him", "time", "into", "only", "do", "my", "new", "about",
    "out", "also", "two", "any", "up", "first", "could", "our", "then", "most", "see", "me",
    "should", "after", "said", "your", "very", "between", "made", "many", "over", "like", "those",
    "did", "now", "even", "well", "where", "must", "people", "through", "how", "same", "work",
    "being", "because", "man", "life", "before", "each", "much", "under", "years", "way", "great",
    "state", "both", "use", "upon", "own", "used", "however", "us", "part", "good", "world",
    "make", "three", "while", "long", "day", "without", "just", "men", "general", "during",
    "another", "little", "found", "here", "system", "does", "de", "down", "number", "case",
    "against", "might", "still", "back", "right", "know", "place", "every", "government", "too",
    "high", "old", "different", "take", "year", "point", "go", "think", "say", "get", "come",
    "water", "small", "large", "form", "house", "home", "hand", "order", "model", "data", "token",
    "text", "language", "computer", "network", "machine", "memory", "process", "thread", "value",
    "question", "answer", "story", "once", "there", "lived", "king", "queen", "city", "country",
    "night", "light", "word", "name", "school", "family", "child", "children", "woman", "women",
    "friend", "never", "always", "again", "something", "nothing", "everything", "why", "yes",
    "hello", "thank", "thanks", "please", "sorry", "today", "tomorrow", "yesterday", "morning",
    "evening", "quick", "brown", "fox", "jumps", "lazy", "dog", "cat", "tree", "sun", "moon",
    "star", "sky", "sea", "river", "mountain", "road", "car", "book", "paper", "table", "chair",
    "door", "window", "room", "food", "bread", "apple", "red", "green", "blue", "black", "white",
    "big", "open", "close", "begin", "end", "start", "stop", "run", "walk", "read", "write",
    "speak", "listen", "learn", "teach", "help", "need", "want", "love", "live", "give", "find",
    "tell", "ask", "seem", "feel", "try", "leave", "call", "keep", "let", "put", "mean", "become",
    "show", "hear", "play", "move", "believe", "bring", "happen", "sit", "stand", "lose", "pay",
    "meet", "include", "continue", "set", "change", "lead", "understand", "watch", "follow",
    "create", "allow", "add", "spend", "grow", "offer", "remember", "consider", "appear", "buy",
    "wait", "serve", "die", "send", "expect", "build", "stay", "fall", "cut", "reach", "kill",
    "remain", "suggest", "raise", "pass", "sell", "require", "report", "decide", "pull",
    "ing", "ed", "er", "ly", "tion", "ment", "ness", "able", "ful", "less", "est", "ous", "ive",
    "al", "ic", "ity", "ize", "s", "es", "re", "un", "pre", "dis", "inter", "over", "under",
};

// a + b built by appending: GCC 12 warns (-Wrestrict, a false positive) on operator+ forms.
std::string cat(std::string_view a, std::string_view b) {
  std::string s;
  s.reserve(a.size() + b.size());
  s.append(a);
  s.append(b);
  return s;
}

constexpr const char* onsets[] = {"",  "b",  "c",  "d",  "f",  "g",  "h",  "j",  "k",  "l",
                                  "m", "n",  "p",  "r",  "s",  "t",  "v",  "w",  "y",  "z",
                                  "bl", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gr", "pl",
                                  "pr", "sh", "sl", "sm", "sn", "sp", "st", "str", "th", "tr"};
constexpr const char* vowels[] = {"a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y", "ie"};
constexpr const char* codas[] = {"",   "n",  "r",  "s",  "t",  "l",  "m",  "d",  "ng", "st",
                                 "nd", "ll", "ck", "rt", "nt", "ss", "th", "sh", "ch", "x"};

// Deterministic stream of pseudo-words: single syllables, then pairs of syllables.
class word_stream {
 public:
  std::string next() {
    const std::size_t no = std::size(onsets), nv = std::size(vowels), nc = std::size(codas);
    const std::size_t n1 = no * nv * nc;
    std::size_t i = i_++;
    auto syl = [&](std::size_t k) {
      return cat(cat(onsets[k % no], vowels[(k / no) % nv]), codas[(k / no / nv) % nc]);
    };
    if (i < n1) return syl(i);
    i -= n1;
    return cat(syl(i % n1), syl((i / n1 + i * 7) % n1));
  }

 private:
  std::size_t i_ = 0;
};

std::string capitalized(std::string w) {
  if (!w.empty() && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 32);
  return w;
}

error size_error(std::size_t n) {
  return make_error(errc::invalid_argument, "synthetic vocabulary size {} is outside [{}, {}]", n,
                    min_synth_vocab, max_synth_vocab);
}

}  // namespace

result<vocab_data> synth_spm_vocab(std::size_t n_vocab) {
  if (n_vocab < min_synth_vocab || n_vocab > max_synth_vocab) return size_error(n_vocab);
  vocab_data d;
  d.kind = model_kind::spm;
  d.unk = 0;
  d.bos = 1;
  d.eos = 2;
  d.add_bos = true;
  d.add_space_prefix = true;
  std::unordered_set<std::string> seen;
  auto add = [&](std::string t, token_type ty, float score) {
    if (d.tokens.size() >= n_vocab || !seen.insert(t).second) return;
    d.tokens.push_back(std::move(t));
    d.types.push_back(ty);
    d.scores.push_back(score);
  };
  add("<unk>", token_type::unknown, 0.0f);
  add("<s>", token_type::control, 0.0f);
  add("</s>", token_type::control, 0.0f);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), token_type::byte, 0.0f);
  const std::string mark = "\xE2\x96\x81";
  float score = -1.0f;
  auto piece = [&](const std::string& t) {
    add(t, token_type::normal, score);
    score -= 1.0f;
  };
  // Every prefix of a piece, so the merge loop can actually build it pair by pair.
  auto with_prefixes = [&](const std::string& w) {
    for (std::size_t k = 1; k <= w.size(); ++k) {
      if (w.compare(0, mark.size(), mark) == 0 && k < mark.size()) continue;
      piece(w.substr(0, k));
    }
  };
  piece(mark);
  for (char c = 33; c < 127; ++c) piece(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) piece(cat(mark, std::string_view(&c, 1)));
  for (const char* w : common_words) {
    with_prefixes(cat(mark, w));
    with_prefixes(w);
    with_prefixes(cat(mark, capitalized(w)));
  }
  word_stream ws;
  while (d.tokens.size() < n_vocab) {
    std::string w = ws.next();
    with_prefixes(cat(mark, w));
    if (d.tokens.size() < n_vocab) with_prefixes(w);
  }
  return d;
}

result<vocab_data> synth_bpe_vocab(std::size_t n_vocab) {
  if (n_vocab < min_synth_vocab || n_vocab > max_synth_vocab) return size_error(n_vocab);
  vocab_data d;
  d.kind = model_kind::bpe;
  d.pre = pre_split::qwen2;
  d.add_bos = false;
  d.add_space_prefix = false;
  const std::size_t n_special = 3;
  const std::size_t n_normal = n_vocab - n_special;
  std::unordered_set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_cp(static_cast<std::uint8_t>(b)));
    seen.insert(s);
    d.tokens.push_back(std::move(s));
  }
  // Merges that build `word` (already byte-mapped) left to right: ((a b) c) d ...
  auto add_word = [&](const std::string& raw) {
    auto chars = decode_utf8(bytes_to_bpe_text(raw));
    if (chars.size() < 2) return;
    const std::string mapped = bytes_to_bpe_text(raw);
    std::string acc = mapped.substr(chars[0].offset, chars[0].length);
    for (std::size_t i = 1; i < chars.size() && d.tokens.size() < n_normal; ++i) {
      std::string next = mapped.substr(chars[i].offset, chars[i].length);
      std::string merged = cat(acc, next);
      if (seen.insert(merged).second) {
        d.merges.push_back(cat(cat(acc, " "), next));
        d.tokens.push_back(merged);
      }
      acc = std::move(merged);
    }
  };
  for (const char* w : common_words) {
    add_word(cat(" ", w));
    add_word(w);
    add_word(cat(" ", capitalized(w)));
  }
  for (const char* p : {"  ", "   ", "    ", "\n\n", ".\n", ", ", ". ", "...", "!\n", "?\n"})
    add_word(p);
  word_stream ws;
  while (d.tokens.size() < n_normal) {
    std::string w = ws.next();
    add_word(cat(" ", w));
    add_word(w);
  }
  d.types.assign(d.tokens.size(), token_type::normal);
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    d.tokens.push_back(s);
    d.types.push_back(token_type::control);
  }
  d.bos = static_cast<token_id>(n_normal);      // <|endoftext|> (never prepended: add_bos false)
  d.eos = static_cast<token_id>(n_normal + 2);  // <|im_end|>
  d.eot = d.eos;
  d.pad = d.bos;
  return d;
}

}  // namespace tessera::inference::tokenizer
