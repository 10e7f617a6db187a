#include "inference/sharded/runner.hpp"

#include <algorithm>

namespace tessera::inference::sharded {

namespace {

// A command is a fixed-size float vector (the receiver must know the length): [op, seq, n, arg,
// tokens...]; a batch is [op, k, total, 0, k x (seq, n, want), tokens...]. Token ids and context
// sizes are far below 2^24, so floats carry them exactly.
constexpr std::size_t kHeader = 4;
constexpr std::size_t kCmdFloats = kHeader + 3 * max_sequences + max_chunk;
enum op : int {  // 2 was a single-sequence eval, now a batch of one
  op_open = 1,
  op_close = 3,
  op_ping = 4,
  op_shutdown = 5,
  op_eval_batch = 6
};
constexpr std::uint64_t kTagCmd = 1, kTagHidden = 2, kTagLogits = 3;

std::vector<float> command(int op, std::uint32_t seq, std::size_t n, std::int64_t arg) {
  std::vector<float> c(kCmdFloats, 0.0f);
  c[0] = static_cast<float>(op);
  c[1] = static_cast<float>(seq);
  c[2] = static_cast<float>(n);
  c[3] = static_cast<float>(arg);
  return c;
}

}  // namespace

runner::runner(const model::model& m, collectives::group& g, std::vector<std::uint32_t> stages,
               thread_pool* pool)
    : m_(&m), g_(&g), pool_(pool), stage_of_(std::move(stages)) {
  const auto rank = g.rank();
  stage_ = stage_of_[rank];
  n_stages_ = stage_of_.back() + 1;
  for (std::uint32_t r = 0; r < stage_of_.size(); ++r) {
    if (stage_of_[r] == stage_) team_.push_back(r);
    if (stage_of_[r] == stage_ + 1) next_team_.push_back(r);
  }
  for (std::uint32_t r = static_cast<std::uint32_t>(stage_of_.size()); r-- > 0;) {
    if (stage_ > 0 && stage_of_[r] == stage_ - 1) prev_leader_ = r;  // ends at the stage's first
    if (stage_of_[r] == n_stages_ - 1) last_leader_ = r;
  }
  if (team_.size() > 1) {
    collectives::group* gp = g_;
    if (n_stages_ == 1) {
      // Tensor parallel over the whole group: the full all-reduce (ring for large vectors).
      reduce_ = [gp](std::span<float> partial) { return gp->all_reduce(partial); };
    } else {
      reduce_ = [gp, team = team_](std::span<float> partial) {
        return gp->all_reduce_among(partial, team);
      };
    }
  }
}

runner::~runner() = default;

result<std::unique_ptr<runner>> runner::create(const model::model& m, collectives::group& g,
                                               layout kind, thread_pool* pool) {
  const auto rank = g.rank(), size = g.size();
  std::vector<std::uint32_t> stages(size, 0);
  if (kind == layout::pipeline) {
    for (std::uint32_t r = 0; r < size; ++r) stages[r] = r;
    if ((rank == 0) != m.has_embedding())
      return make_error(errc::invalid_argument,
                        "pipeline rank {}: the embedding belongs to rank 0 and only to it", rank);
    if ((rank + 1 == size) != m.has_output())
      return make_error(errc::invalid_argument,
                        "pipeline rank {} of {}: the output layer belongs to the last rank and "
                        "only to it",
                        rank, size);
    if (m.is_tensor_parallel())
      return make_error(errc::invalid_argument,
                        "pipeline rank {}: a tensor-parallel slice in a pipeline group", rank);
  } else if (kind == layout::tensor) {
    if (!m.has_embedding() || !m.has_output())
      return make_error(errc::invalid_argument,
                        "tensor rank {}: a tensor-parallel rank holds every layer (got layers [{}, "
                        "{}))",
                        rank, m.shard().first_layer, m.shard().last_layer);
  } else {
    return make_error(errc::invalid_argument,
                      "a hybrid layout needs each rank's stage (the other create())");
  }
  return std::unique_ptr<runner>(new runner(m, g, std::move(stages), pool));
}

result<std::unique_ptr<runner>> runner::create(const model::model& m, collectives::group& g,
                                               std::vector<std::uint32_t> stage_of_rank,
                                               thread_pool* pool) {
  const auto rank = g.rank(), size = g.size();
  if (stage_of_rank.size() != size || stage_of_rank[0] != 0)
    return make_error(errc::invalid_argument,
                      "hybrid layout: {} stage entries for {} ranks (rank 0 in stage 0)",
                      stage_of_rank.size(), size);
  for (std::uint32_t r = 1; r < size; ++r)
    if (stage_of_rank[r] < stage_of_rank[r - 1] || stage_of_rank[r] > stage_of_rank[r - 1] + 1)
      return make_error(errc::invalid_argument,
                        "hybrid layout: rank {} is in stage {} after stage {} (stages go up by "
                        "one, in rank order)",
                        r, stage_of_rank[r], stage_of_rank[r - 1]);
  const std::uint32_t stage = stage_of_rank[rank], last = stage_of_rank.back();
  const auto team = static_cast<std::size_t>(
      std::count(stage_of_rank.begin(), stage_of_rank.end(), stage));
  if (stage == 0 && !m.has_embedding())
    return make_error(errc::invalid_argument, "hybrid rank {} (stage 0) lacks the embedding", rank);
  if ((stage == last) != m.has_output())
    return make_error(errc::invalid_argument,
                      "hybrid rank {} (stage {} of {}): the output layer belongs to the last "
                      "stage's ranks and only to them",
                      rank, stage, last + 1);
  if ((team > 1) != m.is_tensor_parallel())
    return make_error(errc::invalid_argument,
                      "hybrid rank {}: a stage of {} rank(s) needs {} slice", rank, team,
                      team > 1 ? "a tensor-parallel" : "a full-width");
  return std::unique_ptr<runner>(new runner(m, g, std::move(stage_of_rank), pool));
}

std::int64_t runner::pos(std::uint32_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? -1 : it->second->pos();
}

result<void> runner::broadcast(const std::vector<float>& cmd) {
  for (std::uint32_t r = 1; r < g_->size(); ++r)
    TESSERA_TRY(g_->send(r, kTagCmd, cmd));
  return ok();
}

result<void> runner::do_open(std::uint32_t seq, std::int64_t n_ctx) {
  if (seq >= max_sequences)
    return make_error(errc::invalid_argument, "sequence {} (at most {})", seq, max_sequences - 1);
  if (seqs_.contains(seq)) return make_error(errc::invalid_argument, "sequence {} is open", seq);
  model::context_options o{n_ctx, max_chunk, pool_, {}};
  o.reduce = reduce_;
  o.kv_type = kv_cache_;
  auto c = model::context::create(*m_, o);
  if (!c) return c.error();
  seqs_[seq] = std::move(*c);
  return ok();
}

result<void> runner::do_eval_batch(std::span<const std::uint32_t> seqs,
                                   std::span<const std::uint32_t> counts,
                                   std::span<const std::uint8_t> want,
                                   std::span<const model::token_id> tokens,
                                   std::span<const std::span<float>> logits) {
  const auto rank = g_->rank();
  const auto dim = static_cast<std::size_t>(m_->params().dim);
  const auto vocab = static_cast<std::size_t>(m_->params().n_vocab);
  std::int64_t need_ctx = 1;
  std::size_t total = 0, wanted = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    auto it = seqs_.find(seqs[i]);
    if (it == seqs_.end())
      return make_error(errc::invalid_argument, "sequence {} is not open", seqs[i]);
    need_ctx = std::max(need_ctx, it->second->n_ctx());
    total += counts[i];
    wanted += want[i] ? 1 : 0;
  }
  if (!ws_ || ws_->n_ctx() < need_ctx) {
    auto ws = model::workspace::create(*m_, max_chunk, need_ctx, pool_ ? pool_->size() : 1);
    if (!ws) return ws.error();
    ws_ = std::move(*ws);
  }
  // Logits come from the last stage's leader: into the callers' buffers when that is rank 0,
  // else into logits_ rows (in request order), sent to rank 0 after the pass.
  const bool first = stage_ == 0, last = stage_ + 1 == n_stages_;
  const bool lead = rank == team_.front();
  const bool send_logits = last && lead && rank != 0 && wanted > 0;
  if (send_logits) logits_.resize(wanted * vocab);
  std::vector<model::batch_item> items(seqs.size());
  std::size_t offset = 0, k = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    model::batch_item& b = items[i];
    b.ctx = seqs_.at(seqs[i]).get();
    if (first) b.tokens = tokens.subspan(offset, counts[i]);
    b.n = counts[i];
    if (want[i] && last && lead) {
      b.logits = rank == 0 ? logits[i] : std::span<float>(logits_).subspan(k * vocab, vocab);
      ++k;
    }
    offset += counts[i];
  }
  if (n_stages_ == 1) return model::context::eval_batch(items, *ws_, pool_, {}, reduce_);
  hidden_.resize(total * dim);
  if (!first) TESSERA_TRY(g_->recv(prev_leader_, kTagHidden, hidden_));
  TESSERA_TRY(model::context::eval_batch(items, *ws_, pool_, hidden_, reduce_));
  if (!last && lead)
    for (std::uint32_t r : next_team_) TESSERA_TRY(g_->send(r, kTagHidden, hidden_));
  if (send_logits) return g_->send(0, kTagLogits, logits_);
  return ok();
}

