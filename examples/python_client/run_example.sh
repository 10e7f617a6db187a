#!/usr/bin/env bash
# Runs examples/python_client/ask.py against a real 3-peer cluster on loopback and checks it:
#   - greedy tokens through the cluster equal `tessera run` on the same model, prompt and count;
#   - given ONE peer, ask.py learns the others from its peer list: 4 concurrent requests (distinct
#     ids, which the plan spreads over the 3 replicas) all complete with those tokens, and at least
#     2 different peers serve them;
#   - an unknown model ends in exit status 1 with the error code "unknown_model";
#   - a peer started with --client-auth serves ask.py given the client access key, and not without.
# Usage: run_example.sh TESSERA_BINARY [BASE_PORT (default 27400)]
# Peer i uses ports BASE+10i .. BASE+10i+4 (control, bulk, client request, client response, http);
# peer 3 is a cluster of its own (the client authentication check).
# Exit status: 0 when every check passed, 1 otherwise, 2 on bad arguments.
set -u

TESSERA=${1:-}
BASE=${2:-27400}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ASK="$HERE/ask.py"
PROMPT="Once upon a time"
N=16
MODEL=tiny

if [[ -z "$TESSERA" || ! -x "$TESSERA" ]]; then
  echo "usage: $0 TESSERA_BINARY [BASE_PORT]  (got '${TESSERA}': not an executable)" >&2
  exit 2
fi
if ! [[ "$BASE" =~ ^[0-9]+$ ]] || (( BASE < 1024 || BASE > 65000 )); then
  echo "$0: base port '$BASE' must be a number in 1024..65000" >&2
  exit 2
fi

# A python3 that has pyzmq and msgpack (Debian's python3-zmq, python3-msgpack): $PYTHON, the
# python3 on PATH, or Debian's own (a python3 earlier on PATH may lack the Debian packages).
PY=""
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import zmq, msgpack" 2>/dev/null; then
    PY=$cand
    break
  fi
done
if [[ -z "$PY" ]]; then
  echo "$0: no python3 with the modules zmq and msgpack (apt-get install python3-zmq python3-msgpack)" >&2
  exit 1
fi

DIR=$(mktemp -d /tmp/tessera-pyclient.XXXXXX) || exit 1
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if [[ "${KEEP_DIR:-0}" == 1 ]]; then echo "kept $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

FAILED=0
check() {  # check DESCRIPTION COMMAND...: runs the command, prints [ok] or [FAILED]
  local what=$1
  shift
  if "$@"; then
    echo "  [ok] $what"
  else
    echo "  [FAILED] $what"
    FAILED=1
  fi
}

# Ports: move the block by 100 while some port of it is taken (another test may hold it).
ports_free() {
  "$PY" - "$1" <<'EOF'
import socket, sys
base = int(sys.argv[1])
for i in range(4):
    for k in range(5):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
        try:
            s.bind(("127.0.0.1", base + 10 * i + k))
        except OSError:
            sys.exit(1)
        finally:
            s.close()
EOF
}
for _ in $(seq 20); do
  ports_free "$BASE" && break
  BASE=$((BASE + 100))
done
P0=$BASE
P1=$((BASE + 10))
P2=$((BASE + 20))
P3=$((BASE + 30))  # a second, one-peer cluster that requires client authentication

echo "python client example: $DIR, ports $P0.., $P1.., $P2.., python $PY"
"$TESSERA" model synth --preset tiny --type q8_0 -o "$DIR/$MODEL.gguf" >"$DIR/synth.log" 2>&1 \
  || { echo "model synth failed:"; cat "$DIR/synth.log"; exit 1; }
"$TESSERA" keygen -o "$DIR/cluster.key" >"$DIR/keygen.log" 2>&1 \
  || { echo "keygen failed:"; cat "$DIR/keygen.log"; exit 1; }

start_node() {  # start_node I PORT OTHER_PORT [KEY [EXTRA...]]
  local i=$1 p=$2 other=$3 key=${4:-$DIR/cluster.key}
  shift 4 2>/dev/null || shift $#
  "$TESSERA" node --cluster-key "$key" --data-dir "$DIR/node$i" \
    --listen 127.0.0.1 --control-port "$p" --bulk-port $((p + 1)) \
    --client-request-port $((p + 2)) --client-response-port $((p + 3)) --http-port $((p + 4)) \
    --no-mdns --no-beacon --threads 1 --model "$DIR/$MODEL.gguf" --seed "127.0.0.1:$other" \
    "$@" >"$DIR/node$i.log" 2>&1 &
  PIDS+=($!)
}
start_node 0 "$P0" "$P1"
start_node 1 "$P1" "$P0"
start_node 2 "$P2" "$P0"

