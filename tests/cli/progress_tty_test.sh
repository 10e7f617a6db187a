#!/usr/bin/env bash
# `tessera node` on a terminal draws progress bars for long work: fetching a model's bytes from a
# peer (--fetch-models) and loading its weights for a replica. Two peers on loopback: one with the
# model file, one without it, the latter on a pseudo-terminal made by script(1); the test reads
# what that terminal received and looks for both bars, each ending at 100 %.
#   progress_tty_test.sh TESSERA_BINARY
set -euo pipefail
tessera=$1
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$tessera" keygen -o "$work/key" >/dev/null 2>&1
"$tessera" model synth --preset tiny --type q8_0 -o "$work/tiny.gguf" >/dev/null 2>&1
node() {  # node INDEX PEER_INDEX ARGS...
  local i=$1 j=$2; shift 2
  local p=$((17700 + 10 * i)) q=$((17700 + 10 * j))
  echo "$tessera" node --cluster-key "$work/key" --data-dir "$work/n$i" --listen 127.0.0.1 \
    --control-port $p --bulk-port $((p + 1)) --client-request-port $((p + 2)) \
    --client-response-port $((p + 3)) --http-port $((p + 4)) --no-mdns --no-beacon --threads 1 \
    --seed 127.0.0.1:$q "$@"
}
$(node 0 1 --model "$work/tiny.gguf") >"$work/n0.log" 2>&1 &
pids+=($!)
# script -f flushes what the terminal gets as it comes; -e passes the exit status on.
script -qfec "$(node 1 0 --fetch-models)" "$work/tty.txt" >/dev/null 2>&1 &
pids+=($!)
fetched=0 loaded=0
for _ in $(seq 600); do
  text=$( { tr '\r' '\n' <"$work/tty.txt"; } 2>/dev/null || true)
  grep -q 'fetching model tiny .*100%' <<<"$text" && fetched=1
  grep -q 'loading model tiny .*100%' <<<"$text" && loaded=1
  [[ $fetched == 1 && $loaded == 1 ]] && break
  sleep 0.1
done
if [[ $fetched != 1 || $loaded != 1 ]]; then
  echo "progress_tty_test: fetch bar $fetched, load bar $loaded; the terminal got:" >&2
  tr '\r' '\n' <"$work/tty.txt" | tail -20 >&2
  echo "--- holder log:" >&2
  tail -20 "$work/n0.log" >&2
  exit 1
fi
# Off a terminal, no bar: the holder's log has no carriage returns.
if grep -q $'\r' "$work/n0.log"; then
  echo "progress_tty_test: a bar was drawn into a log file" >&2
  exit 1
fi
echo "progress_tty_test: both bars drawn on the terminal, none in the log"