result<void> runner::open(std::uint32_t seq, std::int64_t n_ctx) {
  if (n_ctx <= 0 || n_ctx > (1 << 22))
    return make_error(errc::invalid_argument, "context of {} positions", n_ctx);
  if (seq >= max_sequences || seqs_.contains(seq))
    return make_error(errc::invalid_argument, "sequence {} is open or out of range", seq);
  TESSERA_TRY(broadcast(command(op_open, seq, 0, n_ctx)));
  return do_open(seq, n_ctx);
}

result<void> runner::eval(std::uint32_t seq, std::span<const model::token_id> tokens,
                          std::span<float> logits) {
  if (!seqs_.contains(seq))
    return make_error(errc::invalid_argument, "sequence {} is not open", seq);
  if (tokens.empty()) return make_error(errc::invalid_argument, "eval: no tokens");
  const auto vocab = static_cast<std::size_t>(m_->params().n_vocab);
  if (!logits.empty() && logits.size() < vocab)
    return make_error(errc::invalid_argument, "eval: logits buffer of {} floats, {} needed",
                      logits.size(), vocab);
  auto& ctx = *seqs_[seq];
  if (ctx.pos() + static_cast<std::int64_t>(tokens.size()) > ctx.n_ctx())
    return make_error(errc::no_capacity, "sequence {}: {} tokens at position {} exceed {}", seq,
                      tokens.size(), ctx.pos(), ctx.n_ctx());
  // A batch of one per chunk (its logits are eval's, bit for bit).
  for (std::size_t done = 0; done < tokens.size();) {
    const std::size_t n = std::min<std::size_t>(max_chunk, tokens.size() - done);
    const bool last_chunk = done + n == tokens.size();
    const batch_request r{seq, tokens.subspan(done, n),
                          last_chunk ? logits.first(logits.empty() ? 0 : vocab) : std::span<float>{}};
    TESSERA_TRY(eval_batch({&r, 1}));
    done += n;
  }
  return ok();
}

