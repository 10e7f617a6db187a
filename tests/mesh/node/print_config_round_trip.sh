#!/usr/bin/env bash
# `tessera node --print-config` (TOML) read back with --config gives the same configuration as
# the flags that made it (compared as --print-config --json), and carries each key's help.
set -euo pipefail
T=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(--control-port 9123 --seed a:1 --seed b:2 --model /m/x.gguf --data-dir "$work/q\"d"
       --threads 3 --no-mdns --log-level debug)
env -i "$T" node "${flags[@]}" --print-config >"$work/c.toml"
env -i "$T" node "${flags[@]}" --print-config --json >"$work/a.json"
env -i "$T" node --config "$work/c.toml" --print-config --json >"$work/b.json"
diff "$work/a.json" "$work/b.json" || { echo "the TOML does not read back to the same config"; cat "$work/c.toml"; exit 1; }
grep -q '^# file holding the cluster secret (--cluster-key)$' "$work/c.toml" \
  || { echo "the TOML lacks the keys' help"; exit 1; }
grep -q '^\[listen\]$' "$work/c.toml" || { echo "no [listen] table"; exit 1; }
echo "print_config_round_trip: TOML with help, read back identically"
