// The official OpenAI JavaScript client (npm `openai`), pointed at a Tessera peer as any
// application would: base URL and key, nothing Tessera-specific. Checks what docs/HTTP.md says
// works, and that what is refused comes back as the client's own typed errors.
//   node openai_js_check.mjs BASE_URL KEY MODEL PROMPT REFERENCE_TEXT [TOOL_MODEL]
// REFERENCE_TEXT: `tessera run`'s greedy completion of PROMPT (its first space dropped, see
// run_example.sh). TOOL_MODEL: a model whose chat template writes tool calls (Qwen's
// <tool_call>), for the tool-call checks. Prints one line per check; exits 1 when any failed.
import OpenAI from "openai";

const [baseURL, apiKey, model, prompt, reference, toolModel] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });
let failed = false;
const check = (what, ok, detail = "") => {
  console.log(`  [${ok ? "ok" : "FAILED"}] openai (JS): ${what}${detail ? ` (${detail})` : ""}`);
  if (!ok) failed = true;
};
const sameText = (got, ref) => got === ref || got === ` ${ref}`;
const n = 12;

try {
  // Models.
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  check("models.list names the model", models.includes(model), models.join(","));
  const one = await client.models.retrieve(model);
  check("models.retrieve returns it", one.id === model, one.id);

  // A greedy completion equals `tessera run`'s.
  const c = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0 });
  check("completions.create: tessera run's text", sameText(c.choices[0].text, reference),
        JSON.stringify(c.choices[0].text));
  check("completions.create: usage", c.usage.completion_tokens === n && c.usage.prompt_tokens > 0,
        JSON.stringify(c.usage));

  // Chat, then the same streamed with usage: the same text.
  const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello" }];
  const chat = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 10, temperature: 0, seed: 7 });
  const text = chat.choices[0].message.content;
  check("chat.completions.create answers", typeof text === "string" && text.length > 0 &&
        chat.choices[0].message.role === "assistant", JSON.stringify(text));
  const stream = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 10, temperature: 0, seed: 7, stream: true,
    stream_options: { include_usage: true } });
  let streamed = "", usage = null, finish = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      streamed += ch.delta?.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  check("a streamed chat gives the same text", streamed === text, JSON.stringify(streamed));
  check("the stream ends with a finish reason and usage",
        finish !== null && usage && usage.completion_tokens === chat.usage.completion_tokens,
        `${finish} ${JSON.stringify(usage)} in ${chunks} chunks`);

  // A stop sequence: the answer is the reference cut before it, finish_reason "stop".
  const full = c.choices[0].text;
  const cut = full.trim().split(/\s+/)[1] ?? "";
  if (cut.length > 0) {
    const s = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0,
                                                stop: [cut] });
    const want = full.slice(0, full.indexOf(cut));
    check("a stop sequence cuts the text before it",
          s.choices[0].finish_reason === "stop" && s.choices[0].text === want,
          `${JSON.stringify(cut)} -> ${JSON.stringify(s.choices[0].text)}`);
  }

  // Log-probabilities on a chat answer: one entry per token, each with its alternatives.
  const lp = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = lp.choices[0].logprobs?.content ?? [];
  check("logprobs: one entry per token with 2 alternatives",
        content.length === lp.usage.completion_tokens &&
        content.every((t) => typeof t.logprob === "number" && t.top_logprobs.length === 2),
        `${content.length} entries`);

  // JSON mode: the answer is a JSON object (whole when the model ended it, else its beginning).
  const jm = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 24, response_format: { type: "json_object" } });
  const jt = jm.choices[0].message.content;
  const jf = jm.choices[0].finish_reason;
  let whole = jf !== "stop";
  if (jf === "stop") { try { whole = typeof JSON.parse(jt) === "object"; } catch { whole = false; } }
  check("response_format json_object: the answer is a JSON object (or its beginning, cut at max_tokens)",
        jt.trimStart().startsWith("{") && whole && (jf === "stop" || jf === "length"),
        `${jf} ${JSON.stringify(jt.slice(0, 40))}`);

  // Structured output: with a JSON schema whose every part is bounded, the answer ends by itself
  // and satisfies it (validated here by hand, as a client would).
  const schema = {
    type: "object",
    properties: {
      ok: { type: "boolean" },
      level: { type: "integer", minimum: 1, maximum: 5 },
      color: { enum: ["red", "green", "blue"] },
      tags: { type: "array", items: { type: "string", maxLength: 3 }, maxItems: 2 },
    },
    required: ["ok", "level", "color", "tags"],
    additionalProperties: false,
  };
  const js = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 512,
    response_format: { type: "json_schema", json_schema: { name: "answer", strict: true, schema } } });
  const st = js.choices[0].message.content;
  let sv = null;
  try { sv = JSON.parse(st); } catch { sv = null; }
  const validates = sv !== null && typeof sv === "object" && !Array.isArray(sv) &&
    Object.keys(sv).sort().join(",") === "color,level,ok,tags" && typeof sv.ok === "boolean" &&
    Number.isInteger(sv.level) && sv.level >= 1 && sv.level <= 5 &&
    ["red", "green", "blue"].includes(sv.color) && Array.isArray(sv.tags) && sv.tags.length <= 2 &&
    sv.tags.every((t) => typeof t === "string" && [...t].length <= 3);
  check("response_format json_schema: the answer parses and validates against the schema",
        js.choices[0].finish_reason === "stop" && validates, JSON.stringify(st.slice(0, 80)));

  // n = 2: two choices in one reply (greedy: both the reference text), and streamed: chunks of
  // both indices, each ending with its own finish_reason.
  const two = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0, n: 2 });
  check("n = 2: two choices, each the reference text",
        two.choices.length === 2 && two.choices.every((c, i) => c.index === i && c.text === full),
        two.choices.map((c) => JSON.stringify(c.text.slice(0, 20))).join(" "));
  const texts = ["", ""];
  const finishes = [null, null];
  const st2 = await client.chat.completions.create({ model, messages: msgs, max_tokens: 8, n: 2,
                                                      stream: true, seed: 5 });
  for await (const c of st2)
    for (const ch of c.choices) {
      texts[ch.index] += ch.delta?.content ?? "";
      if (ch.finish_reason) finishes[ch.index] = ch.finish_reason;
    }
  check("n = 2 streamed: both choices stream and finish",
        finishes.every((f) => f === "length" || f === "stop") && texts.every((t) => t.length > 0),
        `${finishes.join(",")} ${texts.map((t) => t.length).join(",")}`);

  // Tool calls, forced (the synthetic model would not choose one by itself): streamed, the
  // call arrives as tool_calls deltas that the client assembles into a call of the named
  // function with arguments that follow its parameters; "required" calls one of the tools.
  if (toolModel) {
    const tools = [
      { type: "function", function: { name: "get_weather", description: "The weather in a city.",
        parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 } },
                      required: ["city"], additionalProperties: false } } },
      { type: "function", function: { name: "get_time", description: "The time now.",
        parameters: { type: "object", properties: {}, additionalProperties: false } } },
    ];
    const ask = [{ role: "user", content: "What is the weather in Paris?" }];
    const ts = await client.chat.completions.create({
      model: toolModel, messages: ask, tools, max_tokens: 256, temperature: 0, stream: true,
      tool_choice: { type: "function", function: { name: "get_weather" } } });
    const calls = [];
    let tfinish = null, tdeltas = 0, tcontent = "";
    for await (const chunk of ts)
      for (const ch of chunk.choices) {
        tcontent += ch.delta?.content ?? "";
        for (const d of ch.delta?.tool_calls ?? []) {
          tdeltas++;
          const c = (calls[d.index] ??= { id: "", name: "", arguments: "" });
          c.id += d.id ?? "";
          c.name += d.function?.name ?? "";
          c.arguments += d.function?.arguments ?? "";
        }
        if (ch.finish_reason) tfinish = ch.finish_reason;
      }
    let targs = null;
    try { targs = JSON.parse(calls[0]?.arguments ?? ""); } catch { targs = null; }
    check("tool_choice naming a function, streamed: tool_calls deltas make one call of it",
          tfinish === "tool_calls" && tdeltas > 0 && calls.length === 1 && calls[0].id !== "" &&
          calls[0].name === "get_weather" && targs !== null && typeof targs.city === "string" &&
          Object.keys(targs).join(",") === "city" && [...targs.city].length <= 12 &&
          tcontent === "",
          `${tfinish}, ${tdeltas} deltas, ${JSON.stringify(calls).slice(0, 120)}`);
    const req = await client.chat.completions.create({
      model: toolModel, messages: ask, tools, tool_choice: "required", max_tokens: 256, seed: 3 });
    const rc = req.choices[0].message.tool_calls ?? [];
    let rargs = null;
    try { rargs = JSON.parse(rc[0]?.function?.arguments ?? ""); } catch { rargs = null; }
    check("tool_choice \"required\": the answer is a call of one of the tools",
          req.choices[0].finish_reason === "tool_calls" && rc.length === 1 &&
          ["get_weather", "get_time"].includes(rc[0].function.name) && rargs !== null &&
          typeof rargs === "object" && !Array.isArray(rargs),
          JSON.stringify(rc).slice(0, 120));
    try {
      await client.chat.completions.create({
        model: toolModel, messages: ask, tools, max_tokens: 8,
        tool_choice: { type: "function", function: { name: "get_date" } } });
      check("a forced call of a function not in tools is refused", false, "answered");
    } catch (e) {
      check("a forced call of a function not in tools: BadRequestError naming tool_choice",
            e instanceof OpenAI.BadRequestError && e.param === "tool_choice", `${e.status} ${e.param}`);
    }
  }

  // What is refused is the client's typed error, naming the problem.
  try {
    await client.chat.completions.create({ model: "no-such-model", messages: msgs });
    check("an unknown model is refused", false, "answered");
  } catch (e) {
    check("an unknown model: NotFoundError with code model_not_found",
          e instanceof OpenAI.NotFoundError && e.code === "model_not_found", `${e.status} ${e.code}`);
  }
  try {
    await client.chat.completions.create({ model, messages: msgs, n: 9 });
    check("n = 9 is refused", false, "answered");
  } catch (e) {
    check("n = 9 (more than 8): BadRequestError naming the parameter",
          e instanceof OpenAI.BadRequestError && e.param === "n", `${e.status} ${e.param}`);
  }
  try {
    const bad = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "sk-wrong", maxRetries: 0 });
    await bad.models.list();
    check("a wrong key is refused", false, "answered");
  } catch (e) {
    check("a wrong key: AuthenticationError", e instanceof OpenAI.AuthenticationError, `${e.status}`);
  }
} catch (e) {
  check("the client ran without an unexpected error", false, e.stack?.split("\n")[0] ?? String(e));
}
process.exit(failed ? 1 : 0);
