// Tokenizers: pre-tokenizer splits, known ids on handcrafted vocabularies, round trips on varied
// text with the synthetic vocabularies, special tokens, streaming decode, malformed metadata,
// chat templates.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "inference/gguf/gguf.hpp"
#include "inference/gguf/writer.hpp"
#include "inference/tokenizer/chat.hpp"
#include "inference/tokenizer/synth_vocab.hpp"
#include "inference/tokenizer/tokenizer.hpp"
#include "inference/tokenizer/unicode.hpp"

namespace tessera::inference::tokenizer {
namespace {

using sv = std::vector<std::string_view>;

// ---- malformed input first ---------------------------------------------------------------------

vocab_data tiny_spm() {
  vocab_data d;
  d.kind = model_kind::spm;
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.types = {token_type::unknown, token_type::control, token_type::control};
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(fmt::format("<0x{:02X}>", b));
    d.types.push_back(token_type::byte);
  }
  d.scores.assign(d.tokens.size(), 0.0f);
  // Pieces and scores (higher merges first).
  for (auto [t, s] : std::vector<std::pair<std::string, float>>{{"\xE2\x96\x81", -1},
                                                                 {"h", -2},
                                                                 {"e", -3},
                                                                 {"l", -4},
                                                                 {"o", -5},
                                                                 {"\xE2\x96\x81h", -6},
                                                                 {"\xE2\x96\x81he", -7},
                                                                 {"ll", -8},
                                                                 {"\xE2\x96\x81hell", -9}}) {
    d.tokens.push_back(t);
    d.types.push_back(token_type::normal);
    d.scores.push_back(s);
  }
  d.unk = 0;
  d.bos = 1;
  d.eos = 2;
  return d;
}

TEST(TokenizerMalformed, VocabularyChecks) {
  auto d = tiny_spm();
  d.scores.pop_back();
  auto r = tokenizer::create(d, "m.gguf");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "m.gguf: 267 scores for 268 tokens");

  d = tiny_spm();
  d.bos = 5000;
  r = tokenizer::create(d, "m.gguf");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "m.gguf: bos token id 5000 is outside the vocabulary of 268");

  d = tiny_spm();
  d.tokens.resize(3);
  d.types.resize(3);
  d.scores.resize(3);
  d.unk = -1;
  r = tokenizer::create(d, "m.gguf");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("neither all 256 byte tokens"), std::string::npos);

  vocab_data b;
  b.kind = model_kind::bpe;
  b.tokens = {"a", "b", "ab"};
  b.merges = {"ab"};
  r = tokenizer::create(b, "m.gguf");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "m.gguf: merge 0 'ab' is not two tokens separated by a space");
  b.merges = {"a b c"};
  EXPECT_FALSE(tokenizer::create(b, "m.gguf"));

  vocab_data empty;
  EXPECT_FALSE(tokenizer::create(empty, "m.gguf"));
  vocab_data longtok;
  longtok.tokens = {std::string(5000, 'x')};
  longtok.unk = 0;
  r = tokenizer::create(longtok, "m.gguf");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("5000 bytes long"), std::string::npos);
}

result<gguf::file> as_file(const gguf::writer& w) {
  auto bytes = w.to_bytes();
  if (!bytes) return std::move(bytes).error();
  return gguf::file::parse(*bytes, "tok.gguf");
}

TEST(TokenizerMalformed, GgufMetadata) {
  using gguf::value;
  gguf::writer w;
  auto f = as_file(w);
  ASSERT_TRUE(f);
  auto r = tokenizer::from_gguf(*f);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "tok.gguf: metadata key tokenizer.ggml.model missing");

  w.set("tokenizer.ggml.model", value::str("bert"));
  r = tokenizer::from_gguf(*as_file(w));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::unsupported);
  EXPECT_NE(r.error().message.find("'bert' is not supported"), std::string::npos);

  w.set("tokenizer.ggml.model", value::str("llama"));
  w.set("tokenizer.ggml.tokens", value::arr(gguf::f32_array({1.0f})));
  r = tokenizer::from_gguf(*as_file(w));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("tokenizer.ggml.tokens is an array of f32, expected string"),
            std::string::npos);

  w.set("tokenizer.ggml.tokens", value::arr(gguf::string_array({"<unk>", "a"})));
  w.set("tokenizer.ggml.bos_token_id", value::u32(7));
  r = tokenizer::from_gguf(*as_file(w));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("tokenizer.ggml.bos_token_id = 7 is outside"), std::string::npos);

  w.set("tokenizer.ggml.bos_token_id", value::u32(0));
  w.set("tokenizer.ggml.token_type", value::arr(gguf::i32_array({1, 99})));
  r = tokenizer::from_gguf(*as_file(w));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("unknown type 99"), std::string::npos);

  w.set("tokenizer.ggml.token_type", value::arr(gguf::i32_array({2, 1})));
  w.set("tokenizer.ggml.model", value::str("gpt2"));
  r = tokenizer::from_gguf(*as_file(w));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("tokenizer.ggml.merges missing"), std::string::npos);
}

