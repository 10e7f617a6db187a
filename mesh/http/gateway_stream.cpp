// Streamed answers: a relay per stream (its serving client on a thread of its own), the HTTP
// status held until the first token, and the stream written out as its API's events (OpenAI's SSE
// chunks or Ollama's NDJSON lines), text held back while it may end inside a UTF-8 character or
// begin a stop sequence or a tool call; `n` > 1 choices interleaved in one SSE stream.
#include "mesh/http/gateway_impl.hpp"

#include <algorithm>
#include <chrono>
#include <string_view>

#include "actors/base/thread.hpp"
#include "mesh/http/tools.hpp"

namespace tessera::mesh::http {

using gateway_detail::ndjson;
using gateway_detail::relay;
using gateway_detail::send_error;
using gateway_detail::unix_now;

namespace {

using json = nlohmann::json;

/// One answer (`n` = 1) written out as its stream (gateway::impl::write_stream): the relay's
/// tokens, one event each, then the events that end the stream.
struct stream_writer {
  stream_writer(gateway::impl& gw, relay& rl_, const api_request& r_, httplib::DataSink& sink_)
      : g(gw), rl(rl_), r(r_), sink(sink_) {}

  gateway::impl& g;
  relay& rl;
  const api_request& r;
  httplib::DataSink& sink;
  const std::int64_t created = unix_now();
  const bool openai = r.dialect == api_dialect::openai;
  // Log-probabilities of the tokens whose text has not gone out yet: they go with it.
  std::vector<serving::token_logprob> pending_lp;
  std::size_t text_offset = 0;  // bytes of the answer written so far
  std::string written;          // with tools only: that answer's text (calls are read from it)
  // The peer serving the stream, sent with the first event after it changed (the first token,
  // and a failover's first): `"tessera": {"node": id}` (docs/HTTP.md).
  std::string last_node, pending_node;
  // A token's bytes that end inside a UTF-8 character wait here for the next token's, and so do
  // bytes that may begin a stop sequence (until the text shows whether one follows), and, with
  // tools, everything from where a tool call may begin (mesh/http/tools.hpp).
  std::string carry;
  bool stopped = false;  // a stop sequence appeared: the text ends before it
  const bool tools = r.tools && (openai || r.dialect == api_dialect::ollama_chat);

  // One piece of text as the request's API streams it.
  std::string piece_event(std::string_view text) {
    std::string e;
    if (openai) {
      json j = chunk(r, text, false, "", created, pending_lp, text_offset);
      if (!pending_node.empty()) j["tessera"] = {{"node", pending_node}};
      pending_node.clear();
      e = sse(j);
    } else {
      e = ndjson(ollama_chunk(r, text, rfc3339_now()));
    }
    pending_lp.clear();
    text_offset += text.size();
    return e;
  }

  bool write(const std::string& s) {
    if (sink.write(s.data(), s.size())) return true;
    rl.cancel = true;
    std::lock_guard lock(g.mu);
    ++g.counters.disconnects;
    return false;
  }

  /// The whole stream; false when it was cut (the client went away, the gateway stopped).
  bool run() {
    if (openai && r.kind == api_kind::chat && !write(sse(chunk(r, "", true, "", created))))
      return false;
    std::uint32_t written_tokens = 0;
    for (;;) {
      std::deque<relay::piece> pieces;
      std::optional<result<serving::outcome>> end;
      std::uint32_t tokens = 0;
      {
        std::unique_lock lock(rl.mu);
        rl.cv.wait_for(lock, std::chrono::milliseconds(200),
                       [&] { return !rl.pieces.empty() || rl.end.has_value() || g.stopping; });
        if (g.stopping && !rl.end) {
          rl.cancel = true;
          return false;  // closes the connection: the client sees the stream cut
        }
        pieces.swap(rl.pieces);
        tokens = rl.tokens;
        if (rl.end) end = std::move(rl.end);
      }
      // One event per token (docs/HTTP.md), however many arrived since the last round.
      for (auto& piece : pieces) {
        if (stopped) break;  // tokens generated before the peer heard the cancel
        if (!take(piece)) return false;
      }
      if (end && tools && (end->has_value() || stopped)) {
        if (const auto done = end_with_tool_calls(end)) return *done;
      }
      if (end && !carry.empty()) {
        if (tools) written += carry;
        if (!write(piece_event(carry))) return false;
        carry.clear();
      }
      {
        std::lock_guard lock(g.mu);
        g.counters.streamed_tokens += tokens - written_tokens;
      }
      written_tokens = tokens;
      if (!end) continue;
      return finish(end);
    }
  }

