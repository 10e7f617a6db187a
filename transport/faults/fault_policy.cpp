#include "transport/faults/fault_policy.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace tessera::transport::faults {
namespace {

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a: a stable hash (std::hash is not specified to be stable across builds).
std::uint64_t stable_hash(std::string_view s, std::uint64_t h = 1469598103934665603ull) {
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

double unit(std::uint64_t& state) {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
}

bool valid_probability(double p) { return std::isfinite(p) && p >= 0 && p <= 1; }

}  // namespace

result<void> fault_policy::set_rule(std::string_view from, std::string_view to, link_rule rule) {
  if (from.empty() || to.empty()) {
    return make_error(errc::invalid_argument, "fault rule: empty node name");
  }
  if (!valid_probability(rule.drop) || !valid_probability(rule.duplicate) ||
      !valid_probability(rule.reorder)) {
    return make_error(errc::invalid_argument,
                      "fault rule {}->{}: probabilities must lie in [0, 1] (drop {}, duplicate {}, "
                      "reorder {})",
                      from, to, rule.drop, rule.duplicate, rule.reorder);
  }
  if (rule.delay.count() < 0 || rule.jitter.count() < 0 || rule.reorder_hold.count() < 0) {
    return make_error(errc::invalid_argument, "fault rule {}->{}: negative time", from, to);
  }
  rules_[{std::string(from), std::string(to)}] = rule;
  return ok();
}

void fault_policy::remove_rule(std::string_view from, std::string_view to) {
  auto it = rules_.find(std::pair<std::string_view, std::string_view>(from, to));
  if (it != rules_.end()) rules_.erase(it);
}

void fault_policy::partition(const std::vector<std::string>& side_a,
                             const std::vector<std::string>& side_b, bool two_way) {
  for (const auto& a : side_a) {
    for (const auto& b : side_b) {
      if (a == b) continue;
      cuts_.insert({a, b});
      if (two_way) cuts_.insert({b, a});
    }
  }
}

bool fault_policy::is_cut(std::string_view from, std::string_view to) const {
  return cuts_.find(std::pair<std::string_view, std::string_view>(from, to)) != cuts_.end();
}

link_rule fault_policy::rule_for(std::string_view from, std::string_view to) const {
  const std::pair<std::string_view, std::string_view> keys[] = {
      {from, to}, {from, any_node}, {any_node, to}, {any_node, any_node}};
  for (const auto& k : keys) {
    auto it = rules_.find(k);
    if (it != rules_.end()) return it->second;
  }
  return link_rule{};
}

fault_policy::pair_stream& fault_policy::stream(std::string_view from, std::string_view to) {
  auto it = streams_.find(std::pair<std::string_view, std::string_view>(from, to));
  if (it != streams_.end()) return it->second;
  // A separator byte keeps ("ab","c") and ("a","bc") apart.
  std::uint64_t state = seed_ ^ stable_hash(to, stable_hash("\x1f", stable_hash(from)));
  (void)splitmix64(state);
  return streams_.emplace(std::pair{std::string(from), std::string(to)}, pair_stream{state})
      .first->second;
}

decision fault_policy::decide(std::string_view from, std::string_view to, nanoseconds now) {
  std::uint64_t& state = stream(from, to).state;
  // Always four draws, whatever the rule: the stream's position depends only on the call count.
  const double u_drop = unit(state);
  const double u_jitter = unit(state);
  const double u_reorder = unit(state);
  const double u_duplicate = unit(state);
  decision d;
  if (is_cut(from, to)) {
    d.outcome = decision::fate::partitioned;
    return d;
  }
  const link_rule r = rule_for(from, to);
  if (u_drop < r.drop) {
    d.outcome = decision::fate::dropped;
    return d;
  }
  auto at = now + r.delay +
            nanoseconds(static_cast<std::int64_t>(u_jitter * static_cast<double>(r.jitter.count())));
  if (u_reorder < r.reorder) at += r.reorder_hold;
  d.copies = 1;
  d.deliver_at[0] = at;
  if (u_duplicate < r.duplicate) {
    d.copies = 2;
    d.deliver_at[1] = at;
  }
  return d;
}

// --- commands ----------------------------------------------------------------------------------

namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    const std::size_t start = i;
    while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

bool valid_name(std::string_view n) {
  return !n.empty() && n.size() <= 64 &&
         std::all_of(n.begin(), n.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                  c == '.' || c == ':' || c == '*';
         });
}

