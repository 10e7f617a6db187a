#include "inference/tokenizer/json_grammar.hpp"

#include <algorithm>
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

constexpr std::int64_t kPow10[] = {1,
                                   10,
                                   100,
                                   1000,
                                   10000,
                                   100000,
                                   1000000,
                                   10000000,
                                   100000000,
                                   1000000000,
                                   10000000000,
                                   100000000000,
                                   1000000000000,
                                   10000000000000,
                                   100000000000000,
                                   1000000000000000,
                                   10000000000000000,
                                   100000000000000000,
                                   1000000000000000000};

/// Within [lo, hi) of sorted strings that share their first `pos` bytes, the sub-range whose
/// byte at `pos` is `c` (the one string of length `pos`, sorted first, is skipped).
std::pair<std::uint16_t, std::uint16_t> narrow(const std::vector<std::string>& v, std::uint16_t lo,
                                               std::uint16_t hi, std::uint32_t pos,
                                               unsigned char c) {
  if (lo < hi && v[lo].size() == pos) ++lo;
  const auto b = v.begin() + lo, e = v.begin() + hi;
  const auto first = std::partition_point(
      b, e, [&](const std::string& s) { return static_cast<unsigned char>(s[pos]) < c; });
  const auto last = std::partition_point(
      first, e, [&](const std::string& s) { return static_cast<unsigned char>(s[pos]) == c; });
  return {static_cast<std::uint16_t>(first - v.begin()),
          static_cast<std::uint16_t>(last - v.begin())};
}

std::uint64_t range_bits(std::uint16_t lo, std::uint16_t hi) {
  const std::uint64_t below_hi = hi >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << hi) - 1;
  return below_hi & ~((std::uint64_t{1} << lo) - 1);
}

}  // namespace

json_prefix::json_prefix(const json_schema& schema) {
  s_.schema = &schema;
}

bool json_prefix::fits(std::uint16_t n) const noexcept {
  return s_.depth + at(n).depth <= max_depth;
}

bool json_prefix::may_open_key(const frame& f) const noexcept {
  return (f.avail & ~f.seen) != 0 || f.additional;
}

bool json_prefix::may_close(const frame& f) const noexcept {
  const auto& nd = at(f.node);
  return f.object ? (nd.required & ~f.seen) == 0 : f.count >= nd.min_items;
}

bool json_prefix::may_add_item(const frame& f) const noexcept {
  const auto& nd = at(f.node);
  return f.count < nd.max_items && fits(nd.items);
}

bool json_prefix::end_value() noexcept {
  if (s_.depth == 0) {
    s_.phase = mode::done;
    return true;
  }
  frame& f = frames_[s_.depth - 1];
  if (!f.object) ++f.count;
  // The tag of a tagged union ended (the only key such an object takes before it): from here the
  // object is the variant that tag names, with the tag already seen.
  if (f.object && s_.phase == mode::enumeration && !at(f.node).variants.empty()) {
    const auto& tag = at(f.node).names[0];
    f.node = at(f.node).variants[s_.lo];
    const auto& v = at(f.node);
    f.seen = f.avail = 0;
    for (std::size_t i = 0; i < v.values.size(); ++i) {
      if (v.names[i] == tag) f.seen |= std::uint64_t{1} << i;
      if (fits(v.values[i])) f.avail |= std::uint64_t{1} << i;
    }
    f.additional = v.additional != json_schema::none && fits(v.additional);
  }
  s_.phase = mode::after_value;
  return true;
}

bool json_prefix::close(unsigned char c) noexcept {
  if (s_.depth == 0) return false;
  const frame& f = frames_[s_.depth - 1];
  if (f.object != (c == '}') || !may_close(f)) return false;
  --s_.depth;
  return end_value();
}

bool json_prefix::begin_container(unsigned char c, std::uint16_t n) {
  const auto& nd = at(n);
  const bool object = c == '{';
  if (!(nd.types & (object ? json_schema::t_object : json_schema::t_array))) return false;
  if (s_.depth + (object ? nd.object_depth : nd.array_depth) > max_depth) return false;
  frame& f = frames_[s_.depth++];
  f = frame{};
  f.node = n;
  f.object = object;
  if (object) {
    for (std::size_t i = 0; i < nd.values.size(); ++i)
      if (fits(nd.values[i])) f.avail |= std::uint64_t{1} << i;
    f.additional = nd.additional != json_schema::none && fits(nd.additional);
    s_.phase = mode::key_first;
  } else {
    s_.phase = mode::array_first;
  }
  return true;
}

