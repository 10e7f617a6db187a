#!/usr/bin/env bash
# `tessera node`'s own log settings and its environment, as a user sets them:
#   - --log-format json: every stderr line is one JSON object, even with a data dir named q"d;
#   - TESSERA_LOG_LEVEL=warn: no info lines;
#   - TESSERA_CLUSTER_KEY=@FILE without --cluster-key: the node takes the secret from it, and an
#     exported TESSERA_CLIENT_KEY (for `tessera ask`) does not stop it;
#   - run as an ordinary user without --data-dir: its state goes to ~/.local/share/tessera;
#   - `tessera --log-format json run`: the summary is JSON lines too.
#   node_settings_test.sh TESSERA_BINARY
set -uo pipefail
T=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$T" keygen -o "$work/key" >/dev/null 2>&1
FAILED=0
run_node() {  # run_node DATA_DIR ARGS...: 2 s of a node's stderr
  local dir=$1
  shift
  timeout -s TERM 2 "$T" node --data-dir "$dir" --no-mdns --no-beacon --listen 127.0.0.1 \
    --control-port 19600 --bulk-port 19601 --client-request-port 19602 \
    --client-response-port 19603 --http-port 19604 "$@" 2>&1 >/dev/null
}
out=$(run_node "$work/q\"d" --cluster-key "$work/key" --log-format json)
echo "$out" | /usr/bin/python3 -c '
import json, sys
lines = [l for l in sys.stdin.read().splitlines() if l]
assert lines, "no output"
for l in lines:
    json.loads(l)
assert any("listening on" in json.loads(l)["msg"] for l in lines), lines' \
  || { echo "--log-format json: not one JSON object per line:"; echo "$out"; FAILED=1; }
out=$(TESSERA_LOG_LEVEL=warn run_node "$work/n2" --cluster-key "$work/key")
if grep -q " I \[" <<<"$out" || ! grep -q "listening on" <<<"$out"; then
  echo "TESSERA_LOG_LEVEL=warn: info lines shown, or the node did not start:"
  echo "$out"
  FAILED=1
fi
out=$(TESSERA_CLUSTER_KEY="@$work/key" TESSERA_CLIENT_KEY=whatever run_node "$work/n3")
grep -q "listening on" <<<"$out" || { echo "TESSERA_CLUSTER_KEY=@file: the node did not start:"; echo "$out"; FAILED=1; }
# `tessera --log-format json run`: its summary on stderr is JSON lines too.
"$T" model synth --dim 64 --layers 1 --heads 2 --kv-heads 1 --ffn 128 --vocab 512 --type f16 \
  -o "$work/m.gguf" >/dev/null
out=$("$T" --log-format json run "$work/m.gguf" -p "hi" -n 2 2>&1 >/dev/null)
echo "$out" | /usr/bin/python3 -c '
import json, sys
lines = [l for l in sys.stdin.read().splitlines() if l]
assert lines and all(json.loads(l) for l in lines)
assert any("decode:" in json.loads(l)["msg"] for l in lines)' \
  || { echo "tessera --log-format json run: stderr is not JSON lines:"; echo "$out"; FAILED=1; }
# Not root: without --data-dir the node keeps its state in ~/.local/share/tessera (XDG), which it
# can create, not in /var/lib/tessera, which it cannot.
# (Skipped where nobody cannot reach the binary, e.g. a checkout under a 0700 home.)
if command -v setpriv >/dev/null && [[ $(id -u) == 0 ]] &&
   setpriv --reuid=nobody --regid=nogroup --clear-groups test -x "$T"; then
  home="$work/home"
  mkdir -p "$home" && chown nobody "$home" && chmod 755 "$work"
  cp "$work/key" "$home/key" && chown nobody "$home/key"
  out=$(setpriv --reuid=nobody --regid=nogroup --clear-groups env -i HOME="$home" PATH=/usr/bin:/bin \
        timeout -s TERM 2 "$T" node --cluster-key "$home/key" --no-mdns --no-beacon \
        --listen 127.0.0.1 --control-port 19600 --bulk-port 19601 --client-request-port 19602 \
        --client-response-port 19603 --http-port 19604 2>&1 >/dev/null)
  if ! grep -q "listening on" <<<"$out" || [[ ! -f "$home/.local/share/tessera/election.state" ]]; then
    echo "a node run as nobody did not start in ~/.local/share/tessera:"
    echo "$out"
    FAILED=1
  fi
fi
[[ $FAILED == 0 ]] && echo "node_settings_test: json lines, log level from the environment, the secret from TESSERA_CLUSTER_KEY"
exit $FAILED
