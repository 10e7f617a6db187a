#include "inference/sharded/runner.hpp"

#include <algorithm>

namespace tessera::inference::sharded {

namespace {

// A command is a fixed-size float vector (the receiver must know the length): [op, seq, n, arg,
// tokens...]; a batch is [op, k, total, 0, k x (seq, n, want), tokens...]. Token ids and context
// sizes are far below 2^24, so floats carry them exactly.
constexpr std::size_t kHeader = 4;
constexpr std::size_t kCmdFloats = kHeader + 3 * max_sequences + max_chunk;
enum op : int {
  op_open = 1,
  op_eval = 2,
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

runner::runner(const model::model& m, collectives::group& g, layout kind, thread_pool* pool)
    : m_(&m), g_(&g), kind_(kind), pool_(pool) {}

runner::~runner() = default;

result<std::unique_ptr<runner>> runner::create(const model::model& m, collectives::group& g,
                                               layout kind, thread_pool* pool) {
  const auto rank = g.rank(), size = g.size();
  if (kind == layout::pipeline) {
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
  } else if (!m.has_embedding() || !m.has_output()) {
    return make_error(errc::invalid_argument,
                      "tensor rank {}: a tensor-parallel rank holds every layer (got layers [{}, "
                      "{}))",
                      rank, m.shard().first_layer, m.shard().last_layer);
  }
  return std::unique_ptr<runner>(new runner(m, g, kind, pool));
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
  if (kind_ == layout::tensor) {
    collectives::group* g = g_;
    o.reduce = [g](std::span<float> partial) { return g->all_reduce(partial); };
  }
  auto c = model::context::create(*m_, o);
  if (!c) return c.error();
  seqs_[seq] = std::move(*c);
  return ok();
}

result<void> runner::do_eval(std::uint32_t seq, std::span<const model::token_id> tokens,
                             bool want_logits, std::span<float> logits) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return make_error(errc::invalid_argument, "sequence {} is not open", seq);
  auto& ctx = *it->second;
  const auto rank = g_->rank(), size = g_->size();
  const auto n = static_cast<std::int64_t>(tokens.size());
  const auto dim = static_cast<std::size_t>(m_->params().dim);
  const auto vocab = static_cast<std::size_t>(m_->params().n_vocab);
  if (kind_ == layout::tensor) {
    // Every rank runs every layer on its slice; the all-reduces inside keep them in step. Only
    // rank 0 needs logits (every rank could compute the same ones).
    const bool mine = rank == 0 && want_logits;
    return ctx.eval(tokens, mine ? model::logits_mode::last : model::logits_mode::none,
                    mine ? logits : std::span<float>{});
  }
  hidden_.resize(static_cast<std::size_t>(n) * dim);
  if (rank == 0) {
    if (size == 1)
      return ctx.eval(tokens, want_logits ? model::logits_mode::last : model::logits_mode::none,
                      logits);
    TESSERA_TRY(ctx.eval(tokens, model::logits_mode::none, {}, hidden_));
    TESSERA_TRY(g_->send(1, kTagHidden, hidden_));
    if (want_logits) TESSERA_TRY(g_->recv(size - 1, kTagLogits, logits.first(vocab)));
    return ok();
  }
  TESSERA_TRY(g_->recv(rank - 1, kTagHidden, hidden_));
  const bool last = rank + 1 == size;
  if (last && want_logits) logits_.resize(vocab);
  TESSERA_TRY(ctx.eval_hidden(
      hidden_, n, last && want_logits ? model::logits_mode::last : model::logits_mode::none,
      last && want_logits ? std::span<float>(logits_) : std::span<float>{}));
  if (!last) return g_->send(rank + 1, kTagHidden, hidden_);
  if (want_logits) return g_->send(0, kTagLogits, logits_);
  return ok();
}

result<void> runner::do_eval_batch(std::span<const std::uint32_t> seqs,
                                   std::span<const std::uint32_t> counts,
                                   std::span<const std::uint8_t> want,
                                   std::span<const model::token_id> tokens,
                                   std::span<const std::span<float>> logits) {
  const auto rank = g_->rank(), size = g_->size();
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
  // Where this rank's logits go: rank 0 of a tensor group and the only pipeline rank write the
  // callers' buffers; the last pipeline stage writes logits_ rows and sends them to rank 0.
  const bool pipeline = kind_ == layout::pipeline;
  const bool first = !pipeline || rank == 0;
  const bool last = !pipeline || rank + 1 == size;
  if (pipeline && last && size > 1) logits_.resize(wanted * vocab);
  std::vector<model::batch_item> items(seqs.size());
  std::size_t offset = 0, k = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    model::batch_item& b = items[i];
    b.ctx = seqs_.at(seqs[i]).get();
    if (first) b.tokens = tokens.subspan(offset, counts[i]);
    b.n = counts[i];
    if (want[i] && last) {
      if (!pipeline) {
        if (rank == 0) b.logits = logits[i];
      } else if (size == 1) {
        b.logits = logits[i];
      } else {
        b.logits = std::span<float>(logits_).subspan(k * vocab, vocab);
      }
      ++k;
    }
    offset += counts[i];
  }
  if (!pipeline) {
    collectives::group* g = g_;
    return model::context::eval_batch(
        items, *ws_, pool_, {}, [g](std::span<float> partial) { return g->all_reduce(partial); });
  }
  if (size == 1) return model::context::eval_batch(items, *ws_, pool_);
  hidden_.resize(total * dim);
  if (rank > 0) TESSERA_TRY(g_->recv(rank - 1, kTagHidden, hidden_));
  TESSERA_TRY(model::context::eval_batch(items, *ws_, pool_, hidden_));
  if (!last) return g_->send(rank + 1, kTagHidden, hidden_);
  if (wanted > 0) return g_->send(0, kTagLogits, logits_);
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
  for (std::size_t done = 0; done < tokens.size();) {
    const std::size_t n = std::min<std::size_t>(max_chunk, tokens.size() - done);
    const bool last_chunk = done + n == tokens.size();
    const bool want = last_chunk && !logits.empty();
    auto cmd = command(op_eval, seq, n, want ? 1 : 0);
    for (std::size_t i = 0; i < n; ++i)
      cmd[kHeader + i] = static_cast<float>(tokens[done + i]);
    TESSERA_TRY(broadcast(cmd));
    TESSERA_TRY(do_eval(seq, tokens.subspan(done, n), want, logits));
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
  // Pipeline: the last stage sends the wanted rows' logits back, in request order.
  if (kind_ == layout::pipeline && g_->size() > 1 && wanted > 0) {
    logits_.resize(wanted * vocab);
    TESSERA_TRY(g_->recv(g_->size() - 1, kTagLogits, logits_));
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
      case op_eval: {
        if (n == 0 || n > max_chunk)
          return make_error(errc::protocol, "eval command with {} tokens (1..{})", n, max_chunk);
        tokens.resize(n);
        for (std::size_t i = 0; i < n; ++i)
          tokens[i] = static_cast<model::token_id>(cmd[kHeader + i]);
        TESSERA_TRY(do_eval(seq, tokens, cmd[3] != 0.0f, {}));
        break;
      }
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
