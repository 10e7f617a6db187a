#include "mesh/serving/follower.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace tessera::mesh::serving {

namespace {
constexpr std::uint64_t us_per_ms = 1000;
// The first re-publication comes quickly (a PUB drops what it sends before its connections are
// up), then the interval doubles up to follower_options::republish_ms.
constexpr std::uint32_t first_republish_ms = 25;
}  // namespace

errc errc_of(std::string_view code) noexcept {
  if (code == error_code::unknown_model) return errc::not_found;
  if (code == error_code::no_capacity) return errc::no_capacity;
  if (code == error_code::invalid_request) return errc::invalid_argument;
  if (code == error_code::context_length_exceeded) return errc::invalid_argument;
  if (code == error_code::overloaded) return errc::overloaded;
  if (code == error_code::cancelled) return errc::cancelled;
  return errc::internal;
}

std::string format_peer_error(std::string_view message, std::string_view code,
                              std::string_view node) {
  return fmt::format("{} ({}, from peer {})", message, code, node);
}

std::optional<peer_error> parse_peer_error(std::string_view text) {
  // From the end: the message may itself hold " (" and ", from peer ".
  if (!text.ends_with(')')) return std::nullopt;
  const auto from = text.rfind(", from peer ");
  if (from == std::string_view::npos) return std::nullopt;
  const auto open = text.rfind(" (", from);
  if (open == std::string_view::npos) return std::nullopt;
  peer_error e;
  e.message = std::string(text.substr(0, open));
  e.code = std::string(text.substr(open + 2, from - open - 2));
  e.node = std::string(text.substr(from + 12, text.size() - 1 - from - 12));
  if (e.code.empty() || e.code.find_first_of(" ,()") != std::string::npos) return std::nullopt;
  return e;
}

stream_follower::stream_follower(request r, follower_options options, std::uint64_t now_us)
    : req_(std::move(r)), opt_(options) {
  req_.attempt = 0;
  req_.resume.clear();
  req_.cancel = false;
  t0_us_ = last_publish_us_ = last_heard_us_ = now_us;
  deadline_us_ = now_us + std::uint64_t{opt_.deadline_ms} * us_per_ms;
  republish_ms_ = std::min(first_republish_ms, opt_.republish_ms);
}

std::uint64_t stream_follower::wake_at_us() const {
  std::uint64_t t = deadline_us_;
  if (!accepted_) t = std::min(t, last_publish_us_ + std::uint64_t{republish_ms_} * us_per_ms);
  if (accepted_) t = std::min(t, last_heard_us_ + stall_bound_us());
  return t;
}

follower_step stream_follower::finish(result<outcome> r) {
  finished_ = true;
  follower_step s;
  s.done.emplace(std::move(r));
  return s;
}

follower_step stream_follower::resume(std::string_view why, std::uint64_t now_us) {
  if (req_.attempt + 1 >= opt_.max_attempts)
    return finish(make_error(errc::timeout, "request {}: gave up after {} attempts (last: {})",
                             req_.id, req_.attempt + 1, why));
  ++req_.attempt;
  req_.resume = out_.tokens;
  accepted_ = false;
  serving_node_.clear();
  serving_gone_ = false;
  cut_.clear();
  republish_ms_ = std::min(first_republish_ms, opt_.republish_ms);
  last_publish_us_ = last_heard_us_ = now_us;
  follower_step s;
  s.publish = req_;
  return s;
}

follower_step stream_follower::on_tick(std::uint64_t now_us) {
  if (finished_) return {};
  if (now_us >= deadline_us_)
    return finish(make_error(errc::timeout, "request {}: {} after {} ms ({} tokens received)",
                             req_.id, accepted_ ? "the stream stalled" : "no peer accepted it",
                             opt_.deadline_ms, out_.tokens.size()));
  if (!accepted_ && now_us - last_publish_us_ >= std::uint64_t{republish_ms_} * us_per_ms) {
    // Not accepted yet: the peers may not have connected, or the plan may be moving.
    last_publish_us_ = now_us;
    republish_ms_ = std::min(republish_ms_ * 2, opt_.republish_ms);
    follower_step s;
    s.publish = req_;
    return s;
  }
  if (accepted_ && now_us - last_heard_us_ >= stall_bound_us())
    return resume(serving_gone_ ? "the serving peer left the view of a peer and went silent"
                                : "the serving peer went silent",
                  now_us);
  return {};
}

std::uint64_t stream_follower::stall_bound_us() const {
  return std::uint64_t{serving_gone_ ? opt_.gone_stall_ms : opt_.stall_ms} * us_per_ms;
}

follower_step stream_follower::on_peers(const response& m, std::uint64_t now_us) {
  if (finished_ || !accepted_ || serving_node_.empty() || m.nodes.empty()) return {};
  if (std::find(m.nodes.begin(), m.nodes.end(), serving_node_) != m.nodes.end()) return {};
  serving_gone_ = true;
  if (now_us - last_heard_us_ >= stall_bound_us())
    return resume(
        fmt::format("peer {} left the view of peer {} and is silent", serving_node_, m.node),
        now_us);
  return {};
}

