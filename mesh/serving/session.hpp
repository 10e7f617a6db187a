// A stream this peer serves: the request, its tokens, its sampler and JSON constraint, and where
// it runs (a local model's context, or a sequence slot of a split group this peer is rank 0 of).
// build_session() turns an accepted request into one, or names what is wrong with it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "inference/model/model.hpp"
#include "inference/model/sampler.hpp"
#include "inference/tokenizer/json_grammar.hpp"
#include "mesh/serving/group_host.hpp"
#include "mesh/serving/holdings.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::serving {

struct session {
  using time_point = std::chrono::steady_clock::time_point;
  using token_id = inference::model::token_id;
  request req;
  loaded* model = nullptr;
  std::vector<token_id> prompt;   // what the model reads before generating
  std::vector<token_id> history;  // prompt + generated (the repetition penalty's window)
  std::size_t fed = 0;            // prompt tokens evaluated so far
  std::uint32_t next_index = 0;   // index of the next generated token
  std::unique_ptr<inference::model::context> ctx;  // a local model, or:
  group_host* host = nullptr;                      // a group split over peers (this peer is rank 0)
  std::uint32_t seq = 0;                           // the host runner's sequence slot
  std::int64_t n_ctx = 0;
  std::unique_ptr<inference::model::sampler> sampler;
  std::vector<float> logits, work;
  bool have_logits = false;
  time_point last_sent{};
  time_point started{};   // accepted here (the stream statistics' zero)
  bool sent_any = false;  // a token of this attempt went out
  std::string client;     // the identity its fair share counts by (request::client)
  // format json_object / json_schema: the answer so far, as the beginning of a valid one (its
  // tokens are masked to keep it so, and the stream ends once it is complete). The compiled
  // schema lives here, beside the state that points at it.
  std::unique_ptr<const inference::tokenizer::json_schema> schema;
  std::optional<inference::tokenizer::json_prefix> json;
  time_point ran_since{};       // took its slot (rule 3's quantum counts from here)
  std::uint64_t took_slot = 0;  // the order streams took their slots (prefix sharing)
};

/// A request made into a session, or why it cannot be one (`code`: an error_code, `message`
/// naming the field or the limit).
struct built_session {
  std::unique_ptr<session> s;
  std::string_view code;
  std::string message;
};

/// Renders the prompt (the model's chat template for messages, a forced tool call's opening),
/// tokenizes it, checks the resumed tokens, the context bound (`max_context` positions at most,
/// the model's own if smaller), the JSON format and the sampler options.
/// `q` is moved from only when the session is made: on a refusal the caller still has it.
[[nodiscard]] built_session build_session(request&& q, loaded& model, std::int64_t max_context);

/// A local stream whose model's weights are on their way (loading, or about to): it waits queued.
[[nodiscard]] inline bool waits_for_weights(const session& s) {
  if (s.host != nullptr) return false;
  const auto w = s.model->state.load();
  return w == loaded::weights::loading || (w == loaded::weights::none && s.model->wanted);
}

}  // namespace tessera::mesh::serving
