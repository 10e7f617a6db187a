#!/usr/bin/env python3
"""Renders every chat template here with every conversation of conversations.json the way Hugging
Face's apply_chat_template does (Jinja2 with trim_blocks, lstrip_blocks and loop controls; tojson
without HTML escaping; raise_exception; strftime_now fixed for reproducibility) and writes
<template>.expected.json: the reference the C++ interpreter's test compares against.
Needs python3-jinja2 (not a build or test dependency: the expected files are committed).
Run from anywhere: tests/inference/tokenizer/chat_templates/make_expected.py"""
import json
import pathlib

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = pathlib.Path(__file__).resolve().parent
GLOBALS = {"bos_token": "<s>", "eos_token": "</s>"}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "29 Nov 2026"
    conversations = json.loads((HERE / "conversations.json").read_text())
    for path in sorted(HERE.glob("*.jinja")):
        template = env.from_string(path.read_text())
        expected = {}
        for name, conv in conversations.items():
            try:
                expected[name] = {"text": template.render(**GLOBALS, **conv)}
            except jinja2.exceptions.TemplateError as e:
                expected[name] = {"error": str(e)}
        out = path.with_suffix(".expected.json")
        out.write_text(json.dumps(expected, ensure_ascii=False, indent=1) + "\n")
        print(out.name, {k: ("error" if "error" in v else len(v["text"])) for k, v in expected.items()})


if __name__ == "__main__":
    main()