# Ready: the node's status shows a plan in which model "tiny" has serving groups.
plan_ready() {  # plan_ready CONTROL_PORT [CLUSTER_KEY]
  "$TESSERA" status --json --cluster-key "${2:-$DIR/cluster.key}" --connect "127.0.0.1:$1" \
    --timeout-ms 1000 2>/dev/null | "$PY" -c '
import json, sys
try:
    plan = json.load(sys.stdin).get("plan")
    ok = any(m.get("name") == sys.argv[1] and m.get("groups") for m in (plan or {}).get("models", []))
except Exception:
    ok = False
sys.exit(0 if ok else 1)' "$MODEL"
}
ready=0
t_end=$((SECONDS + 60))
while (( SECONDS < t_end )); do
  if plan_ready "$P0" && plan_ready "$P1" && plan_ready "$P2"; then ready=1; break; fi
  for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "a node exited early:"; tail -n 20 "$DIR"/node*.log; exit 1; }
  done
  sleep 0.5
done
if (( ! ready )); then
  echo "  [FAILED] no plan serving '$MODEL' within 60 s"
  tail -n 20 "$DIR"/node*.log
  exit 1
fi
echo "  [ok] the 3 peers hold a plan serving '$MODEL'"

PEERS=(--peer "127.0.0.1:$((P0 + 2)):$((P0 + 3))" --peer "127.0.0.1:$((P1 + 2)):$((P1 + 3))"
       --peer "127.0.0.1:$((P2 + 2)):$((P2 + 3))")

# 1. Greedy tokens through the cluster = greedy tokens of a local run.
"$PY" "$ASK" "$PROMPT" --model "$MODEL" "${PEERS[@]}" --max-tokens "$N" --temperature 0 \
  --json --timeout 60 >"$DIR/ask.json" 2>"$DIR/ask.err"
ask_rc=$?
"$TESSERA" run "$DIR/$MODEL.gguf" -p "$PROMPT" -n "$N" --temp 0 --json >"$DIR/run.json" \
  2>"$DIR/run.err"
run_rc=$?
check "ask.py exits 0 (got $ask_rc)" test "$ask_rc" -eq 0
check "tessera run exits 0 (got $run_rc)" test "$run_rc" -eq 0
same_tokens() {
  "$PY" - "$DIR/ask.json" "$DIR/run.json" <<'EOF'
import json, sys
try:
    ask = json.load(open(sys.argv[1]))
    run = json.load(open(sys.argv[2]))
except Exception as e:
    print(f"    cannot read the outputs: {e}")
    sys.exit(1)
print(f"    ask.py:      {ask.get('tokens')} stop={ask.get('stop')} attempts={ask.get('attempts')} nodes={[n[:12] for n in ask.get('nodes', [])]}")
print(f"    tessera run: {run.get('tokens')}")
ok = ask.get("ok") is True and bool(ask.get("tokens")) and ask.get("tokens") == run.get("tokens")
sys.exit(0 if ok else 1)
EOF
}
check "the cluster's greedy tokens equal tessera run's" same_tokens
[[ -s "$DIR/ask.err" ]] && sed 's/^/    ask.py stderr: /' "$DIR/ask.err"

# 2. Streaming mode prints text and exits 0.
"$PY" "$ASK" "$PROMPT" --model "$MODEL" "${PEERS[@]}" --max-tokens 8 --seed 7 --timeout 60 \
  >"$DIR/stream.out" 2>"$DIR/stream.err"
stream_rc=$?
check "streaming ask.py exits 0 and prints text (got $stream_rc)" \
  test "$stream_rc" -eq 0 -a -s "$DIR/stream.out"

# 3. An unknown model: exactly one explicit error, exit status 1, naming the code.
"$PY" "$ASK" "$PROMPT" --model no-such-model "${PEERS[@]}" --max-tokens 4 --timeout 30 \
  >"$DIR/unknown.out" 2>"$DIR/unknown.err"
unknown_rc=$?
check "an unknown model exits 1 (got $unknown_rc)" test "$unknown_rc" -eq 1
check "its error names unknown_model" grep -q "unknown_model" "$DIR/unknown.err"
sed 's/^/    /' "$DIR/unknown.err"

# 4. One peer given: ask.py learns the other two from its peer list. 4 requests at once (4 ids,
# spread by the plan over the 3 replicas); each must end with the greedy tokens of `tessera run`.
ONE=(--peer "127.0.0.1:$((P1 + 2))")  # host:request_port (the response port is the next one)
one_ask() {  # one_ask K: request K through the one peer, into $DIR/one-K.json
  "$PY" "$ASK" "$PROMPT" --model "$MODEL" "${ONE[@]}" --max-tokens "$N" --temperature 0 \
    --json --timeout 60 >"$DIR/one-$1.json" 2>"$DIR/one-$1.err"
}
ONE_PIDS=()
for k in 1 2 3 4; do
  one_ask "$k" &
  ONE_PIDS+=($!)
