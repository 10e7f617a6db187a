#!/usr/bin/env bash
# Runs the OpenAI-compatible HTTP API of a real 2-peer cluster on loopback and checks it with curl
# and with openai_chat.py (a client written from the published API, Python standard library only):
#   - greedy text from /v1/completions (curl, no streaming) equals `tessera run`'s text;
#   - the same request streamed with curl -N: server-sent events, then data: [DONE];
#   - openai_chat.py streams a chat answer and a completion (equal to `tessera run` again), through
#     the OTHER peer's gateway;
#   - without the API key: 401; an unknown model: 404 with code model_not_found;
#   - the official OpenAI JavaScript client (npm `openai`): models, completions, chat (streamed with
#     usage), stop, logprobs, JSON output, n = 2, forced tool calls (streamed as tool_calls
#     deltas, on a model with Qwen's template), and its typed errors for an unknown model, n = 9,
#     a function not in tools and a wrong key;
#   - GET /v1/models lists the model and /metrics counts the requests.
# Usage: run_example.sh TESSERA_BINARY [BASE_PORT (default 27500)]
# Peer i uses ports BASE+10i .. BASE+10i+4 (control, bulk, client request, client response, http).
# Exit status: 0 when every check passed, 1 otherwise, 2 on bad arguments.
set -u

TESSERA=${1:-}
BASE=${2:-27500}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLIENT="$HERE/openai_chat.py"
PROMPT="Once upon a time"
N=12
MODEL=tiny
KEY=sk-example-key

if [[ -z "$TESSERA" || ! -x "$TESSERA" ]]; then
  echo "usage: $0 TESSERA_BINARY [BASE_PORT]  (got '${TESSERA}': not an executable)" >&2
  exit 2
fi
if ! [[ "$BASE" =~ ^[0-9]+$ ]] || (( BASE < 1024 || BASE > 65000 )); then
  echo "$0: base port '$BASE' must be a number in 1024..65000" >&2
  exit 2
fi
command -v curl >/dev/null || { echo "$0: curl is missing (apt-get install curl)" >&2; exit 1; }
PY=/usr/bin/python3
command -v "$PY" >/dev/null || PY=python3

DIR=$(mktemp -d /tmp/tessera-openai.XXXXXX) || exit 1
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if [[ "${KEEP_DIR:-0}" == 1 ]]; then echo "kept $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

FAILED=0
check() {  # check DESCRIPTION COMMAND...: runs the command, prints [ok] or [FAILED]
  local what=$1
  shift
  if "$@"; then echo "  [ok] $what"; else echo "  [FAILED] $what"; FAILED=1; fi
}

ports_free() {
  "$PY" - "$1" <<'PYEOF'
import socket, sys
base = int(sys.argv[1])
for i in range(2):
    for k in range(5):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", base + 10 * i + k))
        except OSError:
            sys.exit(1)
        finally:
            s.close()
PYEOF
}
for _ in $(seq 20); do
  ports_free "$BASE" && break
  BASE=$((BASE + 100))
done
P0=$BASE
P1=$((BASE + 10))
H0="http://127.0.0.1:$((P0 + 4))"
H1="http://127.0.0.1:$((P1 + 4))"

echo "OpenAI API example: $DIR, gateways $H0 and $H1"
"$TESSERA" model synth --preset tiny --type q8_0 -o "$DIR/$MODEL.gguf" >"$DIR/synth.log" 2>&1 \
  || { echo "model synth failed:"; cat "$DIR/synth.log"; exit 1; }
# A second model whose chat template writes tool calls (Qwen 2.5's published template), for the
# JavaScript client's tool-call checks.
TOOL_MODEL=qt
TEMPLATE="$HERE/../../tests/inference/tokenizer/chat_templates/qwen2.5-7b-instruct.jinja"
"$TESSERA" model synth --preset tiny --arch qwen3 --type q8_0 --chat-template "$TEMPLATE" \
  -o "$DIR/$TOOL_MODEL.gguf" >"$DIR/synth-qt.log" 2>&1 \
  || { echo "model synth of the tool model failed:"; cat "$DIR/synth-qt.log"; exit 1; }
