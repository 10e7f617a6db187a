#include "inference/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <queue>

#include "inference/gguf/gguf.hpp"

namespace tessera::inference::tokenizer {

namespace {

constexpr std::string_view space_marker = "\xE2\x96\x81";  // U+2581 ▁

std::string escape_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (char c : s) {
    if (c == ' ')
      out += space_marker;
    else
      out.push_back(c);
  }
  return out;
}

std::string unescape_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s.substr(i, 3) == space_marker) {
      out.push_back(' ');
      i += 3;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// "<0x4A>" -> 0x4A, else -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// A symbol of the merge loops: a byte span of the text being tokenized, linked to its neighbours.
struct symbol {
  int prev, next;
  std::uint32_t start, len;
};

struct bigram {
  int left, right;
  double priority;  // SPM: score (higher first); BPE: -rank
  std::uint32_t size;
  bool operator<(const bigram& o) const {
    return priority < o.priority || (priority == o.priority && left > o.left);
  }
};

}  // namespace

std::string_view to_string(model_kind k) noexcept { return k == model_kind::spm ? "spm" : "bpe"; }

result<tokenizer> tokenizer::create(vocab_data d, std::string_view what, const vocab_limits& lim) {
  const std::size_t n = d.tokens.size();
  if (n == 0) return make_error(errc::corrupt, "{}: vocabulary is empty", what);
  if (n > lim.max_tokens)
    return make_error(errc::corrupt, "{}: vocabulary of {} tokens exceeds the limit {}", what, n,
                      lim.max_tokens);
  if (!d.scores.empty() && d.scores.size() != n)
    return make_error(errc::corrupt, "{}: {} scores for {} tokens", what, d.scores.size(), n);
  if (!d.types.empty() && d.types.size() != n)
    return make_error(errc::corrupt, "{}: {} token types for {} tokens", what, d.types.size(), n);
  if (d.merges.size() > lim.max_merges)
    return make_error(errc::corrupt, "{}: {} merges exceed the limit {}", what, d.merges.size(),
                      lim.max_merges);
  for (auto [id, name] : {std::pair{d.bos, "bos"}, {d.eos, "eos"}, {d.eot, "eot"}, {d.unk, "unk"},
                          {d.pad, "pad"}}) {
    if (id < -1 || id >= static_cast<token_id>(n))
      return make_error(errc::corrupt, "{}: {} token id {} is outside the vocabulary of {}", what,
                        name, id, n);
  }
  for (auto t : d.types) {
    if (static_cast<std::int32_t>(t) < 0 || static_cast<std::int32_t>(t) > 6)
      return make_error(errc::corrupt, "{}: unknown token type {}", what, static_cast<std::int32_t>(t));
  }
  tokenizer tk;
  tk.index_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (d.tokens[i].size() > lim.max_token_bytes)
      return make_error(errc::corrupt, "{}: token {} is {} bytes long (limit {})", what, i,
                        d.tokens[i].size(), lim.max_token_bytes);
    tk.index_.emplace(d.tokens[i], static_cast<token_id>(i));  // first occurrence wins
  }
  tk.byte_tokens_.assign(256, -1);
  if (d.kind == model_kind::spm) {
    for (std::size_t i = 0; i < n; ++i) {
      int b = parse_byte_token(d.tokens[i]);
      if (b >= 0 && tk.byte_tokens_[static_cast<std::size_t>(b)] < 0)
        tk.byte_tokens_[static_cast<std::size_t>(b)] = static_cast<token_id>(i);
    }
    bool all_bytes = std::none_of(tk.byte_tokens_.begin(), tk.byte_tokens_.end(),
                                  [](token_id t) { return t < 0; });
    if (!all_bytes && d.unk < 0)
      return make_error(errc::corrupt,
                        "{}: SentencePiece vocabulary has neither all 256 byte tokens <0xNN> nor an "
                        "unknown token, so some text could not be encoded",
                        what);
  } else {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, byte_to_cp(static_cast<std::uint8_t>(b)));
      auto it = tk.index_.find(s);
      if (it != tk.index_.end()) tk.byte_tokens_[static_cast<std::size_t>(b)] = it->second;
    }
    tk.merge_rank_.reserve(d.merges.size());
    for (std::size_t i = 0; i < d.merges.size(); ++i) {
      const auto& m = d.merges[i];
      auto sp = m.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() ||
          m.find(' ', sp + 1) != std::string::npos)
        return make_error(errc::corrupt, "{}: merge {} '{}' is not two tokens separated by a space",
                          what, i, m.substr(0, 64));
      tk.merge_rank_.emplace(m, static_cast<std::int32_t>(i));
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto t = d.types.empty() ? token_type::normal : d.types[i];
    if ((t == token_type::control || t == token_type::user_defined) && !d.tokens[i].empty())
      tk.specials_.push_back(static_cast<token_id>(i));
  }
  std::stable_sort(tk.specials_.begin(), tk.specials_.end(), [&](token_id a, token_id b) {
    return d.tokens[static_cast<std::size_t>(a)].size() > d.tokens[static_cast<std::size_t>(b)].size();
  });
  tk.d_ = std::move(d);
  return tk;
}