done
one_rc=0
for pid in "${ONE_PIDS[@]}"; do wait "$pid" || one_rc=$?; done
check "4 concurrent requests through one peer exit 0 (last failure: $one_rc)" test "$one_rc" -eq 0
# Distinct ids and run's tokens; writes the number of peers that served them.
one_check() {  # one_check FILES...
  "$PY" - "$DIR/run.json" "$DIR/servers" "$@" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
ids, servers, ok = set(), set(), True
for f in sys.argv[3:]:
    try:
        a = json.load(open(f))
    except Exception as e:
        print(f"    {f}: cannot read: {e}")
        ok = False
        continue
    if a.get("ok") is not True or a.get("tokens") != run.get("tokens"):
        print(f"    {f}: ok={a.get('ok')} code={a.get('code')} tokens={a.get('tokens')}")
        ok = False
        continue
    ids.add(str(a.get("id")))
    server = (a.get("nodes") or ["?"])[-1]
    servers.add(server)
    # A request the given peer serves may end before its peer list arrives (it comes at once
    # or within 2 s); one that another peer serves cannot.
    print(f"    {f.rsplit('/', 1)[-1]}: served by {server[:12]}, "
          f"{len(a.get('peers', []))} peers connected")
if ok and len(ids) != len(sys.argv) - 3:
    print(f"    the ids are not distinct: {sorted(ids)}")
    ok = False
print(f"    {len(sys.argv) - 3} requests, served by {len(servers)} peers: {sorted(s[:12] for s in servers)}")
with open(sys.argv[2], "w") as out:
    out.write(str(len(servers)))
sys.exit(0 if ok else 1)
EOF
}
check "they have distinct ids and the tokens of tessera run" \
  one_check "$DIR"/one-[1-4].json
servers() { cat "$DIR/servers" 2>/dev/null || echo 0; }
# Rendezvous hashing over 3 replicas puts 4 ids on one replica with probability 1/27: then up to
# 8 more requests (one at a time) are asked until 2 replicas have served.
for k in 5 6 7 8 9 10 11 12; do
  (( FAILED || $(servers) >= 2 )) && break
  one_ask "$k" || break
  one_check "$DIR"/one-*.json
done
check "at least 2 different peers served the requests given one peer (so the peer list worked)" \
  test "$(servers)" -ge 2
for f in "$DIR"/one-*.err; do [[ -s "$f" ]] && sed 's/^/    ask.py stderr: /' "$f"; done

# 5. Bad arguments exit 2.
"$PY" "$ASK" "$PROMPT" --model "$MODEL" --max-tokens 0 >/dev/null 2>&1
bad_rc=$?
check "bad arguments exit 2 (got $bad_rc)" test "$bad_rc" -eq 2

# 6. Client authentication: a peer started with --client-auth serves ask.py given the cluster's
# client access key (`tessera keygen --client-key`), and nothing without it.
"$TESSERA" keygen -o "$DIR/auth-cluster.key" >"$DIR/keygen-auth.log" 2>&1 \
  && "$TESSERA" keygen --client-key "$DIR/client.key" --cluster-key "$DIR/auth-cluster.key" \
       >>"$DIR/keygen-auth.log" 2>&1
check "tessera keygen --client-key writes the access key" test -s "$DIR/client.key"
start_node 3 "$P3" "$P3" "$DIR/auth-cluster.key" --client-auth
t_end=$((SECONDS + 60))
until plan_ready "$P3" "$DIR/auth-cluster.key" || (( SECONDS >= t_end )); do sleep 0.5; done
AUTH_PEER=(--peer "127.0.0.1:$((P3 + 2))")
"$PY" "$ASK" "$PROMPT" --model "$MODEL" "${AUTH_PEER[@]}" --max-tokens "$N" --temperature 0 \
  --json --timeout 60 --client-key "$DIR/client.key" >"$DIR/auth.json" 2>"$DIR/auth.err"
auth_rc=$?
check "ask.py with the client key exits 0 (got $auth_rc)" test "$auth_rc" -eq 0
auth_tokens() {
  "$PY" - "$DIR/auth.json" "$DIR/run.json" <<'EOF'
import json, sys
try:
    a, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
except Exception as e:
    print(f"    cannot read the outputs: {e}")
    sys.exit(1)
sys.exit(0 if a.get("ok") is True and a.get("tokens") == r.get("tokens") else 1)
EOF
}
check "through client authentication, the greedy tokens equal tessera run's" auth_tokens
"$PY" "$ASK" "$PROMPT" --model "$MODEL" "${AUTH_PEER[@]}" --max-tokens 4 --json --timeout 3 \
  >"$DIR/noauth.json" 2>"$DIR/noauth.err"
noauth_rc=$?
check "ask.py without the key gets nothing: exit 1 (got $noauth_rc)" test "$noauth_rc" -eq 1
check "its error is a timeout" grep -q '"code": "timeout"' "$DIR/noauth.json"
auth_status() {
  "$TESSERA" status --json --cluster-key "$DIR/auth-cluster.key" --connect "127.0.0.1:$P3" \
    --timeout-ms 2000 2>/dev/null | "$PY" -c '
import json, sys
a = json.load(sys.stdin)["serving"]["client_auth"]
print(f"    client_auth: {a}")
sys.exit(0 if a["required"] and a["admitted"] >= 1 else 1)'
}
check "the peer reports client authentication required and the keyed client admitted" auth_status

if (( FAILED )); then
  echo "python client example: FAILED (logs in $DIR kept)"
  KEEP_DIR=1
  for f in "$DIR"/node*.log; do echo "--- $f"; tail -n 15 "$f"; done
  exit 1
fi
echo "python client example: all checks passed"
exit 0
