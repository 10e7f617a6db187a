#include "mesh/serving/session.hpp"

#include <fmt/format.h>

#include "inference/tokenizer/chat.hpp"

namespace tessera::mesh::serving {

namespace inf = tessera::inference;
namespace mdl = tessera::inference::model;

namespace {

built_session refused(std::string_view code, std::string message) {
  return {nullptr, code, std::move(message)};
}

}  // namespace

built_session build_session(request&& q, loaded& model, std::int64_t max_context) {
  loaded* lm = &model;
  auto s = std::make_unique<session>();
  s->model = lm;
  const auto& tok = *lm->tok;
  if (!q.messages.empty()) {
    std::vector<inf::tokenizer::chat_message> msgs;
    for (const auto& m : q.messages)
      msgs.push_back({m.role, m.content, m.tool_calls, m.tool_call_id, m.name});
    auto p = inf::tokenizer::apply_chat_template(lm->chat, msgs, true, q.tools);
    if (!p) {
      return refused(error_code::invalid_request, p.error().message);
    }
    if (!q.tool_choice.empty()) {
      // The call's opening marker ends the prompt; the answer is the call's JSON.
      auto call = inf::tokenizer::force_tool_call(q.tools, q.tool_name, lm->chat.calls);
      if (!call) {
        return refused(error_code::invalid_request, call.error().message);
      }
      p->text += call->opening;
      s->schema = std::make_unique<const inf::tokenizer::json_schema>(std::move(call->schema));
      s->json.emplace(*s->schema);
    }
    s->prompt = tok.encode(p->text, {p->add_bos, true});
  } else {
    s->prompt = tok.encode(q.prompt, {true, false});
  }
  const auto n_vocab = static_cast<std::int32_t>(lm->hp.n_vocab);
  for (auto t : q.resume)
    if (t >= n_vocab) {
      return refused(
          error_code::invalid_request,
          fmt::format("field 'resume': token id {} is outside model '{}' (vocabulary {})", t,
                      q.model, n_vocab));
    }
  const std::int64_t cap = std::min<std::int64_t>(lm->hp.n_ctx_train, max_context);
  if (static_cast<std::int64_t>(s->prompt.size() + q.resume.size()) >= cap) {
    return refused(error_code::context_length_exceeded,
                   fmt::format("the prompt has {} tokens (+{} resumed); model '{}' holds {} here",
                               s->prompt.size(), q.resume.size(), q.model, cap));
  }
  if (q.format == "json_object") {
    s->json.emplace();
  } else if (q.format == "json_schema") {
    auto compiled = inf::tokenizer::json_schema::compile(q.schema);
    if (!compiled) {
      return refused(error_code::invalid_request,
                     fmt::format("field 'schema': {}", compiled.error().message));
    }
    s->schema = std::make_unique<const inf::tokenizer::json_schema>(std::move(*compiled));
    s->json.emplace(*s->schema);
  }
  if (s->json)
    for (auto t : q.resume)
      if (!s->json->feed(tok.token_bytes(t))) {
        return refused(error_code::invalid_request,
                       fmt::format("field 'resume': the tokens are not the beginning of a valid "
                                   "answer (format {})",
                                   q.format.empty() ? "of a forced tool call" : q.format));
      }
  s->history = s->prompt;
  s->history.insert(s->history.end(), q.resume.begin(), q.resume.end());
  s->next_index = static_cast<std::uint32_t>(q.resume.size());
  mdl::sampler_options so;
  so.temperature = q.temperature;
  so.top_k = q.top_k;
  so.top_p = q.top_p;
  so.min_p = q.min_p;
  so.repeat_penalty = q.repeat_penalty;
  so.frequency_penalty = q.frequency_penalty;
  so.presence_penalty = q.presence_penalty;
  so.seed = q.seed;
  if (auto v = mdl::validate(so); !v) {
    return refused(error_code::invalid_request, v.error().message);
  }
  s->sampler = std::make_unique<mdl::sampler>(so);
  s->req = std::move(q);
  s->req.resume.clear();  // kept in history; the request copy need not hold it twice
  return {std::move(s), {}, {}};
}

}  // namespace tessera::mesh::serving