// ---- unicode and pre-tokenizer -----------------------------------------------------------------

TEST(Unicode, DecodeKeepsMalformedBytes) {
  auto c = decode_utf8("a\xC3\xA9\xFF\xE2\x82");
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].cp, U'a');
  EXPECT_EQ(c[1].cp, U'é');
  EXPECT_EQ(c[2].cp, invalid_cp);
  EXPECT_EQ(c[3].cp, invalid_cp);  // a truncated sequence: one invalid per byte
  EXPECT_EQ(c[4].cp, invalid_cp);
  EXPECT_EQ(c[4].offset, 5u);
  EXPECT_EQ(decode_utf8("\xC0\xAF").size(), 2u);  // overlong '/' rejected
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F\x99\x82"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("ab"), 0u);
}

TEST(Unicode, Classes) {
  for (char32_t c : {U'a', U'Z', U'é', U'ß', U'Ж', U'λ', U'中', U'あ', U'한', U'ا'}) EXPECT_TRUE(is_letter(c)) << static_cast<int>(c);
  for (char32_t c : {U'1', U'٣', U'½', U'²', U'１'}) EXPECT_TRUE(is_number(c)) << static_cast<int>(c);
  for (char32_t c : {U'!', U'—', U'€', U'🙂', U'。', U'\u0301', U' ', U'1'}) EXPECT_FALSE(is_letter(c)) << static_cast<int>(c);
  for (char32_t c : {U' ', U'\t', U'\n', U'\u00A0', U'\u3000'}) EXPECT_TRUE(is_whitespace(c));
  // Unicode's categories exactly (libutf8proc): the vowel signs and virama of Indic scripts are
  // marks (Mn/Mc), not letters; modifier letters (Lm) and letters of later blocks are letters;
  // digits of every script, letter numbers (Nl) and other numbers (No) are numbers.
  for (char32_t c : {U'\u093F', U'\u094D', U'\u0947', U'\u0BC6', U'\u0E31', U'\u1A60', U'\u20DD'})
    EXPECT_FALSE(is_letter(c) || is_number(c)) << std::hex << static_cast<int>(c);
  for (char32_t c : {U'\u0915', U'\u02B0', U'\u3005', U'\uA7C0', U'\U0001E900', U'\U00030000'})
    EXPECT_TRUE(is_letter(c)) << std::hex << static_cast<int>(c);
  for (char32_t c : {U'\u0966', U'\u16EE', U'\u2160', U'\U0001D7CE', U'\U00010107'})
    EXPECT_TRUE(is_number(c)) << std::hex << static_cast<int>(c);
  EXPECT_FALSE(is_letter(0x110000));
  EXPECT_FALSE(is_number(0x110000));
  // GPT-2's byte map is a bijection onto printable code points.
  for (int b = 0; b < 256; ++b) EXPECT_EQ(cp_to_byte(byte_to_cp(static_cast<std::uint8_t>(b))), b);
  EXPECT_EQ(byte_to_cp(' '), U'Ġ');
  EXPECT_EQ(byte_to_cp('\n'), U'Ċ');
}

TEST(PreTokenize, Llama3) {
  EXPECT_EQ(pre_tokenize("Hello world's 12345 !!\n\n  x", pre_split::llama3),
            (sv{"Hello", " world", "'s", " ", "123", "45", " !!\n\n", " ", " x"}));
  EXPECT_EQ(pre_tokenize("I'LL go\tnow", pre_split::llama3), (sv{"I", "'LL", " go", "\tnow"}));
  EXPECT_EQ(pre_tokenize("a  \n b", pre_split::llama3), (sv{"a", "  \n", " b"}));
  EXPECT_EQ(pre_tokenize("end   ", pre_split::llama3), (sv{"end", "   "}));
}