  /// One token's text into the carry, and what of the carry can go out now; false when the write
  /// failed.
  bool take(relay::piece& piece) {
    if (piece.logprob) pending_lp.push_back(std::move(*piece.logprob));
    if (piece.node != last_node) last_node = pending_node = piece.node;
    carry += piece.text;
    std::size_t n = utf8_complete_prefix(carry);
    if (!r.stop.empty()) {
      if (const auto at = find_stop(carry, r.stop); at != std::string_view::npos) {
        carry.resize(at);
        stopped = true;
        rl.stop = true;  // the relay's ask ends with the outcome so far; the peer stops
        n = carry.size();
      } else {
        n = std::min(n, carry.size() - stop_holdback(carry, r.stop));
      }
    }
    if (tools) {
      // The answer so far is what went out (text_offset bytes) and the carry.
      const std::size_t from = tool_holdback_from(written + carry);
      if (from != std::string_view::npos)
        n = std::min(n, from > text_offset ? from - text_offset : 0);
    }
    if (n == 0) return true;
    if (tools) written.append(carry, 0, n);
    if (!write(piece_event(std::string_view(carry).substr(0, n)))) return false;
    carry.erase(0, n);
    return true;
  }

  /// The end of a stream with tools: the held text is tool calls (a chunk of them ends the
  /// stream: true, or false when the write failed), or content after all (nullopt).
  std::optional<bool> end_with_tool_calls(const std::optional<result<serving::outcome>>& end) {
    // The held text: tool calls (a chunk of them ends the stream), or content after all.
    auto parsed = parse_tool_calls(written + carry);
    if (!parsed.calls.empty() && !openai && end->has_value()) {
      // Ollama: the last line carries the calls (ollama_final reads them from the answer).
      if (!write(ndjson(ollama_final(r, **end, "", "stop", rfc3339_now())))) return false;
      sink.done();
      return true;
    }
    if (!parsed.calls.empty() && openai) {
      if (!write(sse(tool_calls_chunk(r, parsed.calls, created)))) return false;
      if (end->has_value() && r.include_usage &&
          !write(sse(usage_chunk(r, (**end).prompt_tokens,
                                 static_cast<std::uint32_t>((**end).tokens.size()), created))))
        return false;
      if (!write(std::string(sse_done))) return false;
      sink.done();
      return true;
    }
    return std::nullopt;
  }

  /// The events that end the stream: Ollama's last line, or OpenAI's last chunk (its usage if
  /// asked) or error, then [DONE].
  bool finish(const std::optional<result<serving::outcome>>& end) {
    if (!openai) {
      // Ollama: the last line carries done, its reason and the counts; an error is a line of
      // its own.
      serving::outcome none;
      const bool ok_end = end->has_value() || stopped;
      const auto& out = end->has_value() ? **end : none;
      const std::string line =
          ok_end ? ndjson(ollama_final(r, out, "", stopped ? "stop" : finish_reason(out.stop),
                                       rfc3339_now()))
                 : ndjson(ollama_error(error_of(end->error(), r.kind)));
      if (!write(line)) return false;
      sink.done();
      return true;
    }
    if (*end) {
      const auto& out = **end;
      json last = chunk(r, "", false, stopped ? "stop" : finish_reason(out.stop), created);
      last["tessera"] = tessera_extension(out);
      if (!write(sse(last))) return false;
      if (r.include_usage &&
          !write(sse(usage_chunk(r, out.prompt_tokens,
                                 static_cast<std::uint32_t>(out.tokens.size()), created))))
        return false;
    } else if (stopped) {
      // The text already ended at its stop sequence; how the stream then closed is moot.
      if (!write(sse(chunk(r, "", false, "stop", created)))) return false;
    } else if (!write(sse(error_of(end->error(), r.kind).to_json()))) {
      return false;
    }
    if (!write(std::string(sse_done))) return false;
    sink.done();
    return true;
  }
};

/// The `n` > 1 streams of one answer written out together (gateway::impl::write_choices): each
/// choice's chunks with its index as they come, held back as a single stream's are, each with its
/// own finish; usage (if asked) once all ended.
struct choices_writer {
  choices_writer(gateway::impl& gw, std::vector<std::shared_ptr<relay>>& relays_,
                 const std::vector<api_request>& choices_, httplib::DataSink& sink_)
      : g(gw), relays(relays_), choices(choices_), sink(sink_), st(choices_.size()) {}

  gateway::impl& g;
  std::vector<std::shared_ptr<relay>>& relays;
  const std::vector<api_request>& choices;
  httplib::DataSink& sink;
  const std::int64_t created = unix_now();
  const api_request& r0 = choices[0];
  struct state {
    std::string carry;  // bytes held back: an unfinished UTF-8 character, a stop's beginning
    std::vector<serving::token_logprob> pending_lp;
    std::size_t text_offset = 0;
    std::string last_node;
    bool stopped = false;
    bool ended = false;
    std::uint32_t tokens = 0;
    std::uint32_t prompt_tokens = 0;
  };
  std::vector<state> st;

