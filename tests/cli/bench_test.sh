#!/usr/bin/env bash
# `tessera bench` on a small synthetic model (issue 35's options): --depth, --batch, --layout and
# --kv-cache each give a row per combination with the figures they name, in one run; bad values
# are usage errors (exit 2) naming the option; a q8_0 KV cache for a model whose head_dim it
# cannot hold is an error naming head_dim (exit 1), in `tessera run` too.
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
# The q8_0 KV cache: heads of 32 (dim 128 / 4 heads).
"$T" model synth --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 512 --context 128 \
    --type q8_0 -o "$DIR/w.gguf" >/dev/null || { echo "synth failed"; exit 1; }
out=$("$T" bench "$DIR/w.gguf" --pp 16 --tg 4 --reps 1 --depth 0,40 --kv-cache f16,q8_0 \
      --bandwidth-mib 4 --json) || { echo "bench --kv-cache failed: $out"; exit 1; }
echo "$out" | /usr/bin/python3 -c '
import json, sys
rows = json.load(sys.stdin)
seen = {(r["kv_type"], r["depth"]) for r in rows}
assert seen == {(k, d) for k in ("f16", "q8_0") for d in (0, 40)}, seen
for r in rows:
    assert r["tg_tok_per_s_median"] > 0 and r["pp_tok_per_s_median"] > 0, r
' || FAILED=1
"$T" run "$DIR/w.gguf" -p "abc" -n 8 --temp 0 --kv-cache q8_0 >/dev/null 2>&1 || {
  echo "tessera run --kv-cache q8_0 failed"; FAILED=1; }
for cmd in "bench $DIR/m.gguf --pp 4 --tg 2 --reps 1 --bandwidth-mib 4" "run $DIR/m.gguf -p abc -n 2"; do
  # shellcheck disable=SC2086
  err=$("$T" $cmd --kv-cache q8_0 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -ne 1 || "$err" != *"head_dim"* ]]; then
    echo "tessera $cmd --kv-cache q8_0 (head_dim 16): exit $rc (want 1), stderr: $err"
    FAILED=1
  fi
done
expect_usage "--kv-cache" --kv-cache q4
expect_usage "--layout" --layout bogus
expect_usage "--batch" --batch 0
expect_usage "--depth" --depth -5
exit $FAILED