// A Devanagari word splits at its marks, as the reference regex engines split it: the virama
// (U+094D) is the optional non-letter before the next letters, the final vowel sign (U+0947) a
// run of "other" characters.
TEST(PreTokenize, MarksAreNotLetters) {
  EXPECT_EQ(pre_tokenize("\u0928\u092E\u0938\u094D\u0924\u0947", pre_split::llama3),
            (sv{"\u0928\u092E\u0938", "\u094D\u0924", "\u0947"}));
  EXPECT_EQ(pre_tokenize(" \u0928\u092E\u0938\u094D\u0924\u0947", pre_split::gpt2),
            (sv{" \u0928\u092E\u0938", "\u094D", "\u0924", "\u0947"}));
}

TEST(PreTokenize, Qwen2AndGpt2) {
  EXPECT_EQ(pre_tokenize("x 2024", pre_split::qwen2), (sv{"x", " ", "2", "0", "2", "4"}));
  EXPECT_EQ(pre_tokenize("Hello world's 12345 I'LL", pre_split::gpt2),
            (sv{"Hello", " world", "'s", " 12345", " I", "'", "LL"}));
  EXPECT_EQ(pre_tokenize("über café", pre_split::gpt2), (sv{"über", " café"}));
}

TEST(PreTokenize, ChunksConcatenateBackOnRandomText) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a", "Z", " ", "  ", "\n", "\r\n", "\t", "9", "'s", "'",
                                          "é", "中", "🙂", "!", ".", "\xFF", "\xC3", "\xE2\x80\x94"};
  for (int i = 0; i < 500; ++i) {
    std::string s;
    int len = static_cast<int>(rng() % 30);
    for (int k = 0; k < len; ++k) s += atoms[rng() % atoms.size()];
    for (auto kind : {pre_split::gpt2, pre_split::llama3, pre_split::qwen2}) {
      std::string back;
      for (auto c : pre_tokenize(s, kind)) {
        EXPECT_FALSE(c.empty());
        back += c;
      }
      EXPECT_EQ(back, s);
    }
  }
}

// ---- known ids ---------------------------------------------------------------------------------

TEST(TokenizerSpm, KnownIdsAndByteFallback) {
  auto t = tokenizer::create(tiny_spm());
  ASSERT_TRUE(t) << t.error().message;
  const token_id hell = t->find("\xE2\x96\x81hell");
  const token_id o = t->find("o");
  ASSERT_GE(hell, 0);
  EXPECT_EQ(t->encode("hello"), (std::vector<token_id>{1, hell, o}));
  EXPECT_EQ(t->encode("hello", {.add_special = false}), (std::vector<token_id>{hell, o}));
  // é is not a piece: its UTF-8 bytes C3 A9 come out as byte tokens (<0xNN> at id 3 + NN).
  EXPECT_EQ(t->encode("hé", {.add_special = false}),
            (std::vector<token_id>{t->find("\xE2\x96\x81h"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t->decode(t->encode("hé hello")), "hé hello");
  EXPECT_EQ(t->encode(""), (std::vector<token_id>{1}));
}

TEST(TokenizerBpe, KnownIdsFromMerges) {
  vocab_data d;
  d.kind = model_kind::bpe;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_cp(static_cast<std::uint8_t>(b)));
    d.tokens.push_back(s);
  }
  d.tokens.insert(d.tokens.end(), {"Ġt", "he", "Ġthe", "<|im_end|>"});
  d.merges = {"Ġ t", "h e", "Ġt he"};
  d.types.assign(d.tokens.size(), token_type::normal);
  d.types.back() = token_type::control;
  d.pre = pre_split::gpt2;
  d.add_bos = false;
  auto t = tokenizer::create(d);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->encode(" the"), (std::vector<token_id>{258}));
  EXPECT_EQ(t->encode("the"), (std::vector<token_id>{'t', 257}));  // no "t he" merge
  EXPECT_EQ(t->encode(" tea"), (std::vector<token_id>{256, 'e', 'a'}));
  EXPECT_EQ(t->encode("the<|im_end|>", {.parse_special = true}),
            (std::vector<token_id>{'t', 257, 259}));
  EXPECT_EQ(t->decode(t->encode(" the\n")), " the\n");
}

// ---- synthetic vocabularies: round trips ----------------------------------------------------

