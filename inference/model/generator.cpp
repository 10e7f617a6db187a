#include "inference/model/generator.hpp"

#include <chrono>
#include <optional>

namespace tessera::inference::model {

std::string_view to_string(stop_reason r) noexcept {
  switch (r) {
    case stop_reason::none: return "none";
    case stop_reason::end_of_generation: return "end_of_generation";
    case stop_reason::max_tokens: return "max_tokens";
    case stop_reason::context_full: return "context_full";
    case stop_reason::cancelled: return "cancelled";
  }
  return "?";
}

generator::generator(const model& m, context& ctx, const tokenizer::tokenizer* tok,
                     const sampler_options& s)
    : m_(&m), ctx_(&ctx), tok_(tok), sampler_(s) {
  logits_.resize(static_cast<std::size_t>(m.params().n_vocab));
  work_.resize(logits_.size());
}

result<void> generator::prefill(std::span<const token_id> tokens) {
  TESSERA_TRY(ctx_->eval(tokens, logits_mode::last, logits_));
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  have_logits_ = true;
  return ok();
}

result<token_id> generator::step() {
  if (!have_logits_) return make_error(errc::invalid_argument, "generator: step() before prefill()");
  if (ctx_->pos() >= ctx_->n_ctx())
    return make_error(errc::no_capacity, "generator: KV cache full ({} positions)", ctx_->n_ctx());
  work_ = logits_;
  const token_id id = sampler_.sample_at(work_, history_, generated_);
  const token_id one[1] = {id};
  TESSERA_TRY(ctx_->eval(one, logits_mode::last, logits_));
  history_.push_back(id);
  ++generated_;
  return id;
}

result<generation_stats> generator::generate(std::span<const token_id> prompt,
                                             std::int64_t max_tokens, const text_callback& on_text) {
  using clock = std::chrono::steady_clock;
  generation_stats st;
  st.prompt_tokens = static_cast<std::int64_t>(prompt.size());
  auto t0 = clock::now();
  TESSERA_TRY(prefill(prompt));
  st.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  std::optional<tokenizer::stream_decoder> dec;
  if (tok_ != nullptr) dec.emplace(*tok_);
  clock::time_point decode_start{};
  while (true) {
    if (st.generated_tokens >= max_tokens) {
      st.stop = stop_reason::max_tokens;
      break;
    }
    work_ = logits_;
    const token_id id = sampler_.sample_at(work_, history_, generated_++);
    if (st.generated_tokens == 1) decode_start = clock::now();
    ++st.generated_tokens;
    history_.push_back(id);
    if (tok_ != nullptr && tok_->is_end_of_generation(id)) {
      st.stop = stop_reason::end_of_generation;
      break;
    }
    if (dec && on_text) {
      const std::string piece = dec->push(id);
      if (!piece.empty() && !on_text(piece)) {
        st.stop = stop_reason::cancelled;
        break;
      }
    }
    if (st.generated_tokens >= max_tokens) {
      st.stop = stop_reason::max_tokens;
      break;
    }
    if (ctx_->pos() >= ctx_->n_ctx()) {
      st.stop = stop_reason::context_full;
      break;
    }
    const token_id one[1] = {id};
    TESSERA_TRY(ctx_->eval(one, logits_mode::last, logits_));
  }
  if (st.generated_tokens > 1)
    st.decode_s = std::chrono::duration<double>(clock::now() - decode_start).count();
  if (dec && on_text) {
    const std::string rest = dec->flush();
    if (!rest.empty()) on_text(rest);
  }
  return st;
}

}  // namespace tessera::inference::model
