// `tessera ask`: publishes a prompt to the cluster's peers and streams the answer, resuming on
// another peer when the serving one goes away (mesh/serving/client.hpp, docs/PROTOCOL.md).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "inference/tokenizer/json_schema.hpp"
#include "mesh/serving/client.hpp"

namespace tessera::cli {

namespace {

struct ask_args {
  std::string prompt;
  std::string model;
  std::vector<std::string> peers{"127.0.0.1:7402"};
  std::uint32_t max_tokens = 128;
  float temp = 0.8f;
  std::int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  std::uint64_t seed = 0;
  bool seed_given = false;
  bool chat = false;
  bool json = false;
  std::string format;  // "json_object" / "json_schema": constrained decoding
  std::string schema;  // with json_schema: the schema's JSON text, or @FILE
  std::string id;
  std::uint32_t timeout_s = 120;
  std::uint32_t wait_s = 3;  // for a first connection; 0: as long as --timeout
  std::uint32_t stall_ms = 3000;
  std::string client_key;  // client access key file (else TESSERA_CLIENT_KEY, else none)
};

int ask(const ask_args& a) {
  namespace sv = mesh::serving;
  const auto fail = [&](const std::string& why, int code) {
    if (a.json) {
      nlohmann::json j;
      j["ok"] = false;
      j["error"] = why;
      std::printf("%s\n", j.dump().c_str());
    }
    log::say(fmt::format("tessera ask: {}", why), true);
    return code;
  };
  sv::client_options co;
  for (const auto& p : a.peers) {
    auto e = sv::parse_peer(p);
    if (!e) return fail(e.error().message, 2);
    co.peers.push_back(*e);
  }
  co.deadline_ms = a.timeout_s * 1000;
  co.unreachable_ms = a.wait_s * 1000;
  co.stall_ms = a.stall_ms;
  {
    std::optional<std::string> file;
    if (!a.client_key.empty()) file = a.client_key;
    auto access = transport::control::load_client_access(file);
    if (!access) return fail(access.error().describe(), 2);
    co.access = std::move(*access);
  }
  std::random_device rd;
  sv::request r;
  if (a.id.empty()) {
    auto id = sv::random_request_id("ask-");
    if (!id) return fail(id.error().describe(), 1);
    r.id = std::move(*id);
  } else {
    r.id = a.id;
  }
  r.model = a.model;
  if (a.chat)
    r.messages.push_back({"user", a.prompt});
  else
    r.prompt = a.prompt;
  r.format = a.format;
  if (!a.schema.empty() && r.format.empty()) r.format = "json_schema";
  if (r.format == "json_schema") {
    if (a.schema.empty())
      return fail("--format json_schema needs --schema (JSON text or @FILE)", 2);
    r.schema = a.schema;
    if (a.schema.starts_with("@")) {
      std::ifstream in(a.schema.substr(1), std::ios::binary);
      if (!in) return fail(fmt::format("--schema: cannot read '{}'", a.schema.substr(1)), 2);
      r.schema.assign(std::istreambuf_iterator<char>(in), {});
    }
    // Refused here, naming the keyword, rather than by every peer.
    if (auto compiled = inference::tokenizer::json_schema::compile(r.schema); !compiled)
      return fail(fmt::format("--schema: {}", compiled.error().message), 2);
  } else if (!a.schema.empty()) {
    return fail("--schema goes with --format json_schema", 2);
  }
  r.max_tokens = a.max_tokens;
  r.temperature = a.temp;
  r.top_k = a.top_k;
  r.top_p = a.top_p;
  r.min_p = a.min_p;
  r.repeat_penalty = a.repeat_penalty;
  // A seed is always sent: a stream resumed on another peer must draw the same tokens.
  r.seed = a.seed_given ? a.seed : (static_cast<std::uint64_t>(rd()) << 32 | rd());
  if (auto v = sv::validate(r); !v) return fail(v.error().message, 2);
  auto c = sv::client::connect(co);
  if (!c) return fail(c.error().message, 2);
  auto out = (*c)->ask(r, [&](const sv::token_event& t) {
    if (a.json) return;
    std::fwrite(t.text.data(), 1, t.text.size(), stdout);
    std::fflush(stdout);
  });
  if (!out) return fail(out.error().describe(), 1);
  if (a.json) {
    nlohmann::json j;
    j["ok"] = true;
    j["id"] = r.id;
    j["model"] = r.model;
    j["text"] = out->text;
    j["tokens"] = out->tokens;
    j["stop"] = out->stop;
    j["prompt_tokens"] = out->prompt_tokens;
    j["nodes"] = out->nodes;
    j["attempts"] = out->attempts;
    j["first_token_s"] = out->first_token_s;
    j["total_s"] = out->total_s;
    j["longest_gap_s"] = out->longest_gap_s;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(
        stderr, "tessera ask: %zu tokens (%s) from %s in %.2f s, first token %.3f s%s\n",
        out->tokens.size(), out->stop.c_str(),
        out->nodes.empty() ? "?" : out->nodes.back().substr(0, 12).c_str(), out->total_s,
        out->first_token_s,
        out->attempts > 1 ? fmt::format(", resumed {} time(s)", out->attempts - 1).c_str() : "");
  }
  return 0;
}

}  // namespace

void register_ask(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("ask", "send a prompt to the cluster and stream the answer");
  auto a = std::make_shared<ask_args>();
  cmd->add_option("prompt", a->prompt, "the prompt")->required();
  cmd->add_option("-m,--model", a->model, "the model's name (its GGUF file name without .gguf)")
      ->required();
  cmd->add_option("--peer", a->peers,
                  "a peer's client endpoint, host:request_port[:response_port] (repeatable; "
                  "default 127.0.0.1:7402)");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "tokens to generate (default 128)")
      ->check(CLI::Range(1u, 4096u));
  cmd->add_option("--temp", a->temp, "temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", a->top_k, "keep the k most likely tokens; 0 = off (default 40)");
  cmd->add_option("--top-p", a->top_p, "nucleus threshold; 1 = off (default 0.95)");
  cmd->add_option("--min-p", a->min_p, "drop tokens below min-p x p(top); 0 = off (default 0.05)");
  cmd->add_option("--repeat-penalty", a->repeat_penalty, "penalty for recent tokens; 1 = off");
  auto* seed = cmd->add_option("--seed", a->seed, "random seed (default: a random one)");
  cmd->add_option("--id", a->id, "request id (default: a random one)");
  cmd->add_option("--timeout", a->timeout_s, "give up after this many seconds (default 120)")
      ->check(CLI::Range(1u, 86400u));
  cmd->add_option("--wait", a->wait_s,
                  "give up when no peer accepts a connection within this many seconds "
                  "(default 3; 0: keep trying until --timeout, e.g. while the peers start)")
      ->check(CLI::Range(0u, 86400u));
  cmd->add_option("--stall-ms", a->stall_ms,
                  "resume on another peer after this much silence (default 3000)")
      ->check(CLI::Range(100u, 600000u));
  cmd->add_option("--client-key", a->client_key,
                  "the cluster's client access key file, for peers started with --client-auth "
                  "(default: TESSERA_CLIENT_KEY; `tessera keygen --client-key FILE` writes one)");
  cmd->add_flag("--chat", a->chat, "send the prompt as a chat message (the model's template)");
  cmd->add_option(
         "--format", a->format,
         "json_object: the answer is one JSON object; json_schema: one JSON value that "
         "satisfies --schema (constrained decoding; docs/HTTP.md lists the keywords taken)")
      ->check(CLI::IsMember({"json_object", "json_schema"}));
  cmd->add_option("--schema", a->schema,
                  "with --format json_schema (implied): the JSON schema, as text or @FILE");
  cmd->add_flag("--json", a->json,
                "print one JSON object (text, tokens, peers, timings) at the end");
  cmd->callback([&exit_code, a, seed] {
    a->seed_given = seed->count() > 0;
    exit_code = ask(*a);
  });
}

}  // namespace tessera::cli