const std::vector<std::string>& texts() {
  static const std::vector<std::string> v = {
      "Hello world",
      "The quick brown fox jumps over the lazy dog.",
      "  leading and trailing spaces  ",
      "whitespace   runs\t\ttabs\n\n\nnewlines\r\n",
      "digits 0123456789 and 3.14159, 1,000,000",
      "UTF-8: café, naïve, über, Ελληνικά, Привет, 中文, 日本語, 한국어",
      "emoji 🙂👍🏽🇫🇷 and ✓ ★",
      "code: int main() { return a[i] != b ? -1 : 0; }",
      "it's we'll they're I'VE",
      "",
      " ",
      "\n",
      "x",
  };
  return v;
}

TEST(TokenizerSynth, SpmRoundTripsAndCompresses) {
  auto d = synth_spm_vocab(32000);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tokens.size(), 32000u);
  auto t = tokenizer::create(std::move(*d));
  ASSERT_TRUE(t) << t.error().message;
  for (const auto& s : texts()) {
    auto ids = t->encode(s);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], t->bos());
    EXPECT_EQ(t->decode(ids), s);
  }
  std::string english = "The people of the city found that the water of the river was good";
  auto ids = t->encode(english, {.add_special = false});
  EXPECT_LT(ids.size(), english.size() / 3) << "the synthetic vocabulary does not merge words";
}

TEST(TokenizerSynth, BpeRoundTripsSpecialsAndCompresses) {
  auto d = synth_bpe_vocab(32000);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tokens.size(), 32000u);
  auto t = tokenizer::create(std::move(*d));
  ASSERT_TRUE(t) << t.error().message;
  for (const auto& s : texts()) EXPECT_EQ(t->decode(t->encode(s)), s);
  std::string english = "The people of the city found that the water of the river was good";
  EXPECT_LT(t->encode(english).size(), english.size() / 3);
  auto im_start = t->find("<|im_start|>");
  auto with = t->encode("<|im_start|>user\nhi<|im_end|>", {.parse_special = true});
  ASSERT_GE(with.size(), 3u);
  EXPECT_EQ(with.front(), im_start);
  EXPECT_EQ(with.back(), t->eos());
  EXPECT_TRUE(t->is_end_of_generation(with.back()));
  auto without = t->encode("<|im_start|>user", {.parse_special = false});
  EXPECT_EQ(std::count(without.begin(), without.end(), im_start), 0);
  EXPECT_EQ(t->decode(without), "<|im_start|>user");
  EXPECT_EQ(t->decode(with), "user\nhi");  // control tokens render as nothing
  EXPECT_FALSE(synth_bpe_vocab(10));
  EXPECT_FALSE(synth_spm_vocab(1u << 30));
}

TEST(TokenizerSynth, FromGgufMetadata) {
  auto d = synth_spm_vocab(1000);
  ASSERT_TRUE(d);
  gguf::writer w;
  w.set("tokenizer.ggml.model", gguf::value::str("llama"));
  w.set("tokenizer.ggml.tokens", gguf::value::arr(gguf::string_array(d->tokens)));
  w.set("tokenizer.ggml.scores", gguf::value::arr(gguf::f32_array(d->scores)));
  std::vector<std::int32_t> types;
  for (auto ty : d->types) types.push_back(static_cast<std::int32_t>(ty));
  w.set("tokenizer.ggml.token_type", gguf::value::arr(gguf::i32_array(types)));
  w.set("tokenizer.ggml.bos_token_id", gguf::value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf::value::u32(2));
  auto f = as_file(w);
  ASSERT_TRUE(f);
  auto t = tokenizer::from_gguf(*f);
  ASSERT_TRUE(t) << t.error().message;
  auto direct = tokenizer::create(std::move(*d));
  for (const auto& s : texts()) EXPECT_EQ(t->encode(s), direct->encode(s));
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
}

