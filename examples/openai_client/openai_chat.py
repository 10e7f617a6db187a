#!/usr/bin/env python3
"""A client of Tessera's OpenAI-compatible HTTP API, written from the published API alone
(docs/HTTP.md, which follows OpenAI's /v1/completions and /v1/chat/completions), with nothing but
Python's standard library: any OpenAI client library works the same way.

    openai_chat.py --url http://127.0.0.1:7480 --model tiny "Tell me a story"
    openai_chat.py --url ... --model tiny --completion --temperature 0 --max-tokens 16 "Once"
    openai_chat.py --url ... --model tiny --no-stream --json "Hello"

Streams the answer to stdout as server-sent events arrive (or waits for the whole reply with
--no-stream). --json prints one object at the end: text, finish_reason, usage, chunks.
Exit status: 0 on success, 1 when the server answered with an error (printed to stderr with its
status, type and code), 2 on bad arguments.
"""
import argparse
import json
import os
import sys
import urllib.error
import urllib.request


def post(url, key, body, timeout):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    return urllib.request.urlopen(req, timeout=timeout)


def events(resp):
    """Yields each server-sent event's data (a str), up to and without [DONE]."""
    data = []
    for raw in resp:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif line == "" and data:
            payload = "\n".join(data)
            data = []
            if payload == "[DONE]":
                return
            yield payload


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prompt")
    p.add_argument("--url", default="http://127.0.0.1:7480", help="a peer's HTTP address")
    p.add_argument("--model", required=True)
    p.add_argument("--key", default=os.environ.get("TESSERA_API_KEY", ""),
                   help="API key (default: $TESSERA_API_KEY)")
    p.add_argument("--completion", action="store_true",
                   help="use /v1/completions (a plain prompt) instead of chat")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-stream", action="store_true", help="wait for the whole reply")
    p.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()
    if a.max_tokens < 1:
        p.error("--max-tokens must be at least 1")

    body = {"model": a.model, "max_tokens": a.max_tokens, "stream": not a.no_stream}
    if a.temperature is not None:
        body["temperature"] = a.temperature
    if a.seed is not None:
        body["seed"] = a.seed
    if a.completion:
        path, body["prompt"] = "/v1/completions", a.prompt
    else:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": a.prompt}]
    if not a.no_stream:
        body["stream_options"] = {"include_usage": True}

    text, finish, usage, chunks = "", None, None, 0
    try:
        with post(a.url.rstrip("/") + path, a.key, body, a.timeout) as resp:
            if a.no_stream:
                reply = json.load(resp)
                choice = reply["choices"][0]
                text = choice["text"] if a.completion else choice["message"]["content"]
                finish, usage = choice["finish_reason"], reply.get("usage")
                if not a.json:
                    print(text)
            else:
                for data in events(resp):
                    event = json.loads(data)
                    if "error" in event:  # an error after the stream began
                        print(f"error: {event['error'].get('message')}", file=sys.stderr)
                        return 1
                    chunks += 1
                    usage = event.get("usage") or usage
                    for choice in event.get("choices", []):
                        piece = choice.get("text") if a.completion else \
                            choice.get("delta", {}).get("content")
                        if piece:
                            text += piece
                            if not a.json:
                                print(piece, end="", flush=True)
                        finish = choice.get("finish_reason") or finish
                if not a.json:
                    print()
    except urllib.error.HTTPError as e:
        try:
            err = json.load(e).get("error", {})
        except ValueError:
            err = {}
        print(f"error: HTTP {e.code}: {err.get('message', e.reason)} "
              f"(type {err.get('type')}, code {err.get('code')})", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as e:
        print(f"error: cannot reach {a.url}: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps({"text": text, "finish_reason": finish, "usage": usage,
                          "chunks": chunks}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