result<std::vector<std::string>> parse_names(std::string_view list) {
  std::vector<std::string> out;
  for (auto n : split(list, ',')) {
    if (!valid_name(n)) {
      return make_error(errc::invalid_argument, "fault command: '{}' is not a node name", n);
    }
    out.emplace_back(n);
  }
  return out;
}

result<double> parse_probability(std::string_view s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !valid_probability(v)) {
    return make_error(errc::invalid_argument,
                      "fault command: '{}' is not a probability in [0, 1]", s);
  }
  return v;
}

result<std::int64_t> parse_duration_ns(std::string_view s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  const std::string_view unit_name(p, static_cast<std::size_t>(s.data() + s.size() - p));
  double scale = 0;
  if (unit_name == "ns") scale = 1;
  else if (unit_name == "us") scale = 1e3;
  else if (unit_name == "ms") scale = 1e6;
  else if (unit_name == "s") scale = 1e9;
  if (ec != std::errc() || scale == 0 || !std::isfinite(v) || v < 0 || v * scale > 3.6e12) {
    return make_error(errc::invalid_argument,
                      "fault command: '{}' is not a duration (a number with ns, us, ms or s, "
                      "at most an hour)",
                      s);
  }
  return static_cast<std::int64_t>(v * scale);
}

// "a->b" or "a<->b".
result<void> parse_pair(std::string_view s, fault_command& c) {
  std::size_t pos = s.find("<->");
  std::size_t len = 3;
  c.two_way = true;
  if (pos == std::string_view::npos) {
    pos = s.find("->");
    len = 2;
    c.two_way = false;
  }
  if (pos == std::string_view::npos) {
    return make_error(errc::invalid_argument, "fault command: '{}' is not 'a->b' or 'a<->b'", s);
  }
  const auto from = s.substr(0, pos), to = s.substr(pos + len);
  if (!valid_name(from) || !valid_name(to)) {
    return make_error(errc::invalid_argument, "fault command: '{}' does not name two nodes", s);
  }
  c.side_a = {std::string(from)};
  c.side_b = {std::string(to)};
  return ok();
}

result<fault_command> parse_partition(std::string_view rest) {
  fault_command c;
  c.what = fault_command::verb::partition;
  std::size_t pos = rest.find('|');
  std::size_t len = 1;
  c.two_way = true;
  if (pos == std::string_view::npos) {
    pos = rest.find("->");
    len = 2;
    c.two_way = false;
  }
  if (pos == std::string_view::npos) {
    return make_error(errc::invalid_argument,
                      "fault command: partition needs 'a,b | c' or 'a -> c', got '{}'", rest);
  }
  auto strip = [](std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    std::string out;
    for (char ch : v) {
      if (!std::isspace(static_cast<unsigned char>(ch))) out += ch;
    }
    return out;
  };
  auto a = parse_names(strip(rest.substr(0, pos)));
  if (!a) return std::move(a).error();
  auto b = parse_names(strip(rest.substr(pos + len)));
  if (!b) return std::move(b).error();
  c.side_a = std::move(*a);
  c.side_b = std::move(*b);
  return c;
}

}  // namespace

result<void> fault_policy::set_clock(std::string_view node, std::optional<double> rate,
                                     std::int64_t add_bump_ns, bool reset) {
  if (rate && !(*rate >= min_clock_rate && *rate <= max_clock_rate))
    return make_error(errc::invalid_argument, "fault clock: rate {} is outside [{}, {}]", *rate,
                      min_clock_rate, max_clock_rate);
  if (add_bump_ns < 0 || add_bump_ns > max_clock_bump_ns)
    return make_error(errc::invalid_argument, "fault clock: a bump must be forward and at most 1 h");
  auto it = clocks_.find(node);
  clock_rule r = it == clocks_.end() ? clock_rule{} : it->second;
  if (reset) r.rate = 1.0;
  if (rate) r.rate = *rate;
  if (r.bump_ns + add_bump_ns > max_clock_bump_ns)
    return make_error(errc::invalid_argument, "fault clock: bumps add up to more than 1 h");
  r.bump_ns += add_bump_ns;
  // The bump total stays (the node's clock keeps the time it reached); a node back at the real
  // rate with no bump ever has no entry.
  if (r == clock_rule{}) {
    if (it != clocks_.end()) clocks_.erase(it);
    return ok();
  }
  clocks_[std::string(node)] = r;
  return ok();
}

