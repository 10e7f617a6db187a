#!/usr/bin/env bash
# The dashboard and the chat page in a real browser: starts a 3-peer cluster on loopback (API key
# on), installs playwright-core from npm once (into NPM_DIR), and runs browser/dashboard_check.mjs
# in Debian's headless Chromium: the page must draw the peers, links, leader and plan the nodes
# report, update live, and its screenshot must show the topology (kept as dashboard.png in NPM_DIR
# for a look). Then browser/chat_check.mjs: an answer, Stop, a failover (a peer is killed) and the
# dead peer on the dashboard (chat.png).
# Usage: dashboard_browser_test.sh TESSERA_BINARY NPM_DIR [BASE_PORT (default 27600)]
# Exit status: 0 when every check passed, 1 otherwise, 2 on bad arguments.
set -u

TESSERA=${1:-}
NPM_DIR=${2:-}
BASE=${3:-27600}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=tiny
KEY=sk-dashboard-test

if [[ -z "$TESSERA" || ! -x "$TESSERA" || -z "$NPM_DIR" ]]; then
  echo "usage: $0 TESSERA_BINARY NPM_DIR [BASE_PORT]" >&2
  exit 2
fi
for tool in node npm /usr/bin/chromium curl; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is missing (scripts/bootstrap installs it)" >&2; exit 1; }
done

# playwright-core (JavaScript only: it drives the Chromium that Debian installed, downloads none).
mkdir -p "$NPM_DIR"
cp "$HERE/browser/package.json" "$HERE/browser/common.mjs" "$HERE/browser/dashboard_check.mjs" \
  "$HERE/browser/chat_check.mjs" \
  "$NPM_DIR/"
if [[ ! -f "$NPM_DIR/node_modules/playwright-core/package.json" ]]; then
  (cd "$NPM_DIR" && npm install --no-audit --no-fund --loglevel=error >npm.log 2>&1) \
    || { echo "npm install playwright-core failed:"; cat "$NPM_DIR/npm.log"; exit 1; }
fi

DIR=$(mktemp -d /tmp/tessera-dashboard.XXXXXX) || exit 1
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if [[ "${KEEP_DIR:-0}" == 1 ]]; then echo "kept $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

port_free() { ! (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
block_free() {
  local i k
  for i in 0 1 2; do for k in 0 1 2 3 4; do port_free $(($1 + 10 * i + k)) || return 1; done; done
}
for _ in $(seq 20); do block_free "$BASE" && break; BASE=$((BASE + 100)); done

"$TESSERA" model synth --preset tiny --type q8_0 -o "$DIR/$MODEL.gguf" >"$DIR/synth.log" 2>&1 \
  || { echo "model synth failed:"; cat "$DIR/synth.log"; exit 1; }
"$TESSERA" keygen -o "$DIR/cluster.key" >/dev/null 2>&1 || { echo "keygen failed"; exit 1; }
(umask 077 && echo "$KEY" >"$DIR/api.key")
for i in 0 1 2; do
  p=$((BASE + 10 * i))
  seeds=()
  for j in 0 1 2; do ((j != i)) && seeds+=(--seed "127.0.0.1:$((BASE + 10 * j))"); done
  "$TESSERA" node --cluster-key "$DIR/cluster.key" --data-dir "$DIR/node$i" --listen 127.0.0.1 \
    --control-port "$p" --bulk-port $((p + 1)) --client-request-port $((p + 2)) \
    --client-response-port $((p + 3)) --http-port $((p + 4)) --http-api-key-file "$DIR/api.key" \
    --no-mdns --no-beacon --threads 1 --model "$DIR/$MODEL.gguf" "${seeds[@]}" \
    >"$DIR/node$i.log" 2>&1 &
  PIDS+=($!)
done
H0="http://127.0.0.1:$((BASE + 4))"
H2="http://127.0.0.1:$((BASE + 24))"

# Ready: node 0 reports 3 peers, every directed link measured, and a plan with 3 groups.
leader=""
t_end=$((SECONDS + 90))
while (( SECONDS < t_end )); do
  leader=$(curl -sf -H "Authorization: Bearer $KEY" "$H0/status" | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
v, p = s.get("view") or {}, s.get("plan") or {}
ok = (len(v.get("members", [])) == 3 and len(v.get("links", [])) == 6
      and all(l.get("rtt_us") for l in v["links"])
      and any(len(m.get("groups", [])) == 3 for m in p.get("models", [])))
print(s["node"]["leader"] if ok and s["node"]["leader"] else "", end="")' 2>/dev/null)
  [[ -n "$leader" ]] && break
  sleep 0.5
done
if [[ -z "$leader" ]]; then
  echo "  [FAILED] the cluster did not converge within 90 s"
  tail -n 20 "$DIR"/node*.log
  exit 1
fi
echo "dashboard browser test: cluster up, leader $leader; driving Chromium"

# Runs browser/NAME_check.mjs with the arguments given; on a failure prints its summary and the
# nodes' logs, keeps the directory and exits 1.
run_check() {
  local name=$1
  shift
  if ! node "$NPM_DIR/${name}_check.mjs" "$@" >"$DIR/$name.json"; then
    echo "$name browser test: FAILED"
    cat "$DIR/$name.json"
    KEEP_DIR=1
    for f in "$DIR"/node*.log; do echo "--- $f"; tail -n 10 "$f"; done
    exit 1
  fi
  echo "$name browser test: all checks passed (screenshot $NPM_DIR/$name.png)"
}

# The page of node 2 (any peer's page shows the whole cluster); the completion goes to node 0.
run_check dashboard "$H2" "$KEY" "$leader" 3 "$NPM_DIR/dashboard.png" "$H0" "$MODEL"
# The chat page of node 2: an answer, Stop, a failover when the serving peer (never node 2) is
# killed, and the dashboard showing that peer down.
run_check chat "$H2" "$KEY" "$MODEL" "$NPM_DIR/chat.png"
exit 0