token_type tokenizer::type(token_id id) const noexcept {
  if (id < 0 || static_cast<std::size_t>(id) >= d_.tokens.size()) return token_type::undefined;
  return d_.types.empty() ? token_type::normal : d_.types[static_cast<std::size_t>(id)];
}

bool tokenizer::is_end_of_generation(token_id id) const noexcept {
  return id >= 0 && (id == d_.eos || id == d_.eot);
}

token_id tokenizer::find(std::string_view token_text) const {
  auto it = index_.find(std::string(token_text));
  return it == index_.end() ? -1 : it->second;
}

std::vector<token_id> tokenizer::encode(std::string_view text, const encode_options& opts) const {
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 4);
  if (opts.add_special && d_.add_bos && d_.bos >= 0) out.push_back(d_.bos);
  bool prev_special = true;  // SPM: a leading ▁ for the first text fragment
  auto emit_text = [&](std::string_view frag) {
    if (frag.empty()) return;
    if (d_.kind == model_kind::spm) {
      std::string s;
      if (d_.add_space_prefix && prev_special) s = " ";
      s.append(frag);
      encode_spm(escape_spaces(s), out);
    } else {
      encode_bpe(frag, out);
    }
    prev_special = false;
  };
  std::size_t start = 0;
  if (opts.parse_special && !specials_.empty()) {
    for (std::size_t i = 0; i < text.size();) {
      token_id hit = -1;
      for (token_id s : specials_) {
        const auto& t = d_.tokens[static_cast<std::size_t>(s)];
        if (t[0] == text[i] && text.substr(i, t.size()) == t) {
          hit = s;
          break;
        }
      }
      if (hit < 0) {
        ++i;
        continue;
      }
      emit_text(text.substr(start, i - start));
      out.push_back(hit);
      prev_special = true;
      i += d_.tokens[static_cast<std::size_t>(hit)].size();
      start = i;
    }
  }
  emit_text(text.substr(start));
  if (opts.add_special && d_.add_eos && d_.eos >= 0) out.push_back(d_.eos);
  return out;
}

void tokenizer::encode_spm(std::string_view text, std::vector<token_id>& out) const {
  auto chars = decode_utf8(text);
  if (chars.empty()) return;
  std::vector<symbol> sym(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) {
    sym[i] = {static_cast<int>(i) - 1, i + 1 < chars.size() ? static_cast<int>(i + 1) : -1,
              chars[i].offset, chars[i].length};
  }
  std::priority_queue<bigram> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::string_view piece = text.substr(sym[static_cast<std::size_t>(left)].start,
                                         sym[static_cast<std::size_t>(left)].len +
                                             sym[static_cast<std::size_t>(right)].len);
    auto it = index_.find(std::string(piece));
    if (it == index_.end()) return;
    double score = d_.scores.empty() ? 0.0 : d_.scores[static_cast<std::size_t>(it->second)];
    queue.push({left, right, score, static_cast<std::uint32_t>(piece.size())});
  };
  for (std::size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!queue.empty()) {
    bigram b = queue.top();
    queue.pop();
    auto& l = sym[static_cast<std::size_t>(b.left)];
    auto& r = sym[static_cast<std::size_t>(b.right)];
    // Stale entries: one side was merged away or grew since this pair was queued.
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.size || l.next != b.right) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<std::size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
    const auto& s = sym[static_cast<std::size_t>(i)];
    std::string_view piece = text.substr(s.start, s.len);
    auto it = index_.find(std::string(piece));
    if (it != index_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char c : piece) {  // byte fallback
      token_id bt = byte_tokens_[static_cast<unsigned char>(c)];
      out.push_back(bt >= 0 ? bt : d_.unk);
    }
  }
}

