#!/usr/bin/env python3
"""Ask a Tessera cluster for a completion over the client protocol (docs/PROTOCOL.md).

A stand-alone client written from docs/PROTOCOL.md alone, using only pyzmq and msgpack
(Debian: python3-zmq, python3-msgpack). It connects to the peers given with --peer (one is enough:
it subscribes to their peer lists and connects to every peer they name), publishes the request to
every peer it is connected to, streams the answer to stdout, and resumes the stream (same id,
attempt + 1, resume = the token ids received so far) when it stalls, skips an index, ends with a
wrong count or the peer reports "unavailable".

Exit status: 0 the stream ended with "done"; 1 an error (the peer's error code, or "timeout" when
the client gave up); 2 bad arguments.
"""

import argparse
import codecs
import json
import math
import os
import secrets
import sys
import time

try:
    import msgpack
    import zmq
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.stderr.write(f"ask.py: {e} (install python3-zmq and python3-msgpack)\n")
    sys.exit(2)

# docs/PROTOCOL.md, "Bounds" and "Timing".
PROTOCOL_VERSION = 1
REQUEST_TOPIC = b"req"
PEERS_TOPIC = b":peers"  # the peer list every peer publishes (kind "peers")
MAX_PEERS = 256  # endpoints a client connects to in all (given + learned); more are ignored
MAX_MODEL_BYTES = 256
MAX_PROMPT_BYTES = 64 * 1024
MAX_TOKENS_LIMIT = 4096
MAX_MESSAGE_BYTES = 256 * 1024
FIRST_REPUBLISH_S = 0.025  # the first re-publish; the interval doubles up to REPUBLISH_S
REPUBLISH_S = 0.5
STALL_S = 3.0  # silence after "accepted": resume
MAX_ATTEMPTS = 32  # attempts (1 + resumptions) before giving up
POLL_MS = 50