follower_step stream_follower::cancel(std::uint64_t now_us) {
  (void)now_us;
  if (finished_) return {};
  // Tell the serving peer, so that it stops generating for nobody (docs/PROTOCOL.md).
  request c;
  c.id = req_.id;
  c.attempt = req_.attempt;
  c.cancel = true;
  auto s = finish(make_error(errc::cancelled, "request {}: cancelled after {} tokens", req_.id,
                             out_.tokens.size()));
  s.publish = std::move(c);
  return s;
}

follower_step stream_follower::stop_early(std::uint64_t now_us) {
  if (finished_) return {};
  request c;
  c.id = req_.id;
  c.attempt = req_.attempt;
  c.cancel = true;
  out_.stop = "stop_sequence";
  out_.attempts = req_.attempt + 1;
  out_.total_s = static_cast<double>(now_us - t0_us_) / 1e6;
  auto s = finish(out_);
  s.publish = std::move(c);
  return s;
}

follower_step stream_follower::cut_duplicate(const std::string& node) {
  // Two peers serve this attempt (their views of who is live differ: a partition, a peer not yet
  // declared dead): keep the first, tell the other to stop. Its copy would only repeat tokens.
  cut_.push_back(node);
  request c;
  c.id = req_.id;
  c.attempt = req_.attempt;
  c.cancel = true;
  c.node = node;
  follower_step s;
  s.publish = std::move(c);
  return s;
}

follower_step stream_follower::on_response(const response& m, std::uint64_t now_us) {
  if (finished_ || m.id != req_.id || m.attempt != req_.attempt) return {};  // stale attempts
  if (std::find(cut_.begin(), cut_.end(), m.node) != cut_.end()) return {};  // told to stop
  if (!serving_node_.empty() && m.node != serving_node_) {
    if ((m.kind == "accepted" || m.kind == "token") && cut_.size() < 8)
      return cut_duplicate(m.node);
    // Another peer's word on an attempt one peer already serves (its view differs): not ours.
    if (m.kind == "error" || m.kind == "done") return {};
  }
  last_heard_us_ = now_us;
  const auto seconds = [&](std::uint64_t t) { return static_cast<double>(t - t0_us_) / 1e6; };
  if (m.kind == "accepted") {
    if (!accepted_ && (out_.nodes.empty() || out_.nodes.back() != m.node))
      out_.nodes.push_back(m.node);
    if (m.prompt_tokens > 0) out_.prompt_tokens = m.prompt_tokens;  // peers since stop sequences
    accepted_ = true;
    if (serving_node_.empty()) serving_node_ = m.node;
    return {};
  }
  if (m.kind == "token") {
    accepted_ = true;
    if (serving_node_.empty()) serving_node_ = m.node;
    if (m.index < out_.tokens.size()) return {};  // a duplicate
    if (m.index > out_.tokens.size())
      return resume(fmt::format("index {} arrived while {} was due", m.index, out_.tokens.size()),
                    now_us);
    if (out_.tokens.empty()) out_.first_token_s = seconds(now_us);
    if (!out_.tokens.empty())
      out_.longest_gap_s =
          std::max(out_.longest_gap_s, static_cast<double>(now_us - last_token_us_) / 1e6);
    last_token_us_ = now_us;
    if (out_.nodes.empty() || out_.nodes.back() != m.node) out_.nodes.push_back(m.node);
    out_.tokens.push_back(m.token);
    out_.text.append(m.text.data(), m.text.size());
    if (req_.top_logprobs >= 0) {
      token_logprob lp;
      lp.text.assign(m.text.data(), m.text.size());
      lp.logprob = m.logprob;
      const std::size_t k =
          std::min({m.alt_tokens.size(), m.alt_text.size(), m.alt_logprobs.size()});
      for (std::size_t i = 0; i < k; ++i)
        lp.top.push_back({m.alt_tokens[i], std::string(m.alt_text[i].begin(), m.alt_text[i].end()),
                          m.alt_logprobs[i]});
      out_.logprobs.push_back(std::move(lp));
    }
    follower_step s;
    s.token = true;
    return s;
  }
  if (m.kind == "done") {
    if (m.tokens != out_.tokens.size())
      return resume(fmt::format("done after {} tokens, {} received", m.tokens, out_.tokens.size()),
                    now_us);
    // "max_tokens" short of ours: the stream served was not this client's request but another
    // publication under its id (a stranger who learnt or guessed the id superseded it). Never
    // reported as a success.
    if (m.stop == "max_tokens" && m.tokens < req_.max_tokens)
      return finish(make_error(
          errc::protocol,
          "request {}: peer {} ended the stream at max_tokens after {} of the {} tokens asked "
          "for: another request under this id replaced it (request ids are capabilities: use an "
          "unguessable one)",
          req_.id, m.node, m.tokens, req_.max_tokens));
    out_.stop = m.stop;
    out_.prompt_tokens = m.prompt_tokens;
    out_.attempts = req_.attempt + 1;
    out_.total_s = seconds(now_us);
    return finish(out_);
  }
  if (m.kind == "error") {
    if (m.code == error_code::unavailable) return resume(m.message, now_us);
    return finish(error{errc_of(m.code), format_peer_error(m.message, m.code, m.node)});
  }
  return {};  // a kind this client does not know: ignored (forward compatibility)
}

}  // namespace tessera::mesh::serving