void tokenizer::encode_bpe(std::string_view text, std::vector<token_id>& out) const {
  for (std::string_view word : pre_tokenize(text, d_.pre)) bpe_word(word, out);
}

void tokenizer::bpe_word(std::string_view word, std::vector<token_id>& out) const {
  const std::string mapped = bytes_to_bpe_text(word);
  if (d_.pre == pre_split::llama3) {  // llama3 vocabularies skip merging for whole-word tokens
    auto it = index_.find(mapped);
    if (it != index_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  auto chars = decode_utf8(mapped);
  std::vector<symbol> sym(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) {
    sym[i] = {static_cast<int>(i) - 1, i + 1 < chars.size() ? static_cast<int>(i + 1) : -1,
              chars[i].offset, chars[i].length};
  }
  std::priority_queue<bigram> queue;
  std::string key;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const auto& l = sym[static_cast<std::size_t>(left)];
    const auto& r = sym[static_cast<std::size_t>(right)];
    key.assign(mapped, l.start, l.len);
    key.push_back(' ');
    key.append(mapped, r.start, r.len);
    auto it = merge_rank_.find(key);
    if (it == merge_rank_.end()) return;
    queue.push({left, right, -static_cast<double>(it->second), l.len + r.len});
  };
  for (std::size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!queue.empty()) {
    bigram b = queue.top();
    queue.pop();
    auto& l = sym[static_cast<std::size_t>(b.left)];
    auto& r = sym[static_cast<std::size_t>(b.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.size || l.next != b.right) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<std::size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
    const auto& s = sym[static_cast<std::size_t>(i)];
    std::string piece = mapped.substr(s.start, s.len);
    auto it = index_.find(piece);
    if (it != index_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not a token: fall back to one token per original byte.
    for (const auto& ch : decode_utf8(piece)) {
      int b = cp_to_byte(ch.cp);
      token_id bt = b >= 0 ? byte_tokens_[static_cast<std::size_t>(b)] : -1;
      if (bt >= 0)
        out.push_back(bt);
      else if (d_.unk >= 0)
        out.push_back(d_.unk);
    }
  }
}

std::string tokenizer::token_bytes(token_id id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= d_.tokens.size()) return {};
  const std::string& t = d_.tokens[static_cast<std::size_t>(id)];
  auto ty = type(id);
  if (ty == token_type::control || ty == token_type::unknown || ty == token_type::unused) return {};
  if (ty == token_type::user_defined) return t;
  if (d_.kind == model_kind::spm) {
    int b = parse_byte_token(t);
    if (b >= 0 && (ty == token_type::byte || d_.types.empty())) return std::string(1, static_cast<char>(b));
    return unescape_spaces(t);
  }
  std::string out;
  for (const auto& ch : decode_utf8(t)) {
    int b = cp_to_byte(ch.cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else if (ch.cp != invalid_cp) {
      append_utf8(out, ch.cp);  // not a mapped byte: keep the character as it is
    } else {
      out.push_back(t[ch.offset]);
    }
  }
  return out;
}

std::string tokenizer::decode(std::span<const token_id> ids, bool strip_leading_space) const {
  std::string out;
  bool first_text = true;
  for (token_id id : ids) {
    std::string piece = token_bytes(id);
    if (piece.empty()) continue;
    if (first_text && strip_leading_space && d_.kind == model_kind::spm && d_.add_space_prefix &&
        piece[0] == ' ')
      piece.erase(0, 1);
    first_text = false;
    out += piece;
  }
  return out;
}

std::string stream_decoder::push(token_id id) {
  std::string piece = t_->token_bytes(id);
  if (piece.empty()) return {};
  if (first_ && t_->kind() == model_kind::spm && t_->data().add_space_prefix && piece[0] == ' ')
    piece.erase(0, 1);
  first_ = false;
  pending_ += piece;
  std::size_t hold = incomplete_utf8_tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string stream_decoder::flush() { return std::exchange(pending_, {}); }

// ---------------------------------------------------------------------------------------------

result<tokenizer> tokenizer::from_gguf(const gguf::file& f, const vocab_limits& lim) {
  using gguf::value_type;
  vocab_data d;
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model) return std::move(model).error();
  if (*model == "llama") {
    d.kind = model_kind::spm;
  } else if (*model == "gpt2") {
    d.kind = model_kind::bpe;
  } else {
    return make_error(errc::unsupported,
                      "{}: tokenizer.ggml.model '{}' is not supported (llama, gpt2)", f.name(),
                      *model);
  }
  auto tokens = f.get_array("tokenizer.ggml.tokens", value_type::string);
  if (!tokens) return std::move(tokens).error();
  d.tokens = (*tokens)->strings;
  if (f.find_value("tokenizer.ggml.scores")) {
    auto scores = f.get_array("tokenizer.ggml.scores", value_type::f32);
    if (!scores) return std::move(scores).error();
    d.scores.assign((*scores)->floats.begin(), (*scores)->floats.end());
  }
  if (f.find_value("tokenizer.ggml.token_type")) {
    auto types = f.get_array("tokenizer.ggml.token_type", value_type::i32);
    if (!types) return std::move(types).error();
    d.types.reserve((*types)->ints.size());
    for (auto t : (*types)->ints) {
      if (t < 0 || t > 6)
        return make_error(errc::corrupt, "{}: tokenizer.ggml.token_type holds unknown type {}",
                          f.name(), t);
      d.types.push_back(static_cast<token_type>(t));
    }
  }
  if (d.kind == model_kind::bpe) {
    auto merges = f.get_array("tokenizer.ggml.merges", value_type::string);
    if (!merges) return std::move(merges).error();
    d.merges = (*merges)->strings;
    d.add_bos = false;
    d.add_space_prefix = false;
    std::string_view pre = "default";
    if (f.find_value("tokenizer.ggml.pre")) {
      auto p = f.get_string("tokenizer.ggml.pre");
      if (!p) return std::move(p).error();
      pre = *p;
    }
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe" ||
        pre == "dbrx") {
      d.pre = pre_split::llama3;
      d.add_bos = true;  // llama 3 prepends <|begin_of_text|> unless the file says otherwise
    }
    else if (pre == "qwen2" || pre == "qwen3" || pre == "deepseek-r1-qwen")
      d.pre = pre_split::qwen2;
    else
      d.pre = pre_split::gpt2;
  }
  auto id_key = [&](std::string_view key, token_id& dst) -> result<void> {
    if (!f.find_value(key)) return ok();
    auto v = f.get_uint(key);
    if (!v) return std::move(v).error();
    if (*v >= d.tokens.size())
      return make_error(errc::corrupt, "{}: {} = {} is outside the vocabulary of {} tokens",
                        f.name(), key, *v, d.tokens.size());
    dst = static_cast<token_id>(*v);
    return ok();
  };
  TESSERA_TRY(id_key("tokenizer.ggml.bos_token_id", d.bos));
  TESSERA_TRY(id_key("tokenizer.ggml.eos_token_id", d.eos));
  TESSERA_TRY(id_key("tokenizer.ggml.eot_token_id", d.eot));
  TESSERA_TRY(id_key("tokenizer.ggml.unknown_token_id", d.unk));
  TESSERA_TRY(id_key("tokenizer.ggml.padding_token_id", d.pad));
  auto flag = [&](std::string_view key, bool& dst) -> result<void> {
    if (!f.find_value(key)) return ok();
    auto v = f.get_bool(key);
    if (!v) return std::move(v).error();
    dst = *v;
    return ok();
  };
  TESSERA_TRY(flag("tokenizer.ggml.add_bos_token", d.add_bos));
  TESSERA_TRY(flag("tokenizer.ggml.add_eos_token", d.add_eos));
  TESSERA_TRY(flag("tokenizer.ggml.add_space_prefix", d.add_space_prefix));
  if (d.eot < 0) {
    for (std::string_view t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"}) {
      auto it = std::find(d.tokens.begin(), d.tokens.end(), t);
      if (it != d.tokens.end()) {
        d.eot = static_cast<token_id>(it - d.tokens.begin());
        break;
      }
    }
  }
  if (d.unk < 0 && d.kind == model_kind::spm) {
    auto it = std::find(d.tokens.begin(), d.tokens.end(), "<unk>");
    if (it != d.tokens.end()) d.unk = static_cast<token_id>(it - d.tokens.begin());
  }
  return create(std::move(d), f.name(), lim);
}

}  // namespace tessera::inference::tokenizer