  void cancel_all() {
    for (auto& rl : relays)
      rl->cancel = true;
  }

  bool write(const std::string& e) {
    if (sink.write(e.data(), e.size())) return true;
    cancel_all();
    std::lock_guard lock(g.mu);
    ++g.counters.disconnects;
    return false;
  }

  bool piece(std::size_t i, std::string_view text, const std::string& node) {
    json j = chunk(choices[i], text, false, "", created, st[i].pending_lp, st[i].text_offset);
    if (!node.empty()) j["tessera"] = {{"node", node}};
    st[i].pending_lp.clear();
    st[i].text_offset += text.size();
    return write(sse(j));
  }

  /// The whole answer; false when it was cut (the client went away, the gateway stopped).
  bool run() {
    if (r0.kind == api_kind::chat)
      for (const auto& c : choices)
        if (!write(sse(chunk(c, "", true, "", created)))) return false;
    for (std::size_t left = choices.size(); left > 0;) {
      bool any = false;
      for (std::size_t i = 0; i < choices.size(); ++i) {
        if (st[i].ended) continue;
        relay& rl = *relays[i];
        std::deque<relay::piece> pieces;
        std::optional<result<serving::outcome>> end;
        {
          std::lock_guard lock(rl.mu);
          pieces.swap(rl.pieces);
          if (rl.end) end = std::move(rl.end);
        }
        any = any || !pieces.empty() || end.has_value();
        for (auto& p : pieces) {
          if (st[i].stopped) break;
          if (!take(i, p)) return false;
        }
        if (!end) continue;
        --left;
        if (const auto done = end_choice(i, end)) return *done;
      }
      if (left == 0) break;
      if (g.stopping) {
        cancel_all();
        return false;  // closes the connection: the client sees the stream cut
      }
      if (!any) wait_for_any();
    }
    if (r0.include_usage) {
      std::uint32_t completion = 0;
      for (const auto& c : st)
        completion += c.tokens;
      if (!write(sse(usage_chunk(r0, st[0].prompt_tokens, completion, created)))) return false;
    }
    if (!write(std::string(sse_done))) return false;
    sink.done();
    return true;
  }

  /// One token of choice `i` into its carry, and what of the carry can go out now; false when the
  /// write failed.
  bool take(std::size_t i, relay::piece& p) {
    relay& rl = *relays[i];
    const auto& r = choices[i];
    ++st[i].tokens;
    if (p.logprob) st[i].pending_lp.push_back(std::move(*p.logprob));
    std::string node;
    if (p.node != st[i].last_node) node = st[i].last_node = p.node;
    st[i].carry += p.text;
    std::size_t n = utf8_complete_prefix(st[i].carry);
    if (!r.stop.empty()) {
      if (const auto at = find_stop(st[i].carry, r.stop); at != std::string_view::npos) {
        st[i].carry.resize(at);
        st[i].stopped = true;
        rl.stop = true;
        n = st[i].carry.size();
      } else {
        n = std::min(n, st[i].carry.size() - stop_holdback(st[i].carry, r.stop));
      }
    }
    if (n == 0) return true;
    if (!piece(i, std::string_view(st[i].carry).substr(0, n), node)) return false;
    st[i].carry.erase(0, n);
    return true;
  }

  /// Choice `i` ended: its held text and its finish (or error) written; true or false when the
  /// whole answer ends here (false: the write failed), nullopt when the others go on.
  std::optional<bool> end_choice(std::size_t i,
                                 const std::optional<result<serving::outcome>>& end) {
    const auto& r = choices[i];
    if (!st[i].carry.empty() && !piece(i, st[i].carry, "")) return false;
    st[i].carry.clear();
    st[i].ended = true;
    {
      std::lock_guard lock(g.mu);
      g.counters.streamed_tokens += st[i].tokens;
    }
    if (*end) {
      const auto& out = **end;
      st[i].prompt_tokens = out.prompt_tokens;
      st[i].tokens = static_cast<std::uint32_t>(out.tokens.size());
      json last = chunk(r, "", false, st[i].stopped ? "stop" : finish_reason(out.stop), created);
      last["tessera"] = tessera_extension(out);
      if (!write(sse(last))) return false;
    } else if (st[i].stopped) {
      if (!write(sse(chunk(r, "", false, "stop", created)))) return false;
    } else {
      // One choice failed past every resumption: the whole answer ends with its error.
      cancel_all();
      if (!write(sse(error_of(end->error(), r.kind).to_json()))) return false;
      if (!write(std::string(sse_done))) return false;
      sink.done();
      return true;
    }
    return std::nullopt;
  }