bool json_prefix::begin_value(unsigned char c, std::uint16_t n) {
  const auto cls = class_of(c);
  if (cls == json_class::count || n == json_schema::none) return false;
  if (at(n).is_union) {
    n = at(n).pick[static_cast<int>(cls)];
    if (n == json_schema::none) return false;
  }
  const auto& nd = at(n);
  s_.value = n;
  if (nd.is_enum) {
    s_.lo = 0;
    s_.hi = static_cast<std::uint16_t>(nd.literals.size());
    s_.pos = 0;
    s_.phase = mode::enumeration;
    return enum_byte(c);
  }
  switch (cls) {
    case json_class::object:
    case json_class::array:
      return begin_container(c, n);
    case json_class::string:
      if (!(nd.types & json_schema::t_string)) return false;
      s_.key = false;
      s_.chars = 0;
      s_.phase = mode::string;
      return true;
    case json_class::number:
      if (!(nd.types & (json_schema::t_integer | json_schema::t_number))) return false;
      s_.integers_only = !(nd.types & json_schema::t_number);
      s_.negative = c == '-';
      s_.digits = 0;
      s_.magnitude = 0;
      if (c == '-') {
        s_.phase = mode::minus;
      } else {
        s_.digits = 1;
        s_.magnitude = c - '0';
        s_.phase = c == '0' ? mode::zero : mode::integer;
      }
      return !s_.integers_only || integer_feasible();
    case json_class::boolean:
    case json_class::null:
      if (!(nd.types & (cls == json_class::null ? json_schema::t_null : json_schema::t_boolean)))
        return false;
      s_.literal = c == 't' ? 0 : c == 'f' ? 1 : 2;
      s_.literal_at = 1;
      s_.phase = mode::literal;
      return true;
    default:
      return false;
  }
}

bool json_prefix::integer_feasible() const noexcept {
  // Can the digits so far be completed to an integer within the bounds? k more digits give the
  // interval [m * 10^k, m * 10^k + 10^k - 1] (negated after '-'), for k up to the digit cap.
  const auto& nd = at(s_.value);
  for (int k = 0; k + s_.digits <= json_schema::max_int_digits; ++k) {
    std::int64_t a = 0, b = 0;
    if (s_.digits == 0) {  // just '-': "-0" or a first digit 1-9
      if (k == 0) continue;
      a = k == 1 ? 0 : kPow10[k - 1];
      b = kPow10[k] - 1;
    } else {
      if (k > 0 && s_.magnitude == 0) break;  // no digits after a leading zero
      a = s_.magnitude * kPow10[k];
      b = a + kPow10[k] - 1;
    }
    if (s_.negative) {
      const auto t = a;
      a = -b;
      b = -t;
    }
    if (b >= nd.minimum && a <= nd.maximum) return true;
  }
  return false;
}

bool json_prefix::number_may_end() const noexcept {
  switch (s_.phase) {
    case mode::zero:
    case mode::integer: {
      if (!s_.integers_only) return true;
      const auto v = s_.negative ? -s_.magnitude : s_.magnitude;
      const auto& nd = at(s_.value);
      return v >= nd.minimum && v <= nd.maximum;
    }
    case mode::fraction:
    case mode::exponent_digits:
      return true;
    default:
      return false;
  }
}

bool json_prefix::end_number(unsigned char c) {
  if (!number_may_end()) return false;
  end_value();
  return feed(c);
}

bool json_prefix::number_byte(unsigned char c) {
  switch (s_.phase) {
    case mode::minus:
      if (!is_digit(c)) return false;
      s_.digits = 1;
      s_.magnitude = c - '0';
      s_.phase = c == '0' ? mode::zero : mode::integer;
      return !s_.integers_only || integer_feasible();
    case mode::zero:
    case mode::integer:
      if (is_digit(c)) {
        // No leading zeros; bounded digits.
        if (s_.phase == mode::zero || s_.digits >= json_schema::max_int_digits) return false;
        s_.magnitude = s_.magnitude * 10 + (c - '0');
        ++s_.digits;
        return !s_.integers_only || integer_feasible();
      }
      if (c == '.' || c == 'e' || c == 'E') {
        if (s_.integers_only) return false;
        s_.phase = c == '.' ? mode::dot : mode::exponent;
        s_.digits = 0;
        return true;
      }
      return end_number(c);
    case mode::dot:
      if (!is_digit(c)) return false;
      s_.phase = mode::fraction;
      s_.digits = 1;
      return true;
    case mode::fraction:
      if (is_digit(c)) return s_.digits++ < json_schema::max_frac_digits;
      if (c == 'e' || c == 'E') {
        s_.phase = mode::exponent;
        s_.digits = 0;
        return true;
      }
      return end_number(c);
    case mode::exponent:
      if (c == '+' || c == '-') {
        s_.phase = mode::exponent_sign;
        return true;
      }
      [[fallthrough]];
    case mode::exponent_sign:
      if (!is_digit(c)) return false;
      s_.phase = mode::exponent_digits;
      s_.digits = 1;
      return true;
    case mode::exponent_digits:
      if (is_digit(c)) return s_.digits++ < json_schema::max_exp_digits;
      return end_number(c);
    default:
      return false;
  }
}