result<fault_command> parse_fault_command(std::string_view text) {
  constexpr std::size_t max_command_bytes = 4096;
  if (text.size() > max_command_bytes) {
    return make_error(errc::invalid_argument, "fault command: longer than {} bytes",
                      max_command_bytes);
  }
  const auto w = words(text);
  if (w.empty()) return make_error(errc::invalid_argument, "fault command: empty");
  const std::string_view verb = w[0];
  fault_command c;
  if (verb == "partition") {
    return parse_partition(text.substr(text.find("partition") + 9));
  }
  if (verb == "heal" || verb == "clear") {
    if (w.size() != 1) {
      return make_error(errc::invalid_argument, "fault command: '{}' takes no arguments", verb);
    }
    c.what = verb == "heal" ? fault_command::verb::heal : fault_command::verb::clear;
    return c;
  }
  if (verb == "crash") {
    // crash NODE ACTOR
    if (w.size() != 3)
      return make_error(errc::invalid_argument,
                        "fault command: 'crash' takes a node and an actor name (e.g. 'crash A "
                        "control')");
    auto node = parse_names(w[1]);
    if (!node) return std::move(node).error();
    if (node->size() != 1 || (*node)[0] == "*")
      return make_error(errc::invalid_argument, "fault command: 'crash' takes one node, got '{}'",
                        w[1]);
    if (w[2].empty() || w[2].size() > 64)
      return make_error(errc::invalid_argument, "fault command: actor name '{}' is not 1..64 bytes",
                        w[2]);
    c.what = fault_command::verb::crash;
    c.side_a = std::move(*node);
    c.actor = std::string(w[2]);
    return c;
  }
  if (verb == "clock") {
    // clock NODE rate R | clock NODE bump D | clock NODE ok
    if (w.size() < 3 || (w[2] != "ok" && w.size() != 4) || (w[2] == "ok" && w.size() != 3))
      return make_error(errc::invalid_argument,
                        "fault command: 'clock' takes a node and 'rate R', 'bump D' or 'ok'");
    auto node = parse_names(w[1]);
    if (!node) return std::move(node).error();
    if (node->size() != 1 || (*node)[0] == "*")
      return make_error(errc::invalid_argument, "fault command: 'clock' takes one node, got '{}'",
                        w[1]);
    c.what = fault_command::verb::clock;
    c.side_a = std::move(*node);
    if (w[2] == "ok") {
      c.clock_reset = true;
    } else if (w[2] == "rate") {
      double r = 0;
      const std::string t(w[3]);
      char* end = nullptr;
      r = std::strtod(t.c_str(), &end);
      if (end != t.c_str() + t.size() || !(r >= min_clock_rate && r <= max_clock_rate))
        return make_error(errc::invalid_argument,
                          "fault command: clock rate '{}' is not a number in [{}, {}]", w[3],
                          min_clock_rate, max_clock_rate);
      c.clock_rate = r;
    } else if (w[2] == "bump") {
      auto d = parse_duration_ns(w[3]);
      if (!d) return std::move(d).error();
      if (*d <= 0 || *d > max_clock_bump_ns)
        return make_error(errc::invalid_argument,
                          "fault command: clock bump '{}' must be forward and at most 1 h", w[3]);
      c.clock_bump_ns = *d;
    } else {
      return make_error(errc::invalid_argument,
                        "fault command: 'clock' takes 'rate', 'bump' or 'ok', got '{}'", w[2]);
    }
    return c;
  }
  c.what = fault_command::verb::rule;
  auto need = [&](std::size_t lo, std::size_t hi) -> result<void> {
    if (w.size() < lo || w.size() > hi) {
      return make_error(errc::invalid_argument, "fault command: '{}' takes {} to {} arguments",
                        verb, lo - 1, hi - 1);
    }
    return parse_pair(w[1], c);
  };
  if (verb == "ok") {
    TESSERA_TRY(need(2, 2));
    c.part = fault_command::aspect::reset;
  } else if (verb == "drop" || verb == "duplicate") {
    TESSERA_TRY(need(3, 3));
    auto p = parse_probability(w[2]);
    if (!p) return std::move(p).error();
    if (verb == "drop") {
      c.part = fault_command::aspect::drop;
      c.drop = *p;
    } else {
      c.part = fault_command::aspect::duplicate;
      c.duplicate = *p;
    }
  } else if (verb == "delay") {
    TESSERA_TRY(need(3, 4));
    c.part = fault_command::aspect::delay;
    auto d = parse_duration_ns(w[2]);
    if (!d) return std::move(d).error();
    c.delay_ns = *d;
    if (w.size() == 4) {
      auto j = parse_duration_ns(w[3]);
      if (!j) return std::move(j).error();
      c.jitter_ns = *j;
    }
  } else if (verb == "reorder") {
    TESSERA_TRY(need(3, 4));
    c.part = fault_command::aspect::reorder;
    auto p = parse_probability(w[2]);
    if (!p) return std::move(p).error();
    c.reorder = *p;
    if (w.size() == 4) {
      auto h = parse_duration_ns(w[3]);
      if (!h) return std::move(h).error();
      c.reorder_hold_ns = *h;
    }
  } else {
    return make_error(errc::invalid_argument,
                      "fault command: unknown verb '{}' (partition, heal, clear, drop, delay, "
                      "duplicate, reorder, ok, clock)",
                      verb);
  }
  return c;
}