  // Nothing new from any choice: wait on the first that is still running.
  void wait_for_any() {
    for (std::size_t i = 0; i < choices.size(); ++i) {
      if (st[i].ended) continue;
      std::unique_lock lock(relays[i]->mu);
      relays[i]->cv.wait_for(lock, std::chrono::milliseconds(20), [&] {
        return !relays[i]->pieces.empty() || relays[i]->end.has_value() || g.stopping;
      });
      break;
    }
  }
};

}  // namespace

/// Starts the thread that runs `r`'s stream into a relay.
std::shared_ptr<relay> gateway::impl::start_relay(std::shared_ptr<const api_request> r) {
  auto rl = std::make_shared<relay>();
  auto co = client_options();
  rl->worker = std::thread([rl, r, co] {
    name_this_thread("http-relay");
    auto c = serving::client::connect(co);
    result<serving::outcome> out =
        c ? (*c)->ask(
                r->request,
                [&](const serving::token_event& t) {
                  std::lock_guard lock(rl->mu);
                  rl->pieces.push_back(
                      {std::string(t.text),
                       t.logprob != nullptr ? std::optional(*t.logprob) : std::nullopt,
                       std::string(t.node)});
                  ++rl->tokens;
                  rl->cv.notify_all();
                },
                &rl->cancel, &rl->stop)
          : result<serving::outcome>(c.error());
    std::lock_guard lock(rl->mu);
    rl->end.emplace(std::move(out));
    rl->cv.notify_all();
  });
  return rl;
}

// Waits for the relay's first token (or its end, or the gateway stopping) before the status line
// goes out: a request that fails before streaming anything gets its HTTP status, as the
// non-streaming API would. Returns that error, if so.
std::optional<api_error> gateway::impl::error_before_first_token(gateway_detail::relay& rl,
                                                                 api_kind kind) {
  std::unique_lock lock(rl.mu);
  while (rl.tokens == 0 && !rl.end && !stopping)
    rl.cv.wait_for(lock, std::chrono::milliseconds(100));
  if (rl.end && !*rl.end) return error_of(rl.end->error(), kind);
  return std::nullopt;
}

void gateway::impl::stream(const std::shared_ptr<api_request>& r, httplib::Response& res) {
  auto rl = start_relay(r);
  if (const auto e = error_before_first_token(*rl, r->kind)) {
    rl->join();
    in_flight.fetch_sub(1);
    return send_error(res, *e, r->dialect);
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // a proxy in front must not hold the tokens back
  res.set_chunked_content_provider(
      r->dialect == api_dialect::openai ? "text/event-stream" : "application/x-ndjson",
      [this, rl, r](std::size_t, httplib::DataSink& sink) { return write_stream(*rl, *r, sink); },
      [this, rl](bool) {
        rl->join();
        in_flight.fetch_sub(1);
      });
}

bool gateway::impl::write_stream(relay& rl, const api_request& r, httplib::DataSink& sink) {
  stream_writer w(*this, rl, r, sink);
  return w.run();
}

/// `n` > 1, streamed (OpenAI's API): one relay per choice, their chunks interleaved as they
/// come, each with its choice's index and its own finish; usage (if asked) once all ended.
void gateway::impl::stream_choices(const std::shared_ptr<api_request>& r, httplib::Response& res) {
  auto relays = std::make_shared<std::vector<std::shared_ptr<relay>>>();
  auto choices = std::make_shared<std::vector<api_request>>();
  for (std::uint32_t i = 0; i < r->n; ++i) {
    choices->push_back(choice_request(*r, i));
    relays->push_back(start_relay(std::make_shared<const api_request>(choices->back())));
  }
  const auto join_all = [relays] {
    for (auto& rl : *relays)
      rl->join();
  };
  // As stream(): an error before any token gets its HTTP status.
  for (auto& rl : *relays) {
    if (const auto e = error_before_first_token(*rl, r->kind)) {
      join_all();
      in_flight.fetch_sub(1);
      return send_error(res, *e, r->dialect);
    }
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, relays, choices](std::size_t, httplib::DataSink& sink) {
        return write_choices(*relays, *choices, sink);
      },
      [this, join_all](bool) {
        join_all();
        in_flight.fetch_sub(1);
      });
}

bool gateway::impl::write_choices(std::vector<std::shared_ptr<relay>>& relays,
                                  const std::vector<api_request>& choices,
                                  httplib::DataSink& sink) {
  choices_writer w(*this, relays, choices, sink);
  return w.run();
}

}  // namespace tessera::mesh::http
