#include "inference/sharded/runner.hpp"

#include <algorithm>

namespace tessera::inference::sharded {

namespace {

// A command is a fixed-size float vector (the receiver must know the length): [op, seq, n, arg,
// tokens...]. Token ids and context sizes are far below 2^24, so floats carry them exactly.
constexpr std::size_t kHeader = 4;
constexpr std::size_t kCmdFloats = kHeader + max_chunk;
enum op : int { op_open = 1, op_eval = 2, op_close = 3, op_ping = 4, op_shutdown = 5 };
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