TEST(TokenizerSynth, BpePreFromMetadata) {
  auto d = synth_bpe_vocab(1000);
  ASSERT_TRUE(d);
  gguf::writer w;
  w.set("tokenizer.ggml.model", gguf::value::str("gpt2"));
  w.set("tokenizer.ggml.tokens", gguf::value::arr(gguf::string_array(d->tokens)));
  w.set("tokenizer.ggml.merges", gguf::value::arr(gguf::string_array(d->merges)));
  w.set("tokenizer.ggml.bos_token_id", gguf::value::u32(static_cast<std::uint32_t>(d->bos)));
  for (auto [pre, want, bos] : {std::tuple{"llama-bpe", pre_split::llama3, true},
                                {"qwen2", pre_split::qwen2, false},
                                {"something-else", pre_split::gpt2, false}}) {
    w.set("tokenizer.ggml.pre", gguf::value::str(pre));
    auto t = tokenizer::from_gguf(*as_file(w));
    ASSERT_TRUE(t) << t.error().message;
    EXPECT_EQ(t->data().pre, want) << pre;
    EXPECT_EQ(t->add_bos(), bos) << pre;
    EXPECT_EQ(t->encode("2024 x").front() == t->bos(), bos) << pre;
  }
  w.set("tokenizer.ggml.add_bos_token", gguf::value::boolean(false));
  w.set("tokenizer.ggml.pre", gguf::value::str("llama-bpe"));
  EXPECT_FALSE(tokenizer::from_gguf(*as_file(w))->add_bos());
}

TEST(TokenizerStream, HoldsBackIncompleteUtf8) {
  auto t = tokenizer::create(tiny_spm());
  ASSERT_TRUE(t);
  // 🙂 = F0 9F 99 82: four byte tokens, released only when complete.
  stream_decoder s(*t);
  std::string out;
  out += s.push(t->find("\xE2\x96\x81h"));
  EXPECT_EQ(out, "h");  // leading SPM space dropped on the first token
  for (int b : {0xF0, 0x9F, 0x99}) EXPECT_EQ(s.push(3 + b), "");
  EXPECT_EQ(s.push(3 + 0x82), "🙂");
  EXPECT_EQ(s.push(3 + 0xE2), "");
  EXPECT_EQ(s.flush(), "\xE2");
  EXPECT_EQ(s.push(2), "");  // </s> is a control token: nothing to show
}

// ---- chat templates ----------------------------------------------------------------------------

