#!/usr/bin/env bash
# `tessera demo --serve`: after its checks the demo keeps its peers serving, prints how to reach
# them, and answers the HTTP API and `tessera ask` there until SIGINT; then its peers leave the
# mesh cleanly and it exits 0.
#   demo_serve_test.sh TESSERA_BINARY
set -uo pipefail
T=$1
work=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
BASE=18600
"$T" demo --serve --peers 2 --base-port $BASE >"$work/demo.out" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "serving until Ctrl-C" "$work/demo.out" && break
  kill -0 "$pid" 2>/dev/null || { echo "the demo exited before serving:"; cat "$work/demo.out"; exit 1; }
  sleep 0.1
done
grep -q "serving until Ctrl-C" "$work/demo.out" || { echo "no 'serving until Ctrl-C':"; cat "$work/demo.out"; exit 1; }
MODEL=$(sed -n 's/.*tessera ask -m \([^ ]*\) .*/\1/p' "$work/demo.out" | head -1)
FAILED=0
curl -sf "http://127.0.0.1:$((BASE + 4))/v1/chat/completions" \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"In the beginning\"}],\"max_tokens\":8}" \
  | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["usage"]["completion_tokens"] > 0, d' \
  || { echo "the HTTP API of the serving demo did not answer"; FAILED=1; }
"$T" ask -m "$MODEL" --peer "127.0.0.1:$((BASE + 12))" -n 8 "And God said" >"$work/ask.out" 2>&1 \
  || { echo "tessera ask against the serving demo failed:"; cat "$work/ask.out"; FAILED=1; }
kill -INT "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
wait "$pid"
rc=$?
pid=
if [[ $rc -ne 0 ]] || ! grep -q "demo: all checks passed" "$work/demo.out"; then
  echo "the demo exited $rc after SIGINT:"
  cat "$work/demo.out"
  FAILED=1
fi
[[ $FAILED == 0 ]] && echo "demo_serve_test: served HTTP and tessera ask until SIGINT, then shut down cleanly"
exit $FAILED