result<void> runner::eval_batch(std::span<const batch_request> requests) {
  if (requests.empty()) return make_error(errc::invalid_argument, "eval_batch: no sequences");
  if (requests.size() > max_sequences)
    return make_error(errc::invalid_argument, "eval_batch: {} sequences (at most {})",
                      requests.size(), max_sequences);
  const auto vocab = static_cast<std::size_t>(m_->params().n_vocab);
  std::vector<std::uint32_t> seqs, counts;
  std::vector<std::uint8_t> want;
  std::vector<model::token_id> tokens;
  std::vector<std::span<float>> logits;
  std::size_t wanted = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const batch_request& r = requests[i];
    auto it = seqs_.find(r.seq);
    if (it == seqs_.end())
      return make_error(errc::invalid_argument, "eval_batch: sequence {} is not open", r.seq);
    if (std::find(seqs.begin(), seqs.end(), r.seq) != seqs.end())
      return make_error(errc::invalid_argument, "eval_batch: sequence {} appears twice", r.seq);
    if (r.tokens.empty())
      return make_error(errc::invalid_argument, "eval_batch: sequence {} has no tokens", r.seq);
    if (!r.logits.empty() && r.logits.size() < vocab)
      return make_error(errc::invalid_argument,
                        "eval_batch: sequence {}: logits buffer of {} floats, {} needed", r.seq,
                        r.logits.size(), vocab);
    if (it->second->pos() + static_cast<std::int64_t>(r.tokens.size()) > it->second->n_ctx())
      return make_error(errc::no_capacity, "sequence {}: {} tokens at position {} exceed {}",
                        r.seq, r.tokens.size(), it->second->pos(), it->second->n_ctx());
    seqs.push_back(r.seq);
    counts.push_back(static_cast<std::uint32_t>(r.tokens.size()));
    want.push_back(r.logits.empty() ? 0 : 1);
    wanted += r.logits.empty() ? 0 : 1;
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    logits.push_back(r.logits);
  }
  if (tokens.size() > max_chunk)
    return make_error(errc::invalid_argument, "eval_batch: {} tokens in all (at most {})",
                      tokens.size(), max_chunk);
  auto cmd = command(op_eval_batch, static_cast<std::uint32_t>(seqs.size()), tokens.size(), 0);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    cmd[kHeader + 3 * i] = static_cast<float>(seqs[i]);
    cmd[kHeader + 3 * i + 1] = static_cast<float>(counts[i]);
    cmd[kHeader + 3 * i + 2] = want[i] != 0 ? 1.0f : 0.0f;
  }
  for (std::size_t t = 0; t < tokens.size(); ++t)
    cmd[kHeader + 3 * max_sequences + t] = static_cast<float>(tokens[t]);
  TESSERA_TRY(broadcast(cmd));
  TESSERA_TRY(do_eval_batch(seqs, counts, want, tokens, logits));
  // The last stage's leader, when it is not rank 0, sends the wanted rows' logits back.
  if (last_leader_ != 0 && wanted > 0) {
    logits_.resize(wanted * vocab);
    TESSERA_TRY(g_->recv(last_leader_, kTagLogits, logits_));
    std::size_t k = 0;
    for (auto& l : logits)
      if (!l.empty()) {
        std::copy_n(logits_.begin() + static_cast<std::ptrdiff_t>(k * vocab), vocab, l.begin());
        ++k;
      }
  }
  return ok();
}

