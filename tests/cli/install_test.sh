#!/usr/bin/env bash
# `cmake --install` into a staging root (DESTDIR): the binary runs, the systemd unit starts the
# installed binary as a node, and the man page holds every subcommand's options.
# Usage: install_test.sh BUILD_DIR
set -u
BUILD=${1:?usage: install_test.sh BUILD_DIR}
ROOT=$(mktemp -d /tmp/tessera-install.XXXXXX) || exit 1
trap 'rm -rf "$ROOT"' EXIT
FAILED=0
check() {
  local what=$1
  shift
  if "$@"; then echo "  [ok] $what"; else echo "  [FAILED] $what"; FAILED=1; fi
}

DESTDIR="$ROOT" cmake --install "$BUILD" >"$ROOT.log" 2>&1 \
  || { echo "cmake --install failed:"; cat "$ROOT.log"; rm -f "$ROOT.log"; exit 1; }
rm -f "$ROOT.log"
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
bin="$ROOT$prefix/bin/tessera"
unit=$(find "$ROOT" -name tessera.service | head -n 1)
man=$(find "$ROOT" -name tessera.1 | head -n 1)

check "the binary is installed and runs" "$bin" --version
check "the systemd unit is installed under lib/systemd/system" test -n "$unit" -a -f "$unit"
check "the unit starts the installed binary as a node" \
  grep -q "^ExecStart=$prefix/bin/tessera node --config /etc/tessera/tessera.toml" "$unit"
check "the unit leaves gracefully on SIGTERM" grep -q "^KillSignal=SIGTERM" "$unit"
# The issue's bar for the unit's sandboxing: systemd's own rating at most 3.0 ("OK"). The unit
# runs under its own user with the filesystem, kernel, devices and system calls fenced off.
rated_ok() { systemd-analyze security --offline=yes --threshold=30 "$unit" >/dev/null 2>&1; }
if command -v systemd-analyze >/dev/null 2>&1; then
  check "systemd-analyze security rates the unit at most 3.0 ($(systemd-analyze security --offline=yes "$unit" 2>&1 | sed -n 's/.*exposure level for tessera.service: //p'))" \
    rated_ok
fi
example=$(find "$ROOT" -path "*doc/tessera/examples/tessera.toml" | head -n 1)
check "an example tessera.toml is installed" test -n "$example" -a -f "$example"
reads_back() { env -i "$bin" node --config "$example" --print-config --json >/dev/null; }
check "the example configuration is one the node reads" reads_back
check "the man page is installed in man1" test -n "$man" -a -f "$man"
for cmd in node ask status run bench model fault keygen demo; do
  check "the man page documents 'tessera $cmd'" grep -q "^\.SS \"tessera $cmd\"" "$man"
done
check "the man page keeps the description's em dash (UTF-8, no ???)" grep -q "^tessera — pool several machines" "$man"
no_build_path() { ! grep -q "^Usage: /" "$man"; }
check "the man page's usage lines say 'tessera', not the build machine's path" no_build_path
check "the man page carries the options' help (--http-api-key-file)" grep -q "http\\\\-api\\\\-key\\\\-file\|http-api-key-file" "$man"
exit $FAILED