"$TESSERA" keygen -o "$DIR/cluster.key" >"$DIR/keygen.log" 2>&1 \
  || { echo "keygen failed:"; cat "$DIR/keygen.log"; exit 1; }
(umask 077 && echo "$KEY" >"$DIR/api.key")  # a key others can read is refused

start_node() {  # start_node I PORT OTHER_PORT
  local i=$1 p=$2 other=$3
  "$TESSERA" node --cluster-key "$DIR/cluster.key" --data-dir "$DIR/node$i" \
    --listen 127.0.0.1 --control-port "$p" --bulk-port $((p + 1)) \
    --client-request-port $((p + 2)) --client-response-port $((p + 3)) --http-port $((p + 4)) \
    --http-api-key-file "$DIR/api.key" \
    --no-mdns --no-beacon --threads 1 --model "$DIR/$MODEL.gguf" --model "$DIR/$TOOL_MODEL.gguf" \
    --seed "127.0.0.1:$other" \
    >"$DIR/node$i.log" 2>&1 &
  PIDS+=($!)
}
start_node 0 "$P0" "$P1"
start_node 1 "$P1" "$P0"

AUTH=(-H "Authorization: Bearer $KEY")
# Ready: both gateways list the model with a serving group on each peer.
ready() {
  curl -sf "${AUTH[@]}" "$1/v1/models" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if all(any(m["id"] == name and m.get("groups") == 2 for m in d["data"])
                  for name in sys.argv[1:]) else 1)' "$MODEL" "$TOOL_MODEL"
}
ok=0
t_end=$((SECONDS + 60))
while (( SECONDS < t_end )); do
  if ready "$H0" 2>/dev/null && ready "$H1" 2>/dev/null; then ok=1; break; fi
  for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "a node exited early:"; tail -n 20 "$DIR"/node*.log; exit 1; }
  done
  sleep 0.5
done
(( ok )) || { echo "  [FAILED] /v1/models never listed '$MODEL' on both peers"; tail -n 20 "$DIR"/node*.log; exit 1; }
echo "  [ok] both gateways list '$MODEL' and '$TOOL_MODEL', each served by 2 groups"

"$TESSERA" run "$DIR/$MODEL.gguf" -p "$PROMPT" -n "$N" --temp 0 --json >"$DIR/run.json" 2>"$DIR/run.err"
REF=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"], end="")' "$DIR/run.json")
# The API returns every token's bytes as they are; `tessera run` prints its completion on a line of
# its own and drops the one space a SentencePiece model's first token starts with (docs/PROTOCOL.md,
# `text`). So the API's text is tessera run's, or tessera run's after that space.
same_text() { [[ "$1" == "$2" || "$1" == " $2" ]]; }
BODY="{\"model\":\"$MODEL\",\"prompt\":\"$PROMPT\",\"max_tokens\":$N,\"temperature\":0}"

# 1. curl, no streaming.
curl -s "${AUTH[@]}" "$H0/v1/completions" -d "$BODY" >"$DIR/curl.json"
text_of() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"], end="")' "$1"; }
check "curl /v1/completions returns the text of tessera run" same_text "$(text_of "$DIR/curl.json")" "$REF"

# 2. curl, streaming: events, each a chunk, then [DONE].
curl -sN "${AUTH[@]}" "$H0/v1/completions" -d "${BODY%\}},\"stream\":true}" >"$DIR/curl.sse"
streamed=$("$PY" - "$DIR/curl.sse" <<'PYEOF'
import json, sys
text, done = "", False
for block in open(sys.argv[1], encoding="utf-8").read().split("\n\n"):
    if not block:
        continue
    assert block.startswith("data: "), block
    data = block[6:]
    if data == "[DONE]":
        done = True
        continue
    text += "".join(c.get("text", "") for c in json.loads(data)["choices"])
print(text if done else "<no [DONE]>", end="")
PYEOF
)
check "curl -N streams the same text as server-sent events ending in [DONE]" same_text "$streamed" "$REF"

