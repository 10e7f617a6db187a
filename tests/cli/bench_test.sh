#!/usr/bin/env bash
# `tessera bench` on a small synthetic model (issue 35's options): --depth, --batch and --layout
# each give a row per combination with the figures they name, in one run; bad values are usage
# errors (exit 2) naming the option.
T=$1
set -u
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
FAILED=0
"$T" model synth --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 512 --context 128 \
    --type q8_0 -o "$DIR/m.gguf" >/dev/null || { echo "synth failed"; exit 1; }
out=$("$T" bench "$DIR/m.gguf" --pp 16 --tg 4 --reps 1 --depth 0,40 --batch 2 \
      --layout rows,panels,all --bandwidth-mib 4 --json) || { echo "bench failed: $out"; exit 1; }
echo "$out" | /usr/bin/python3 -c '
import json, sys
rows = json.load(sys.stdin)
assert len(rows) == 6, f"{len(rows)} rows, want 3 layouts x 2 depths"
seen = {(r["layout"], r["depth"]) for r in rows}
assert seen == {(l, d) for l in ("rows", "panels", "all") for d in (0, 40)}, seen
for r in rows:
    assert r["batch"] == 2 and r["tg_tok_per_s_median"] > 0 and r["pp_tok_per_s_median"] > 0, r
    assert r["peak_int8_gmacs"] > 0 and r["peak_f32_gmacs"] > 0, r
    assert 0 < r["pp_peak_fraction"] < 1.5, r
    assert r["prefill_macs_per_token"] > 0 and r["tg_gmacs"] > 0, r
' || FAILED=1
expect_usage() {  # expect_usage TEXT ARGS...: exit 2 with TEXT in stderr
  local text=$1
  shift
  local err rc
  err=$("$T" bench "$DIR/m.gguf" "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -ne 2 || "$err" != *"$text"* ]]; then
    echo "tessera bench $*: exit $rc (want 2), stderr: $err (want: $text)"
    FAILED=1
  fi
}
expect_usage "--layout" --layout bogus
expect_usage "--batch" --batch 0
expect_usage "--depth" --depth -5
exit $FAILED
