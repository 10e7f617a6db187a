#!/usr/bin/env bash
# A model file's own Jinja chat template, end to end: a model written with Qwen2.5's published
# template (whose default system text "You are Qwen, created by Alibaba Cloud..." no built-in
# family adds) is served by 2 peers; a chat request through the HTTP API is billed the prompt
# tokens of that template's rendering, as `tessera model tokenize --chat` renders it, and the
# answer equals `tessera run --chat`'s (which renders with the same template).
#   chat_template_test.sh TESSERA_BINARY TEMPLATE.jinja
set -euo pipefail
T=$1
TEMPLATE=$2
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
PY=/usr/bin/python3
"$T" keygen -o "$work/key" >/dev/null 2>&1
"$T" model synth --arch qwen3 --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 --vocab 600 \
  --context 2048 --type f16 --chat-template "$TEMPLATE" -o "$work/qt.gguf" >/dev/null
[[ $("$T" model info "$work/qt.gguf" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["chat_template"])') == jinja ]] \
  || { echo "model info does not report the file's Jinja template"; exit 1; }
MSGS='[{"role":"user","content":"What is 2+2?"}]'
"$T" model tokenize --chat --json "$work/qt.gguf" "$MSGS" >"$work/tok.json"
read -r N HAS_SYSTEM < <("$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(len(d["ids"]), int(d["prompt"].startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud")))' "$work/tok.json")
[[ $HAS_SYSTEM == 1 ]] || { echo "the rendered prompt lacks the template's default system text"; cat "$work/tok.json"; exit 1; }

node() {  # node I OTHER
  local p=$((17900 + 10 * $1)) q=$((17900 + 10 * $2))
  "$T" node --cluster-key "$work/key" --data-dir "$work/n$1" --listen 127.0.0.1 \
    --control-port $p --bulk-port $((p + 1)) --client-request-port $((p + 2)) \
    --client-response-port $((p + 3)) --http-port $((p + 4)) --no-mdns --no-beacon --threads 1 \
    --seed 127.0.0.1:$q --model "$work/qt.gguf" >"$work/n$1.log" 2>&1 &
  pids+=($!)
}
node 0 1
node 1 0
H=http://127.0.0.1:17904
for _ in $(seq 300); do
  curl -sf "$H/v1/models" 2>/dev/null | "$PY" -c '
import json, sys
sys.exit(0 if any(m["id"] == "qt" and m.get("groups") == 2 for m in json.load(sys.stdin)["data"]) else 1)' \
    2>/dev/null && break
  sleep 0.2
done
curl -sf "$H/v1/chat/completions" \
  -d "{\"model\":\"qt\",\"messages\":$MSGS,\"max_tokens\":8,\"temperature\":0}" >"$work/chat.json" \
  || { echo "the chat request failed"; tail -5 "$work"/n*.log; exit 1; }
"$T" run "$work/qt.gguf" --chat -p "What is 2+2?" -n 8 --temp 0 --json >"$work/run.json" 2>/dev/null
"$PY" - "$work/chat.json" "$N" "$work/run.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
ref = json.load(open(sys.argv[3]))["text"]
assert d["usage"]["prompt_tokens"] == n, f"prompt_tokens {d['usage']['prompt_tokens']}, the template renders {n}"
assert d["usage"]["completion_tokens"] == 8, d["usage"]
text = d["choices"][0]["message"]["content"]
# tessera run drops the first token's leading space (docs/PROTOCOL.md, `text`).
assert text in (ref, " " + ref), f"API text {text!r}, tessera run {ref!r}"
print(f"chat_template_test: the API billed {n} prompt tokens (the file's template's rendering) "
      f"and answered {text!r}, as tessera run --chat does")
PYEOF

# Tools, an earlier call and its result reach the model through its template: the API bills the
# prompt tokens `tokenize --chat --tools` renders (the template's "# Tools" block, the call, the
# tool response), streamed or not, through the official client's shapes.
TOOLS='[{"type":"function","function":{"name":"get_weather","description":"Current weather.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
TMSGS='[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},{"role":"tool","tool_call_id":"call1","content":"21 C"},{"role":"user","content":"And Rome?"}]'
"$T" model tokenize --chat --json --tools "$TOOLS" "$work/qt.gguf" "$TMSGS" >"$work/ttok.json"
curl -sf "$H/v1/chat/completions" \
  -d "{\"model\":\"qt\",\"messages\":$TMSGS,\"tools\":$TOOLS,\"max_tokens\":6,\"temperature\":0}" \
  >"$work/tchat.json" || { echo "the chat request with tools failed"; exit 1; }
curl -sfN "$H/v1/chat/completions" \
  -d "{\"model\":\"qt\",\"messages\":$TMSGS,\"tools\":$TOOLS,\"max_tokens\":6,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
  >"$work/tchat.sse" || { echo "the streamed chat request with tools failed"; exit 1; }
"$PY" - "$work/ttok.json" "$work/tchat.json" "$work/tchat.sse" <<'PYEOF'
import json, sys
tok = json.load(open(sys.argv[1]))
d = json.load(open(sys.argv[2]))
n = len(tok["ids"])
assert "<tools>" in tok["prompt"] and "get_weather" in tok["prompt"], tok["prompt"][:300]
assert "<tool_response>\n21 C\n</tool_response>" in tok["prompt"], tok["prompt"]
assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in tok["prompt"], tok["prompt"]
assert d["usage"]["prompt_tokens"] == n, f"with tools: prompt_tokens {d['usage']['prompt_tokens']}, the template renders {n}"
msg = d["choices"][0]["message"]
assert msg["role"] == "assistant" and (msg.get("content") is not None or msg.get("tool_calls")), msg
usage = None
text = ""
for block in open(sys.argv[3]).read().split("\n\n"):
    if not block.startswith("data: ") or block == "data: [DONE]":
        continue
    c = json.loads(block[6:])
    if c.get("usage"):
        usage = c["usage"]
    for ch in c["choices"]:
        text += ch["delta"].get("content") or ""
assert usage and usage["prompt_tokens"] == n, usage
assert text == (msg.get("content") or ""), (text, msg)
print(f"chat_template_test: tools, a call and its result rendered by the template: {n} prompt "
      f"tokens billed, streamed and not")
PYEOF

# The same conversation through Ollama's /api/chat (its shapes: arguments as an object, no call
# ids): the same rendering, so the same prompt tokens.
OMSGS='[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},{"role":"tool","content":"21 C","tool_name":"get_weather"},{"role":"user","content":"And Rome?"}]'
curl -sf "http://127.0.0.1:17904/api/chat" \
  -d "{\"model\":\"qt\",\"messages\":$OMSGS,\"tools\":$TOOLS,\"stream\":false,\"options\":{\"num_predict\":6,\"temperature\":0}}" \
  >"$work/ochat.json" || { echo "Ollama's /api/chat with tools failed"; exit 1; }
"$PY" - "$work/ttok.json" "$work/ochat.json" <<'PYEOF'
import json, sys
n = len(json.load(open(sys.argv[1]))["ids"])
d = json.load(open(sys.argv[2]))
assert d["done"] and d["prompt_eval_count"] == n, f"Ollama: prompt_eval_count {d.get('prompt_eval_count')}, the template renders {n}"
print(f"chat_template_test: Ollama's /api/chat with tools billed the same {n} prompt tokens")
PYEOF
