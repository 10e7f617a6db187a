#!/usr/bin/env bash
# Exit codes (docs: README "Commands"): 0 success, 1 failure, 2 usage — an unknown command, option
# or value — each with a message that names what was wrong. And with --log-format json, every
# stderr line is one JSON object, a quote in the message included.
T=$1
FAILED=0
expect() {  # expect CODE TEXT -- ARGS...: exit status CODE, TEXT somewhere in stderr
  local want=$1 text=$2
  shift 3
  local err rc
  err=$("$T" "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -ne $want || "$err" != *"$text"* ]]; then
    echo "tessera $*: exit $rc (want $want), stderr: $err (want: $text)"
    FAILED=1
  fi
}
expect 2 "unknown command 'frobnicate'" -- frobnicate
expect 2 "" -- ask --no-such-flag hi
expect 2 "" -- node --control-port notaport
expect 2 "subcommand" --
expect 0 "" -- --help
expect 0 "" -- node --help
expect 0 "" -- --version
expect 1 "No such file" -- model info /nonexistent/model.gguf
json_lines() {  # json_lines ARGS...: every stderr line parses as a JSON object with a msg
  "$T" --log-format json "$@" 2>&1 >/dev/null | /usr/bin/python3 -c '
import json, sys
lines = sys.stdin.read().splitlines()
ok = bool(lines) and all(isinstance(json.loads(l), dict) and "msg" in json.loads(l) for l in lines)
sys.exit(0 if ok else 1)' || { echo "tessera --log-format json $*: stderr is not JSON lines"; FAILED=1; }
}
json_lines model info '/no"such\file.gguf'
json_lines keygen -o /nonexistent-dir/k.key
exit $FAILED