result<void> apply(fault_policy& policy, const fault_command& c) {
  using verb = fault_command::verb;
  using aspect = fault_command::aspect;
  switch (c.what) {
    case verb::heal: policy.heal(); return ok();
    case verb::clear: policy.clear(); return ok();
    case verb::partition:
      if (c.side_a.empty() || c.side_b.empty()) {
        return make_error(errc::invalid_argument, "fault partition: a side is empty");
      }
      policy.partition(c.side_a, c.side_b, c.two_way);
      return ok();
    case verb::rule: break;
    case verb::clock:
      if (c.side_a.size() != 1)
        return make_error(errc::invalid_argument, "fault clock: needs exactly one node");
      return policy.set_clock(c.side_a[0],
                              c.clock_rate > 0 ? std::optional(c.clock_rate) : std::nullopt,
                              c.clock_bump_ns, c.clock_reset);
    case verb::crash:
      if (c.side_a.size() != 1 || c.actor.empty() || c.actor.size() > 64)
        return make_error(errc::invalid_argument, "fault crash: needs one node and an actor name");
      policy.request_crash(c.side_a[0], c.actor);
      return ok();
    default:
      return make_error(errc::invalid_argument, "fault command: unknown verb {}",
                        static_cast<int>(c.what));
  }
  if (c.side_a.size() != 1 || c.side_b.size() != 1) {
    return make_error(errc::invalid_argument, "fault rule: needs exactly one 'from' and one 'to'");
  }
  auto set_one = [&](const std::string& from, const std::string& to) -> result<void> {
    if (c.part == aspect::reset) {
      policy.remove_rule(from, to);
      return ok();
    }
    link_rule r = policy.rule_for(from, to);
    switch (c.part) {
      case aspect::drop: r.drop = c.drop; break;
      case aspect::delay:
        r.delay = nanoseconds(c.delay_ns);
        r.jitter = nanoseconds(c.jitter_ns);
        break;
      case aspect::duplicate: r.duplicate = c.duplicate; break;
      case aspect::reorder:
        r.reorder = c.reorder;
        r.reorder_hold = nanoseconds(c.reorder_hold_ns);
        break;
      default:
        return make_error(errc::invalid_argument, "fault rule: unknown aspect {}",
                          static_cast<int>(c.part));
    }
    return policy.set_rule(from, to, r);
  };
  TESSERA_TRY(set_one(c.side_a[0], c.side_b[0]));
  if (c.two_way) TESSERA_TRY(set_one(c.side_b[0], c.side_a[0]));
  return ok();
}

}  // namespace tessera::transport::faults
