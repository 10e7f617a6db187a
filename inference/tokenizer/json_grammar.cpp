#include "inference/tokenizer/json_grammar.hpp"

#include <limits>

namespace tessera::inference::tokenizer {

namespace {

bool is_blank(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}
bool is_hex(unsigned char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
constexpr std::string_view kLiterals[] = {"true", "false", "null"};

}  // namespace

bool json_prefix::end_value() noexcept {
  mode_ = depth_ == 0 ? mode::done : mode::after_value;
  return true;
}

bool json_prefix::end_number(unsigned char c) {
  end_value();
  return feed(c);
}

bool json_prefix::close(unsigned char c) noexcept {
  if (depth_ == 0) return false;
  const bool object = (objects_ >> (depth_ - 1)) & 1u;
  if (object != (c == '}')) return false;
  --depth_;
  return end_value();
}

bool json_prefix::begin_value(unsigned char c) {
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= max_depth) return false;
      if (c == '{')
        objects_ |= 1u << depth_;
      else
        objects_ &= ~(1u << depth_);
      ++depth_;
      mode_ = c == '{' ? mode::key_first : mode::array_first;
      return true;
    case '"':
      key_ = false;
      mode_ = mode::string;
      return true;
    case '-':
      mode_ = mode::minus;
      return true;
    case '0':
      mode_ = mode::zero;
      return true;
    case 't':
    case 'f':
    case 'n':
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      literal_at_ = 1;
      mode_ = mode::literal;
      return true;
    default:
      if (c >= '1' && c <= '9') {
        mode_ = mode::integer;
        return true;
      }
      return false;
  }
}

bool json_prefix::feed(unsigned char c) {
  switch (mode_) {
    case mode::string:
      if (utf8_left_ > 0) {
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xBF;
        return true;
      }
      if (c == '"') {
        if (!key_) return end_value();
        key_ = false;
        mode_ = mode::colon;
        return true;
      }
      if (c == '\\') {
        mode_ = mode::escape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // UTF-8: the lead byte says how many continuation bytes follow, and the ranges of the
      // first one exclude overlong forms, surrogates and code points past U+10FFFF.
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        utf8_left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        utf8_left_ = 2;
        if (c == 0xE0) utf8_lo_ = 0xA0;
        if (c == 0xED) utf8_hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        utf8_left_ = 3;
        if (c == 0xF0) utf8_lo_ = 0x90;
        if (c == 0xF4) utf8_hi_ = 0x8F;
      } else {
        return false;
      }
      return true;
    case mode::escape:
      if (c == 'u') {
        hex_left_ = 4;
        mode_ = mode::hex;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        mode_ = mode::string;
        return true;
      }
      return false;
    case mode::hex:
      if (!is_hex(c)) return false;
      // No surrogate halves (\uD800-\uDFFF): a lone one is invalid, and pairs are not needed
      // (the text is UTF-8 anyway).
      if (hex_left_ == 4) surrogate_lead_ = c == 'd' || c == 'D';
      if (hex_left_ == 3 && surrogate_lead_ && (!is_digit(c) || c >= '8')) return false;
      if (--hex_left_ == 0) mode_ = mode::string;
      return true;
    case mode::literal: {
      const auto word = kLiterals[literal_];
      if (c != static_cast<unsigned char>(word[literal_at_])) return false;
      if (++literal_at_ == word.size()) return end_value();
      return true;
    }
    case mode::minus:
      if (c == '0') {
        mode_ = mode::zero;
        return true;
      }
      if (c >= '1' && c <= '9') {
        mode_ = mode::integer;
        return true;
      }
      return false;
    case mode::zero:
    case mode::integer:
      if (is_digit(c)) return mode_ == mode::integer;  // no leading zeros
      if (c == '.') {
        mode_ = mode::dot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        mode_ = mode::exponent;
        return true;
      }
      return end_number(c);
    case mode::dot:
      if (!is_digit(c)) return false;
      mode_ = mode::fraction;
      return true;
    case mode::fraction:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        mode_ = mode::exponent;
        return true;
      }
      return end_number(c);
    case mode::exponent:
      if (c == '+' || c == '-') {
        mode_ = mode::exponent_sign;
        return true;
      }
      [[fallthrough]];
    case mode::exponent_sign:
      if (!is_digit(c)) return false;
      mode_ = mode::exponent_digits;
      return true;
    case mode::exponent_digits:
      if (is_digit(c)) return true;
      return end_number(c);
    default:
      break;
  }
  // Between tokens: blanks, bounded, then the structure.
  if (is_blank(c)) return ++blanks_ <= max_blank_run;
  blanks_ = 0;
  switch (mode_) {
    case mode::start:
      return c == '{' && begin_value(c);
    case mode::value:
      return begin_value(c);
    case mode::array_first:
      return c == ']' ? close(c) : begin_value(c);
    case mode::key_first:
      if (c == '}') return close(c);
      [[fallthrough]];
    case mode::key:
      if (c != '"') return false;
      key_ = true;
      mode_ = mode::string;
      return true;
    case mode::colon:
      if (c != ':') return false;
      mode_ = mode::value;
      return true;
    case mode::after_value:
      if (c == ',') {
        mode_ = ((objects_ >> (depth_ - 1)) & 1u) ? mode::key : mode::value;
        return true;
      }
      return (c == ']' || c == '}') && close(c);
    default:
      return false;  // done: only blanks may follow
  }
}

json_vocab::json_vocab(const tokenizer& t)
    : bytes_(t.size()), kind_(t.size(), 2), string_safe_(t.size(), 0) {
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto id = static_cast<token_id>(i);
    if (t.is_end_of_generation(id)) {
      kind_[i] = 1;
      continue;
    }
    const auto type = t.type(id);
    if (type == token_type::control || type == token_type::unknown || type == token_type::unused)
      continue;
    bytes_[i] = t.token_bytes(id);
    if (bytes_[i].empty()) continue;
    kind_[i] = 0;
    // String-safe: what a string in progress accepts whole, decided by the validator itself.
    json_prefix in_string;
    (void)in_string.feed(std::string_view("{\"k\":\""));
    string_safe_[i] = in_string.feed(bytes_[i]) && in_string.in_plain_string();
  }
}

std::size_t json_vocab::mask(const json_prefix& state, std::span<float> logits) const {
  constexpr float off = -std::numeric_limits<float>::infinity();
  const bool complete = state.complete();
  const bool plain = state.in_plain_string();
  std::size_t allowed = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    bool ok = false;
    if (i < kind_.size()) {
      if (kind_[i] == 1) {
        ok = complete;
      } else if (plain && string_safe_[i]) {
        ok = true;
      } else if (kind_[i] == 0 && !complete) {
        json_prefix s = state;
        ok = s.feed(bytes_[i]);
      }
    }
    if (ok)
      ++allowed;
    else
      logits[i] = off;
  }
  return allowed;
}

}  // namespace tessera::inference::tokenizer
