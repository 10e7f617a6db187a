#include "mesh/serving/passes.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace tessera::mesh::serving {

namespace mdl = tessera::inference::model;

/// See passes.hpp.
result<void> round_passes::eval(session& s, std::span<const mdl::token_id> tokens,
                                bool want_logits) {
  if (s.host == nullptr) {
    if (max_batch_streams_ > 1) {
      round_.push_back({&s, tokens, want_logits});
      return ok();
    }
    ++passes_;
    ++pass_streams_;
    return s.ctx->eval(tokens, want_logits ? mdl::logits_mode::last : mdl::logits_mode::none,
                       s.logits);
  }
  auto* ru = s.host->runner();
  if (ru == nullptr) return make_error(errc::closed, "its group failed: {}", s.host->failure());
  if (max_batch_streams_ > 1 && tokens.size() <= inference::sharded::max_chunk) {
    round_.push_back({&s, tokens, want_logits});
    return ok();
  }
  ++passes_;
  ++pass_streams_;
  auto r = ru->eval(s.seq, tokens, want_logits ? std::span<float>(s.logits) : std::span<float>{});
  if (!r) s.host->fail(r.error().describe());
  return r;
}

/// Evaluates the round's units: per model (local streams) or per split group (its streams), in
/// passes of at most max_batch_streams streams and what one pass holds (a local workspace's
/// tokens; a group command's max_chunk). A local pass that fails is retried stream by stream so
/// that only the stream at fault ends; a group's failure fails the group and its streams (they
/// resume elsewhere). Returns the sessions that failed, with why, in the order they failed.
std::vector<round_passes::failure> round_passes::run() {
  std::vector<failure> failed;
  auto& round = round_;
  std::stable_sort(round.begin(), round.end(), [](const unit& a, const unit& b) {
    return std::pair(a.s->host, a.s->model) < std::pair(b.s->host, b.s->model);
  });
  std::vector<session*> who;
  std::vector<std::span<const mdl::token_id>> toks;
  std::vector<bool> wants;
  auto flush = [&](session& first) {
    if (who.empty()) return;
    ++passes_;
    pass_streams_ += who.size();
    if (first.host != nullptr) {
      std::vector<inference::sharded::batch_request> reqs;
      for (std::size_t i = 0; i < who.size(); ++i)
        reqs.push_back({who[i]->seq, toks[i],
                        wants[i] ? std::span<float>(who[i]->logits) : std::span<float>{}});
      auto* ru = first.host->runner();
      auto r = ru != nullptr ? ru->eval_batch(reqs)
                             : result<void>(make_error(errc::closed, "its group failed: {}",
                                                       first.host->failure()));
      if (!r) {
        if (ru != nullptr) first.host->fail(r.error().describe());
        for (session* s : who) {
          failed.push_back({s, r.error()});
        }
      }
    } else {
      std::vector<mdl::batch_item> items;
      for (std::size_t i = 0; i < who.size(); ++i)
        items.push_back({who[i]->ctx.get(), toks[i],
                         wants[i] ? std::span<float>(who[i]->logits) : std::span<float>{}});
      auto r = mdl::context::eval_batch(items, *first.model->ws, &pool_);
      if (!r) {
        spdlog::warn("serving: a batched pass of model '{}' failed ({}); its {} streams run alone",
                     first.model->info.name, r.error().message, items.size());
        for (std::size_t i = 0; i < items.size(); ++i) {
          auto e = who[i]->ctx->eval(
              items[i].tokens,
              items[i].logits.empty() ? mdl::logits_mode::none : mdl::logits_mode::last,
              who[i]->logits);
          if (!e) {
            failed.push_back({who[i], e.error()});
          }
        }
      }
    }
    who.clear();
    toks.clear();
    wants.clear();
  };
  std::int64_t tokens = 0;
  for (std::size_t i = 0; i < round.size(); ++i) {
    unit& u = round[i];
    const auto n = static_cast<std::int64_t>(u.tokens.size());
    const std::int64_t room = u.s->host != nullptr ? std::int64_t{inference::sharded::max_chunk}
                                                   : u.s->model->ws->max_tokens();
    if (!who.empty() && (who.size() >= max_batch_streams_ || tokens + n > room)) {
      flush(*who.front());
      tokens = 0;
    }
    who.push_back(u.s);
    toks.push_back(u.tokens);
    wants.push_back(u.logits);
    tokens += n;
    const bool last_of_key = i + 1 == round.size() || round[i + 1].s->host != u.s->host ||
                             round[i + 1].s->model != u.s->model;
    if (last_of_key) {
      flush(*who.front());
      tokens = 0;
    }
  }
  round.clear();
  return failed;
}

}  // namespace tessera::mesh::serving