# 3. The Python client through the other peer: a streamed completion and a streamed chat.
"$PY" "$CLIENT" --url "$H1" --key "$KEY" --model "$MODEL" --completion --temperature 0 \
  --max-tokens "$N" --json "$PROMPT" >"$DIR/py.json" 2>"$DIR/py.err"
py_text=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"], end="")' "$DIR/py.json" 2>/dev/null)
check "openai_chat.py streams the completion tessera run computes" same_text "$py_text" "$REF"
"$PY" "$CLIENT" --url "$H1" --key "$KEY" --model "$MODEL" --max-tokens 8 --seed 3 "Hello" \
  >"$DIR/chat.out" 2>"$DIR/chat.err"
chat_rc=$?
check "openai_chat.py streams a chat answer (exit $chat_rc)" test "$chat_rc" -eq 0 -a -s "$DIR/chat.out"

# 3b. The official OpenAI JavaScript client from npm (installed once into $NPM_DIR), as an
#     application would use it. Skipped where there is no node/npm.
NPM_DIR=${NPM_DIR:-/tmp/tessera-npm-openai}
if command -v node >/dev/null && command -v npm >/dev/null; then
  mkdir -p "$NPM_DIR"
  if [[ ! -f "$NPM_DIR/node_modules/openai/package.json" ]]; then
    printf '{"name":"tessera-openai-js-check","private":true,"type":"module","dependencies":{"openai":"6.49.0"}}\n' \
      >"$NPM_DIR/package.json"
    (cd "$NPM_DIR" && npm install --no-audit --no-fund --loglevel=error >npm.log 2>&1) \
      || { echo "  [FAILED] npm install openai:"; cat "$NPM_DIR/npm.log"; FAILED=1; }
  fi
  cp "$HERE/openai_js_check.mjs" "$NPM_DIR/"
  node "$NPM_DIR/openai_js_check.mjs" "$H0" "$KEY" "$MODEL" "$PROMPT" "$REF" "$TOOL_MODEL" || FAILED=1
fi

# 4. Refusals.
code=$(curl -s -o "$DIR/noauth.json" -w '%{http_code}' "$H0/v1/completions" -d "$BODY")
check "no API key: HTTP 401 (got $code)" test "$code" = 401
"$PY" "$CLIENT" --url "$H0" --key "$KEY" --model no-such-model "x" >/dev/null 2>"$DIR/unknown.err"
unknown_rc=$?
check "an unknown model: exit 1 with model_not_found (got $unknown_rc)" \
  grep -q "HTTP 404.*model_not_found" "$DIR/unknown.err"
sed 's/^/    /' "$DIR/unknown.err"

# 5. Metrics count what happened.
sleep 0.5
curl -s "${AUTH[@]}" "$H0/metrics" >"$DIR/metrics.txt"
check "/metrics counts /v1/completions answered 200" \
  grep -q '^tessera_http_requests_total{route="/v1/completions",code="200"} [1-9]' "$DIR/metrics.txt"
curl -s "${AUTH[@]}" "$H1/metrics" >"$DIR/metrics1.txt"
# Each peer exports what it served: summed over the two, the streams' first-token histograms
# count every completed request (4 above), and so do the streams completed.
first_tokens=$(cat "$DIR/metrics.txt" "$DIR/metrics1.txt" | awk -v m="$MODEL" '
  $1 == "tessera_time_to_first_token_seconds_count{model=\"" m "\"}" { n += $2 } END { print n + 0 }')
check "the peers' time-to-first-token histograms count the served streams ($first_tokens >= 4)" \
  test "$first_tokens" -ge 4
if command -v promtool >/dev/null; then
  promtool_ok() { promtool check metrics <"$1" >"$DIR/promtool.out" 2>&1; }
  check "promtool check metrics: peer 0's /metrics is clean" promtool_ok "$DIR/metrics.txt"
  check "promtool check metrics: peer 1's /metrics is clean" promtool_ok "$DIR/metrics1.txt"
fi

if (( FAILED )); then
  echo "OpenAI API example: FAILED (logs in $DIR kept)"
  KEEP_DIR=1
  for f in "$DIR"/node*.log; do echo "--- $f"; tail -n 15 "$f"; done
  exit 1
fi
echo "OpenAI API example: all checks passed"
exit 0