result<void> runner::close(std::uint32_t seq) {
  if (!seqs_.contains(seq))
    return make_error(errc::invalid_argument, "sequence {} is not open", seq);
  TESSERA_TRY(broadcast(command(op_close, seq, 0, 0)));
  seqs_.erase(seq);
  return ok();
}

result<void> runner::ping() {
  return broadcast(command(op_ping, 0, 0, 0));
}

result<void> runner::shutdown() {
  return broadcast(command(op_shutdown, 0, 0, 0));
}

result<void> runner::follow() {
  if (g_->rank() == 0)
    return make_error(errc::invalid_argument, "rank 0 leads; it does not follow");
  std::vector<float> cmd(kCmdFloats);
  std::vector<model::token_id> tokens;
  for (;;) {
    TESSERA_TRY(g_->recv(0, kTagCmd, cmd));
    const auto o = static_cast<int>(cmd[0]);
    const auto seq = static_cast<std::uint32_t>(cmd[1]);
    const auto n = static_cast<std::size_t>(cmd[2]);
    switch (o) {
      case op_open:
        TESSERA_TRY(do_open(seq, static_cast<std::int64_t>(cmd[3])));
        break;
      case op_eval_batch: {
        const auto k = static_cast<std::size_t>(cmd[1]);
        if (k == 0 || k > max_sequences || n == 0 || n > max_chunk)
          return make_error(errc::protocol, "batch command of {} sequences, {} tokens", k, n);
        std::vector<std::uint32_t> seqs(k), counts(k);
        std::vector<std::uint8_t> want(k);
        std::size_t sum = 0;
        for (std::size_t i = 0; i < k; ++i) {
          seqs[i] = static_cast<std::uint32_t>(cmd[kHeader + 3 * i]);
          counts[i] = static_cast<std::uint32_t>(cmd[kHeader + 3 * i + 1]);
          want[i] = cmd[kHeader + 3 * i + 2] != 0.0f ? 1 : 0;
          sum += counts[i];
        }
        if (sum != n)
          return make_error(errc::protocol, "batch command: counts add up to {}, not {}", sum, n);
        tokens.resize(n);
        for (std::size_t i = 0; i < n; ++i)
          tokens[i] = static_cast<model::token_id>(cmd[kHeader + 3 * max_sequences + i]);
        std::vector<std::span<float>> none(k);
        TESSERA_TRY(do_eval_batch(seqs, counts, want, tokens, none));
        break;
      }
      case op_close:
        seqs_.erase(seq);
        break;
      case op_ping:
        break;
      case op_shutdown:
        return ok();
      default:
        return make_error(errc::protocol, "unknown command {}", o);
    }
  }
}

}  // namespace tessera::inference::sharded