bool json_prefix::text_byte(unsigned char c) {
  switch (s_.phase) {
    case mode::string:
      if (s_.utf8_left > 0) {
        if (c < s_.utf8_lo || c > s_.utf8_hi) return false;
        --s_.utf8_left;
        s_.utf8_lo = 0x80;
        s_.utf8_hi = 0xBF;
        return true;
      }
      if (c == '\\') {
        s_.phase = mode::escape;
        return true;
      }
      if (c < 0x20 || c == '"') return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // UTF-8: the lead byte says how many continuation bytes follow, and the ranges of the
      // first one exclude overlong forms, surrogates and code points past U+10FFFF.
      s_.utf8_lo = 0x80;
      s_.utf8_hi = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        s_.utf8_left = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        s_.utf8_left = 2;
        if (c == 0xE0) s_.utf8_lo = 0xA0;
        if (c == 0xED) s_.utf8_hi = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        s_.utf8_left = 3;
        if (c == 0xF0) s_.utf8_lo = 0x90;
        if (c == 0xF4) s_.utf8_hi = 0x8F;
      } else {
        return false;
      }
      return true;
    case mode::escape:
      if (c == 'u') {
        s_.hex_left = 4;
        s_.phase = mode::hex;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        s_.phase = mode::string;
        return true;
      }
      return false;
    case mode::hex:
      if (!is_hex(c)) return false;
      // No surrogate halves (\uD800-\uDFFF): a lone one is invalid, and pairs are not needed
      // (the text is UTF-8 anyway).
      if (s_.hex_left == 4) s_.surrogate_lead = c == 'd' || c == 'D';
      if (s_.hex_left == 3 && s_.surrogate_lead && (!is_digit(c) || c >= '8')) return false;
      if (--s_.hex_left == 0) s_.phase = mode::string;
      return true;
    default:
      return false;
  }
}

bool json_prefix::string_byte(unsigned char c) {
  const auto& nd = at(s_.value);
  const bool new_char = s_.phase == mode::string && s_.utf8_left == 0;
  if (new_char && c == '"') return s_.chars >= nd.min_length && end_value();
  if (new_char && s_.chars >= nd.max_length) return false;
  if (!text_byte(c)) return false;
  if (new_char) ++s_.chars;  // an escape is one character too
  return true;
}

bool json_prefix::key_byte(unsigned char c) {
  if (s_.phase == mode::string && s_.utf8_left == 0 && c == '"') return end_key();
  const frame& f = frames_[s_.depth - 1];
  auto [lo, hi] = narrow(at(f.node).names, s_.lo, s_.hi, s_.pos, c);
  if (lo < hi) {
    // Still the beginning of declared names: one of them must still be takeable, or else an
    // undeclared key must be allowed (which these bytes may still become).
    if (!f.additional && (range_bits(lo, hi) & f.avail & ~f.seen) == 0) return false;
  } else {
    // Leaving the declared names: an undeclared key, without escapes from here on, so that its
    // bytes cannot spell a declared name another way (the names are in canonical form).
    if (!f.additional || s_.phase != mode::string || c == '\\') return false;
    lo = hi = 0;
  }
  if (!text_byte(c)) return false;
  s_.lo = lo;
  s_.hi = hi;
  ++s_.pos;
  return true;
}

bool json_prefix::end_key() {
  frame& f = frames_[s_.depth - 1];
  const auto& nd = at(f.node);
  if (s_.lo < s_.hi && nd.names[s_.lo].size() == s_.pos) {
    const std::uint64_t bit = std::uint64_t{1} << s_.lo;
    if ((f.seen & bit) || !(f.avail & bit)) return false;  // no duplicates
    f.seen |= bit;
    s_.pending = nd.values[s_.lo];
  } else {
    if (!f.additional) return false;
    s_.pending = nd.additional;
  }
  s_.key = false;
  s_.phase = mode::colon;
  return true;
}