TEST(ChatTemplate, Formats) {
  std::vector<chat_message> msgs = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"},
                                    {"user", "Bye"}};
  auto l3 = apply_chat_template(chat_family::llama3, msgs);
  ASSERT_TRUE(l3);
  EXPECT_EQ(l3->text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_FALSE(l3->add_bos);
  auto cm = apply_chat_template(chat_family::chatml, msgs);
  ASSERT_TRUE(cm);
  EXPECT_EQ(cm->text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  auto mi = apply_chat_template(chat_family::mistral, msgs);
  ASSERT_TRUE(mi);
  EXPECT_EQ(mi->text, "[INST] Be brief.\n\nHi [/INST] Hello!</s>[INST] Bye [/INST]");
  EXPECT_TRUE(mi->add_bos);
  // Looser conversations are folded into mistral's shape: consecutive turns of one role joined,
  // every system text before the first user turn. Only a conversation opening with the
  // assistant is refused, saying so.
  auto two = apply_chat_template(chat_family::mistral, {{"system", "S1"},
                                                        {"user", "a"},
                                                        {"user", "b"},
                                                        {"system", "S2"},
                                                        {"assistant", "c"},
                                                        {"user", "d"}});
  ASSERT_TRUE(two) << two.error().message;
  EXPECT_EQ(two->text, "[INST] S1\n\nS2\n\na\n\nb [/INST] c</s>[INST] d [/INST]");
  auto bad = apply_chat_template(chat_family::mistral, {{"assistant", "a"}, {"user", "b"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("first message after the system text"), std::string::npos);
  // Two user messages in a row are what ChatML and Llama 3 templates render message by message.
  auto cm2 = apply_chat_template(chat_family::chatml, {{"user", "a"}, {"user", "b"}});
  ASSERT_TRUE(cm2);
  EXPECT_EQ(
      cm2->text,
      "<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n");
  auto role = apply_chat_template(chat_family::chatml, {{"tool", "x"}});
  ASSERT_FALSE(role);
  EXPECT_NE(role.error().message.find("'tool'"), std::string::npos);
}

TEST(ChatTemplate, ChosenFromMetadata) {
  EXPECT_EQ(*detect_chat_family("{% for m in messages %}<|im_start|>{{m.role}}"), chat_family::chatml);
  EXPECT_EQ(*detect_chat_family("<|start_header_id|>"), chat_family::llama3);
  EXPECT_EQ(*detect_chat_family("{{ '[INST] ' + m }}"), chat_family::mistral);
  EXPECT_FALSE(detect_chat_family("{{ m }}"));
  gguf::writer w;
  w.set("general.architecture", gguf::value::str("qwen3"));
  EXPECT_EQ(chat_family_for(*as_file(w)), chat_family::chatml);
  w.set("general.architecture", gguf::value::str("llama"));
  w.set("tokenizer.ggml.model", gguf::value::str("llama"));
  EXPECT_EQ(chat_family_for(*as_file(w)), chat_family::mistral);
  w.set("tokenizer.chat_template", gguf::value::str("<|start_header_id|>{{x}}"));
  EXPECT_EQ(chat_family_for(*as_file(w)), chat_family::llama3);
  EXPECT_EQ(*parse_chat_family("chatml"), chat_family::chatml);
  EXPECT_FALSE(parse_chat_family("jinja"));
}

// A file's own Jinja template is used (its leading BOS text left to the tokenizer); one the subset
// cannot parse falls back to the family, saying why; a template that refuses a system message
// (Gemma's) gets it folded into the first user turn.
TEST(ChatTemplate, TheFilesOwnJinjaTemplate) {
  auto d = synth_spm_vocab(1000);
  ASSERT_TRUE(d);
  gguf::writer w;
  w.set("general.architecture", gguf::value::str("llama"));
  w.set("tokenizer.ggml.model", gguf::value::str("llama"));
  w.set("tokenizer.ggml.tokens", gguf::value::arr(gguf::string_array(d->tokens)));
  w.set("tokenizer.ggml.scores", gguf::value::arr(gguf::f32_array(d->scores)));
  w.set("tokenizer.ggml.bos_token_id", gguf::value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf::value::u32(2));
  const std::string gemma =
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
      "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
      "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
      "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') "
      "%}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ "
      "'<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% "
      "endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";
  w.set("tokenizer.chat_template", gguf::value::str(gemma));
  auto f = as_file(w);
  ASSERT_TRUE(f);
  auto tok = tokenizer::from_gguf(*f);
  ASSERT_TRUE(tok) << tok.error().message;
  const auto t = chat_template_for(*f, *tok);
  ASSERT_NE(t.jinja, nullptr) << t.fallback_reason;
  EXPECT_EQ(t.describe(), "jinja");
  EXPECT_EQ(t.bos_token, tok->text(1));
  auto p = apply_chat_template(t, {{"user", " Hi "}, {"assistant", "Yo"}, {"user", "Go"}});
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->text,
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"
            "<start_of_turn>user\nGo<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_TRUE(p->add_bos);
  auto sys = apply_chat_template(t, {{"system", "Be brief."}, {"user", "a"}, {"user", "b"}});
  ASSERT_TRUE(sys) << sys.error().message;
  EXPECT_EQ(sys->text,
            "<start_of_turn>user\nBe brief.\n\na\n\nb<end_of_turn>\n<start_of_turn>model\n");
  auto bad = apply_chat_template(t, {{"assistant", "first"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("refuses the messages: Conversation roles must alternate"),
            std::string::npos)
      << bad.error().message;
  w.set("tokenizer.chat_template", gguf::value::str("{% include 'other.jinja' %}<|im_start|>"));
  const auto fallback = chat_template_for(*as_file(w), *tok);
  EXPECT_EQ(fallback.jinja, nullptr);
  EXPECT_EQ(fallback.family, chat_family::chatml);
  EXPECT_NE(fallback.describe().find("unknown or unsupported tag 'include'"), std::string::npos)
      << fallback.describe();
  // A template that parses but asks for more than the subset at render time (an unknown
  // filter): served with the family, as a file without a template is.
  w.set("tokenizer.chat_template",
        gguf::value::str("{% for m in messages %}<|im_start|>{{ m.content | nosuchfilter }}"
                         "{% endfor %}"));
  const auto odd = chat_template_for(*as_file(w), *tok);
  ASSERT_NE(odd.jinja, nullptr);
  auto served = apply_chat_template(odd, {{"user", "Hi"}});
  ASSERT_TRUE(served) << served.error().message;
  EXPECT_EQ(served->text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  w.set("tokenizer.chat_template", gguf::value::str("mistral"));  // synthetic files name a family
  EXPECT_EQ(chat_template_for(*as_file(w), *tok).describe(), "mistral");
}

}  // namespace
}  // namespace tessera::inference::tokenizer
