// An API request run: refused while closing or over the in-flight bound, its body parsed by its
// API's rules (OpenAI's or Ollama's), Ollama's empty "load the model" call answered, and a
// non-streamed answer (one choice, or `n` side by side) run to its outcome and written.
#include "mesh/http/gateway_impl.hpp"

#include <algorithm>
#include <thread>
#include <variant>

#include <fmt/format.h>

#include "actors/base/thread.hpp"
#include "mesh/http/tools.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::http {

using gateway_detail::ndjson;
using gateway_detail::send_error;
using gateway_detail::send_json;
using gateway_detail::unix_now;

namespace {

using json = nlohmann::json;

}  // namespace

/// The request's id (its capability: from the kernel's CSPRNG) and the seed it samples with
/// when the body names none.
result<std::string> gateway::impl::new_id(api_kind kind, std::uint64_t* seed) {
  {
    std::lock_guard lock(mu);
    *seed = rng();
  }
  return serving::random_request_id(kind == api_kind::chat ? "chatcmpl-" : "cmpl-");
}

serving::client_options gateway::impl::client_options() const {
  serving::client_options co;
  co.peers = opt.peers;
  co.deadline_ms = opt.request_timeout_s * 1000;
  co.stall_ms = opt.stall_ms;
  co.access = opt.client_access;
  return co;
}

void gateway::impl::api(api_kind kind, httplib::Response& res, const httplib::ContentReader& reader,
                        api_dialect dialect) {
  if (closing) {
    return send_error(
        res, error_of(error{errc::closed, "this peer is leaving the mesh; ask another peer"}),
        dialect);
  }
  // The body first: a client still sending it (a slow drip) holds a handler thread, as it did
  // when cpp-httplib read bodies before the handler, but none of the in-flight API slots.
  auto body = read_body(reader, res);
  if (!body) return;
  if (in_flight.fetch_add(1) >= opt.max_in_flight) {
    in_flight.fetch_sub(1);
    api_error e = error_of(
        error{errc::overloaded, fmt::format("this peer's HTTP gateway is running {} requests "
                                            "(its bound); retry, or ask another peer",
                                            opt.max_in_flight)});
    send_error(res, e, dialect);
    return;
  }
  std::uint64_t seed = 0;
  auto id = new_id(kind, &seed);
  if (!id) {
    in_flight.fetch_sub(1);
    send_error(res, error_of(id.error()), dialect);
    return;
  }
  bool empty_prompt = false;
  auto parsed = dialect == api_dialect::openai
                    ? parse_request(kind, *body, std::move(*id), seed)
                    : parse_ollama(dialect, *body, std::move(*id), seed, &empty_prompt);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    in_flight.fetch_sub(1);
    send_error(res, *e, dialect);
    return;
  }
  auto r = std::make_shared<api_request>(std::move(std::get<api_request>(parsed)));
  if (empty_prompt) {
    // Ollama's "load the model" call: answered at once, nothing generated (404 for a model
    // the cluster does not know, as a real request would get).
    in_flight.fetch_sub(1);
    const json list = model_list();
    if (std::none_of(list.begin(), list.end(),
                     [&](const json& m) { return m["id"] == r->request.model; })) {
      api_error e;
      e.status = 404;
      e.message = fmt::format("model '{}' not found", r->model_as_sent);
      return send_error(res, e, dialect);
    }
    serving::outcome none;
    json j = ollama_final(*r, none, "", "load", rfc3339_now());
    res.status = 200;
    res.set_content(r->stream ? ndjson(j) : dump(j),
                    r->stream ? "application/x-ndjson" : "application/json");
    return;
  }
  if (r->n > 1) {
    if (r->stream) {
      stream_choices(r, res);  // in_flight ends when the streams do
      return;
    }
    complete_choices(*r, res);
    in_flight.fetch_sub(1);
    return;
  }
  if (r->stream) {
    stream(r, res);  // in_flight ends when the stream does
    return;
  }
  complete(*r, res);
  in_flight.fetch_sub(1);
}

void gateway::impl::complete(const api_request& r, httplib::Response& res) {
  auto out = run_choice(r);
  if (!out) return send_error(res, error_of(out.error(), r.kind), r.dialect);
  if (r.dialect == api_dialect::openai)
    send_json(res, 200, reply(r, *out, unix_now()));
  else
    send_json(res, 200, ollama_final(r, *out, out->text, finish_reason(out->stop), rfc3339_now()));
}

/// `n` > 1, not streamed: the choices run side by side (each its own stream, all routed to one
/// peer by their affinity, which reads the shared prompt once), then one reply holds them all.
void gateway::impl::complete_choices(const api_request& r, httplib::Response& res) {
  std::vector<api_request> choices;
  for (std::uint32_t i = 0; i < r.n; ++i)
    choices.push_back(choice_request(r, i));
  std::vector<std::optional<result<serving::outcome>>> outs(r.n);
  std::vector<std::thread> others;
  for (std::uint32_t i = 1; i < r.n; ++i)
    others.emplace_back([&, i] {
      name_this_thread("http-choice");
      outs[i].emplace(run_choice(choices[i]));
    });
  outs[0].emplace(run_choice(choices[0]));
  for (auto& t : others)
    t.join();
  for (auto& o : outs)
    if (!*o) return send_error(res, error_of(o->error(), r.kind), r.dialect);
  const auto created = unix_now();
  json j = reply(choices[0], **outs[0], created);
  json ext = json::array();
  std::uint32_t completion = 0;
  for (std::uint32_t i = 0; i < r.n; ++i) {
    const auto& out = **outs[i];
    if (i > 0) j["choices"].push_back(reply(choices[i], out, created)["choices"][0]);
    completion += static_cast<std::uint32_t>(out.tokens.size());
    ext.push_back(tessera_extension(out));
  }
  // The prompt was read once for all of them.
  const std::uint32_t prompt = (**outs[0]).prompt_tokens;
  j["usage"] = {{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion}};
  j["tessera"]["choices"] = ext;
  send_json(res, 200, j);
}

/// One stream to its outcome, the text cut at the first stop sequence.
result<serving::outcome> gateway::impl::run_choice(const api_request& r) {
  auto c = serving::client::connect(client_options());
  if (!c) return c.error();
  // Cancelled when the gateway stops: its thread pool joins this thread. With stop sequences
  // the text is watched as it comes, and the stream ends at the first one.
  std::atomic<bool> stop{false};
  std::string text;
  const auto watch = [&](const serving::token_event& t) {
    text += t.text;
    // Only the tail can hold a sequence that was not there before this token.
    const std::size_t from = text.size() > t.text.size() + max_stop_sequence_bytes
                                 ? text.size() - t.text.size() - max_stop_sequence_bytes
                                 : 0;
    if (find_stop(std::string_view(text).substr(from), r.stop) != std::string_view::npos)
      stop = true;
  };
  auto out = r.stop.empty() ? (*c)->ask(r.request, {}, &stopping)
                            : (*c)->ask(r.request, watch, &stopping, &stop);
  if (!out) return out;
  if (const auto at = find_stop(out->text, r.stop); at != std::string_view::npos) {
    out->text.resize(at);
    out->stop = "stop_sequence";
  }
  {
    std::lock_guard lock(mu);
    counters.streamed_tokens += out->tokens.size();
  }
  return out;
}

}  // namespace tessera::mesh::http
