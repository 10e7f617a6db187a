#!/usr/bin/env bash
# Exit codes (docs: README "Commands"): 0 success, 1 failure, 2 usage — an unknown command, option
# or value — each with a message that names what was wrong.
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
exit $FAILED