bool json_prefix::enum_byte(unsigned char c) {
  const auto& lits = at(s_.value).literals;
  const auto [lo, hi] = narrow(lits, s_.lo, s_.hi, s_.pos, c);
  if (lo < hi) {
    s_.lo = lo;
    s_.hi = hi;
    ++s_.pos;
    // A value that delimits itself (a string, container, true / false / null), once whole, is
    // the only one its bytes begin: it ends here. A number may go on ("1" or "12").
    const auto& l = lits[lo];
    if (l.size() == s_.pos && !is_digit(static_cast<unsigned char>(l.back()))) return end_value();
    return true;
  }
  if (s_.pos > 0 && s_.lo < s_.hi && lits[s_.lo].size() == s_.pos) {  // a number ended
    end_value();
    return feed(c);
  }
  return false;
}

bool json_prefix::feed(unsigned char c) {
  switch (s_.phase) {
    case mode::string:
    case mode::escape:
    case mode::hex:
      return s_.key ? key_byte(c) : string_byte(c);
    case mode::literal: {
      const auto word = kLiterals[s_.literal];
      if (c != static_cast<unsigned char>(word[s_.literal_at])) return false;
      if (++s_.literal_at == word.size()) return end_value();
      return true;
    }
    case mode::enumeration:
      return enum_byte(c);
    case mode::minus:
    case mode::zero:
    case mode::integer:
    case mode::dot:
    case mode::fraction:
    case mode::exponent:
    case mode::exponent_sign:
    case mode::exponent_digits:
      return number_byte(c);
    default:
      break;
  }
  // Between tokens: blanks, bounded, then the structure.
  if (is_blank(c)) return ++s_.blanks <= max_blank_run;
  s_.blanks = 0;
  switch (s_.phase) {
    case mode::start:
      return begin_value(c, s_.schema->root());
    case mode::value:
      return begin_value(c, s_.pending);
    case mode::array_first: {
      if (c == ']') return close(c);
      const frame& f = frames_[s_.depth - 1];
      return may_add_item(f) && begin_value(c, at(f.node).items);
    }
    case mode::key_first:
      if (c == '}') return close(c);
      [[fallthrough]];
    case mode::key: {
      if (c != '"' || !may_open_key(frames_[s_.depth - 1])) return false;
      s_.key = true;
      s_.lo = 0;
      s_.hi = static_cast<std::uint16_t>(at(frames_[s_.depth - 1].node).names.size());
      s_.pos = 0;
      s_.phase = mode::string;
      return true;
    }
    case mode::colon:
      if (c != ':') return false;
      s_.phase = mode::value;
      return true;
    case mode::after_value: {
      const frame& f = frames_[s_.depth - 1];
      if (c == ',') {
        if (f.object) {
          if (!may_open_key(f)) return false;
          s_.phase = mode::key;
        } else {
          if (!may_add_item(f)) return false;
          s_.pending = at(f.node).items;
          s_.phase = mode::value;
        }
        return true;
      }
      return (c == ']' || c == '}') && close(c);
    }
    default:
      return false;  // done: only blanks may follow
  }
}

bool json_prefix::can_end() const noexcept {
  if (s_.phase == mode::done) return true;
  if (s_.depth != 0) return false;
  if (s_.phase == mode::enumeration) {
    const auto& lits = at(s_.value).literals;
    return s_.lo < s_.hi && lits[s_.lo].size() == s_.pos;
  }
  return number_may_end();
}

std::uint32_t json_prefix::plain_string_room() const noexcept {
  if (!in_plain_string()) return 0;
  // A key outside the declared names (only there when undeclared keys are allowed) takes any
  // plain text; one that may still become a declared name is tried byte by byte.
  if (s_.key) return s_.lo == s_.hi ? std::numeric_limits<std::uint32_t>::max() : 0;
  const auto& nd = at(s_.value);
  return nd.max_length - s_.chars;
}

json_vocab::json_vocab(const tokenizer& t)
    : bytes_(t.size()), kind_(t.size(), 2), string_safe_(t.size(), 0), chars_(t.size(), 0) {
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
    chars_[i] =
        static_cast<std::uint32_t>(std::count_if(bytes_[i].begin(), bytes_[i].end(), [](char c) {
          return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
        }));
  }
}

std::size_t json_vocab::mask(const json_prefix& state, std::span<float> logits) const {
  constexpr float off = -std::numeric_limits<float>::infinity();
  const bool complete = state.complete();
  const bool can_end = state.can_end();
  const std::uint32_t room = state.plain_string_room();
  json_prefix s = state;
  std::size_t allowed = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    bool ok = false;
    if (i < kind_.size()) {
      if (kind_[i] == 1) {
        ok = can_end;
      } else if (string_safe_[i] && chars_[i] <= room) {
        ok = true;
      } else if (kind_[i] == 0 && !complete) {
        s = state;
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