class AskError(Exception):
    """The request ended in an error: `code` is the protocol's error code (or "timeout")."""

    def __init__(self, code, message, node=""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.node = node


def read_client_key(path):
    """A client access key file (`tessera keygen --client-key FILE`; docs/PROTOCOL.md "Security"):
    lines "name z85-key"; returns (server_public, client_public, client_secret) as bytes."""
    keys = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, value = line.partition(" ")
            keys[name] = value.strip().encode()
    need = ("server-public", "client-public", "client-secret")
    missing = [k for k in need if len(keys.get(k, b"")) != 40]
    if missing:
        raise ValueError(f"{path}: not a client access key (missing or malformed: "
                         f"{', '.join(missing)})")
    return tuple(keys[k] for k in need)


def parse_peer(text):
    """host:request_port (the response port is the next one) or host:request_port:response_port."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"peer '{text}': expected host:request_port[:response_port]")
    ports = []
    for p in parts[1:]:
        if not p.isdigit() or not 0 < int(p) <= 65535:
            raise ValueError(f"peer '{text}': port '{p}' is not in 1..65535")
        ports.append(int(p))
    if len(ports) == 1:
        if ports[0] == 65535:
            raise ValueError(f"peer '{text}': no port after {ports[0]} for responses")
        ports.append(ports[0] + 1)
    return parts[0], ports[0], ports[1]


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Send a prompt to a Tessera cluster and stream the answer (docs/PROTOCOL.md).")
    ap.add_argument("prompt", help="the prompt (plain completion)")
    ap.add_argument("-m", "--model", required=True,
                    help="the model's name (its GGUF file name without .gguf)")
    ap.add_argument("--peer", action="append", default=[],
                    help="a peer's client endpoint, host:request_port[:response_port]; one is "
                         "enough, the others are learned from its peer list (repeatable; "
                         "default 127.0.0.1:7402)")
    ap.add_argument("-n", "--max-tokens", type=int, default=128,
                    help=f"tokens to generate, 1..{MAX_TOKENS_LIMIT} (default 128)")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="sampling temperature, <= 100; 0 = greedy (default 0.8)")
    ap.add_argument("--seed", type=int, default=None,
                    help="sampling seed, 0..2^64-1 (default: a random one)")
    ap.add_argument("--json", action="store_true",
                    help='print one JSON object {"ok", "id", "text", "tokens", "stop", '
                         '"prompt_tokens", "nodes", "attempts", "peers"} instead of streaming '
                         'the text')
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="give up after this many seconds (default 120)")
    ap.add_argument("--trace", action="store_true",
                    help="print every message sent and received to stderr")
    ap.add_argument("--client-key", default=os.environ.get("TESSERA_CLIENT_KEY") or None,
                    help="the cluster's client access key file, for peers started with "
                         "--client-auth (default: $TESSERA_CLIENT_KEY; none: plain connections)")
    a = ap.parse_args(argv)  # exits 2 on bad arguments

    a.curve = None
    if a.client_key:
        try:
            a.curve = read_client_key(a.client_key.removeprefix("@"))
        except (OSError, ValueError) as e:
            ap.error(f"--client-key: {e}")
        if not zmq.has("curve"):
            ap.error("--client-key: this pyzmq/libzmq has no CURVE support")

    if not a.peer:
        a.peer = ["127.0.0.1:7402"]
    try:
        a.peers = [parse_peer(p) for p in a.peer]
    except ValueError as e:
        ap.error(str(e))
    if not a.prompt.encode():
        ap.error("the prompt is empty")
    if len(a.prompt.encode()) > MAX_PROMPT_BYTES:
        ap.error(f"the prompt has {len(a.prompt.encode())} bytes, at most {MAX_PROMPT_BYTES}")
    if not 0 < len(a.model.encode()) <= MAX_MODEL_BYTES:
        ap.error(f"--model: must be 1..{MAX_MODEL_BYTES} bytes")
    if not 1 <= a.max_tokens <= MAX_TOKENS_LIMIT:
        ap.error(f"--max-tokens {a.max_tokens}: expected 1..{MAX_TOKENS_LIMIT}")
    if not math.isfinite(a.temperature) or a.temperature > 100:
        ap.error(f"--temperature {a.temperature}: expected a finite number <= 100")
    if a.seed is None:
        # Always send a seed: the peer that resumes a stream must draw what the lost one would.
        a.seed = secrets.randbits(64)
    elif not 0 <= a.seed < 2**64:
        ap.error(f"--seed {a.seed}: expected 0..2^64-1")
    if not (a.timeout > 0 and math.isfinite(a.timeout)):
        ap.error(f"--timeout {a.timeout}: expected a positive number of seconds")
    return a


class Client:
    """One request's life: publish, follow the stream, resume, until done or an error."""

    def __init__(self, peers, trace=False, curve=None):
        self.trace = trace
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.sub = self.ctx.socket(zmq.SUB)
        if curve is not None:
            # Client authentication: both sockets are CURVE clients of the peers' endpoints.
            server_public, client_public, client_secret = curve
            for sock in (self.pub, self.sub):
                sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
                sock.setsockopt(zmq.CURVE_PUBLICKEY, client_public)
                sock.setsockopt(zmq.CURVE_SECRETKEY, client_secret)
        self.pub.setsockopt(zmq.LINGER, 500)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        # Every peer publishes the client endpoints of the live members on topic ":peers": at once
        # when this subscription reaches it, and every 2 s.
        self.sub.setsockopt(zmq.SUBSCRIBE, PEERS_TOPIC)
        self.connected = []  # (host, request_port, response_port), in connection order
        for peer in peers:
            self.connect_to(peer)

    def connect_to(self, peer):
        """Connects the PUB and the SUB to `peer` unless already connected or at MAX_PEERS."""
        if peer in self.connected or len(self.connected) >= MAX_PEERS:
            return
        host, req_port, resp_port = peer
        self.pub.connect(f"tcp://{host}:{req_port}")
        self.sub.connect(f"tcp://{host}:{resp_port}")
        self.connected.append(peer)
        if self.trace:
            sys.stderr.write(f"+ connected to {host}:{req_port}:{resp_port}\n")

    def learn_peers(self, body):
        """A peer list: connect to the peers not known yet. A request already published reaches
        them with its next re-publication (it is re-published until accepted). Returns the node
        ids the list names as live (empty: the peer has no view yet, or an older peer)."""
        try:
            m = msgpack.unpackb(body, raw=False, unicode_errors="replace")
        except Exception:  # a malformed message is dropped, never fatal
            return []
        if not isinstance(m, dict) or m.get("kind") != "peers":
            return []
        listed = m.get("peers", [])
        live = m.get("nodes", [])
        live = [n for n in live if isinstance(n, str)] if isinstance(live, list) else []
        if not isinstance(listed, list):
            return live
        for text in listed[:MAX_PEERS]:
            if not isinstance(text, str):
                continue
            try:
                self.connect_to(parse_peer(text))
            except (ValueError, zmq.ZMQError):
                continue  # an address this machine cannot use: the other peers still can be
        return live

    def close(self):
        self.pub.close()
        self.sub.close()
        self.ctx.term()

    def publish(self, req):
        if self.trace:
            shown = dict(req)
            if "prompt" in shown:
                shown["prompt"] = shown["prompt"][:40]
            sys.stderr.write(f"> [req] {shown}\n")
        self.pub.send_multipart([REQUEST_TOPIC, msgpack.packb(req, use_bin_type=True)])

    def ask(self, req, on_text, timeout_s):
        """Runs `req` to its outcome. on_text(bytes) sees each new token's bytes, in order."""
        rid = req["id"]
        topic = (rid + ":").encode()
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        tokens = []  # token ids, index order: tokens[i] has index i
        text = bytearray()
        nodes = []
        stop = ""
        prompt_tokens = 0
        attempt = 0
        accepted = False
        serving = ""  # the peer that accepted the current attempt
        cut = set()  # peers told to drop their duplicate of the current attempt
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        republish_s = FIRST_REPUBLISH_S
        last_publish = last_heard = t0

        req["attempt"] = 0
        req["resume"] = []
        self.publish(req)

        def resume(why):
            nonlocal attempt, accepted, serving, republish_s, last_publish, last_heard
            if attempt + 1 >= MAX_ATTEMPTS:
                raise AskError("timeout", f"request {rid}: gave up after {attempt + 1} attempts "
                                          f"(last: {why})")
            if self.trace:
                sys.stderr.write(f"! resume: {why}\n")
            attempt += 1
            accepted = False
            serving = ""
            cut.clear()
            req["attempt"] = attempt
            req["resume"] = list(tokens)
            republish_s = FIRST_REPUBLISH_S
            last_publish = last_heard = time.monotonic()
            self.publish(req)

        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        while True:
            now = time.monotonic()
            if now >= deadline:
                state = "the stream stalled" if accepted else "no peer accepted it"
                raise AskError("timeout", f"request {rid}: {state} within {timeout_s:g} s "
                                          f"({len(tokens)} tokens received)")
            if not accepted and now - last_publish >= republish_s:
                # Not accepted yet: the connections may not be up (a PUB drops what it sends
                # before), or no plan routes it yet. Quick retries first, then every 500 ms.
                last_publish = now
                republish_s = min(republish_s * 2, REPUBLISH_S)
                self.publish(req)
            if accepted and now - last_heard >= STALL_S:
                resume("the serving peer went silent")
                continue

            if not poller.poll(POLL_MS):
                continue
            frames = self.sub.recv_multipart()
            if len(frames) != 2:
                continue
            if frames[0] == PEERS_TOPIC:
                live = self.learn_peers(frames[1])
                # The serving peer is no longer live in a peer's view: it was declared dead (or
                # left). Resume now instead of after STALL_S of silence.
                if accepted and serving and live and serving not in live:
                    resume(f"peer {serving} left the cluster's view")
                continue
            if frames[0] != topic:
                continue
            try:
                m = msgpack.unpackb(frames[1], raw=False, unicode_errors="replace")
            except Exception:  # a malformed message is dropped, never fatal
                continue
            if not isinstance(m, dict) or m.get("id") != rid or m.get("attempt", 0) != attempt:
                continue  # another request, or an earlier attempt: stale
            if self.trace:
                sys.stderr.write(f"< [{topic.decode()}] {m}\n")
            kind = m.get("kind")
            node = m.get("node", "")
            if node in cut:
                continue  # told to stop: its tokens are the same, its "cancelled" is not ours
            if serving and node != serving:
                if kind in ("accepted", "token") and len(cut) < 8:
                    # A second peer serves this attempt (their views differ): keep the first.
                    cut.add(node)
                    self.publish({"v": 1, "id": rid, "attempt": attempt, "cancel": True,
                                  "node": node})
                continue
            last_heard = time.monotonic()
            if kind == "accepted":
                if not accepted and (not nodes or nodes[-1] != node):
                    nodes.append(node)
                accepted = True
                serving = serving or node
            elif kind == "token":
                accepted = True
                serving = serving or node
                index = m.get("index", 0)
                if index < len(tokens):
                    continue  # a duplicate
                if index > len(tokens):
                    resume(f"index {index} arrived while {len(tokens)} was due")
                    continue
                if not nodes or nodes[-1] != node:
                    nodes.append(node)
                tokens.append(m.get("token", -1))
                piece = m.get("text", b"")
                if isinstance(piece, str):  # tolerate a str from another implementation
                    piece = piece.encode()
                text += piece
                on_text(piece)
            elif kind == "done":
                if m.get("tokens", 0) != len(tokens):
                    resume(f"done after {m.get('tokens', 0)} tokens, {len(tokens)} received")
                    continue
                stop = m.get("stop", "")
                if stop == "max_tokens" and len(tokens) < req.get("max_tokens", 128):
                    # Another publication under our id (someone who knows it) was served.
                    raise AskError("protocol", f"request {rid}: the stream ended at max_tokens "
                                   f"after {len(tokens)} of the {req.get('max_tokens', 128)} "
                                   "tokens asked for: another request under this id replaced "
                                   "it", node)
                prompt_tokens = m.get("prompt_tokens", 0)
                break
            elif kind == "error":
                code = m.get("code", "")
                if code == "unavailable":
                    resume(m.get("message", "unavailable"))
                    continue
                raise AskError(code or "internal", m.get("message", ""), node)
        self.sub.setsockopt(zmq.UNSUBSCRIBE, topic)
        return {
            "tokens": tokens,
            "text": bytes(text),
            "stop": stop,
            "prompt_tokens": prompt_tokens,
            "nodes": nodes,
            "attempts": attempt + 1,
            "total_s": time.monotonic() - t0,
        }


def main(argv):
    a = parse_args(argv)
    req = {
        "v": PROTOCOL_VERSION,
        "id": "py-" + secrets.token_hex(16),  # the id is the capability: 128 bits
        "model": a.model,
        "prompt": a.prompt,
        "max_tokens": a.max_tokens,
        "temperature": float(a.temperature),
        "seed": a.seed,
    }
    try:
        client = Client(a.peers, trace=a.trace, curve=a.curve)
    except zmq.ZMQError as e:
        sys.stderr.write(f"ask.py: cannot connect: {e}\n")
        return 2

    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a token may split a character

    def on_text(piece):
        if not a.json:
            sys.stdout.write(decoder.decode(piece))
            sys.stdout.flush()

    try:
        out = client.ask(req, on_text, a.timeout)
    except AskError as e:
        if a.json:
            print(json.dumps({"ok": False, "code": e.code, "error": e.message, "node": e.node}))
        sys.stderr.write(f"ask.py: {e.code}: {e.message}"
                         + (f" (from peer {e.node})" if e.node else "") + "\n")
        return 1
    except KeyboardInterrupt:
        return 1
    finally:
        client.close()

    if a.json:
        print(json.dumps({
            "ok": True,
            "id": req["id"],
            "text": out["text"].decode("utf-8", "replace"),
            "tokens": out["tokens"],
            "stop": out["stop"],
            "prompt_tokens": out["prompt_tokens"],
            "nodes": out["nodes"],
            "attempts": out["attempts"],
            "peers": [f"{h}:{q}:{r}" for h, q, r in client.connected],
        }, ensure_ascii=False))
    else:
        sys.stdout.write(decoder.decode(b"", final=True) + "\n")
        sys.stderr.write(f"ask.py: {len(out['tokens'])} tokens ({out['stop']}) in "
                         f"{out['total_s']:.2f} s, {out['attempts']} attempt(s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
