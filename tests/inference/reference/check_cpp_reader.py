#!/usr/bin/env python3
"""Checks Tessera's C++ GGUF reader, writer and quantizers against the independent numpy reader.

For llama and qwen3 and every tensor type: `tessera model synth` writes a small model (C++ writer +
C++ quantizers), `tessera_gguf_dump` dumps what the C++ reader and dequantizer see, and this script
compares with gguf_reader.py: same tensors, types, dims, offsets and scalar metadata, and dequantized
values equal (float32, tolerance 1e-6 relative to the tensor's largest magnitude).

    check_cpp_reader.py --tessera BUILD/cli/tessera --dump BUILD/.../tessera_gguf_dump --workdir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader  # noqa: E402

TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def check_model(args, arch, ttype, workdir):
    path = os.path.join(workdir, f"{arch}_{ttype}.gguf")
    # ffn 352 is not a multiple of 256: K-quant files also contain q8_0 fallbacks.
    run([args.tessera, "model", "synth", "--arch", arch, "--dim", "256", "--layers", "2", "--heads",
         "4", "--kv-heads", "2", "--ffn", "352", "--vocab", "600", "--type", ttype, "--seed", "7",
         "-o", path])
    dump = os.path.join(workdir, f"{arch}_{ttype}.dump")
    os.makedirs(dump, exist_ok=True)
    run([args.dump, path, dump])
    with open(os.path.join(dump, "index.json")) as fh:
        idx = json.load(fh)
    f = gguf_reader.GGUFFile(path)
    problems = []
    if idx["version"] != f.version:
        problems.append(f"version {idx['version']} vs {f.version}")
    if idx["data_offset"] != f.data_start:
        problems.append(f"data offset {idx['data_offset']} vs {f.data_start}")
    for k, v in idx["metadata"].items():
        pv = f.metadata.get(k)
        if isinstance(v, dict):
            if not isinstance(pv, list) or len(pv) != v["array_len"]:
                problems.append(f"metadata {k}: array length")
        elif isinstance(v, float):
            if not np.isclose(v, pv, rtol=1e-7):
                problems.append(f"metadata {k}: {v} vs {pv}")
        elif v != pv:
            problems.append(f"metadata {k}: {v!r} vs {pv!r}")
    if set(idx["metadata"]) != set(f.metadata):
        problems.append("metadata key sets differ")
    names = [t["name"] for t in idx["tensors"]]
    if names != list(f.tensors):
        problems.append("tensor names/order differ")
    for t in idx["tensors"]:
        pt = f.tensors[t["name"]]
        if t["type"] != pt.type_name or t["dims"] != pt.dims or t["offset"] != pt.offset:
            problems.append(f"tensor {t['name']}: {t} vs {pt.type_name} {pt.dims} {pt.offset}")
            continue
        cpp = np.fromfile(os.path.join(dump, t["name"] + ".f32"), dtype=np.float32)
        py = f.dequantize(t["name"]).reshape(-1)
        if cpp.shape != py.shape:
            problems.append(f"tensor {t['name']}: {cpp.shape} vs {py.shape} elements")
            continue
        scale = max(float(np.abs(py).max()), 1e-30)
        err = float(np.abs(cpp.astype(np.float64) - py.astype(np.float64)).max())
        if err > 1e-6 * scale:
            problems.append(f"tensor {t['name']} ({t['type']}): max |cpp - py| = {err:.3g} "
                            f"(scale {scale:.3g})")
    types = sorted({t["type"] for t in idx["tensors"]})
    return problems, types, len(idx["tensors"])


def check_info(args, workdir):
    """`tessera model info`: JSON agrees with the numpy reader; corrupt files fail, naming why."""
    problems = []
    path = os.path.join(workdir, "info.gguf")
    run([args.tessera, "model", "synth", "--arch", "qwen3", "--dim", "128", "--layers", "2",
         "--heads", "4", "--kv-heads", "2", "--ffn", "256", "--vocab", "600", "--type", "q8_0",
         "-o", path])
    info = json.loads(run([args.tessera, "model", "info", path, "--json"]))
    f = gguf_reader.GGUFFile(path)
    params = sum(t.n_elements for t in f.tensors.values())
    if info["params"] != params or info["tensor_count"] != len(f.tensors):
        problems.append(f"info params/tensors {info['params']}/{info['tensor_count']} vs {params}")
    if info["architecture"] != "qwen3" or info["vocab"] != 600 or info["chat_template"] != "jinja":
        problems.append(f"info fields: {info}")
    with open(path, "rb") as fh:
        data = fh.read()
    cases = {
        "trunc.gguf": (data[:5000], "truncated"),
        "past_eof.gguf": (data[:-100], "extends past end of file"),
        "version.gguf": (data[:4] + (7).to_bytes(4, "little") + data[8:], "unsupported GGUF version 7"),
        "magic.gguf": (b"GGML" + data[4:], "not a GGUF file"),
    }
    for name, (blob, needle) in cases.items():
        bad = os.path.join(workdir, name)
        with open(bad, "wb") as fh:
            fh.write(blob)
        r = subprocess.run([args.tessera, "model", "info", bad], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode == 0 or needle not in r.stderr or bad not in r.stderr:
            problems.append(f"info {name}: rc {r.returncode}, stderr {r.stderr.strip()!r}")
    r = subprocess.run([args.tessera, "model", "info", os.path.join(workdir, "missing.gguf")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode == 0 or "cannot open" not in r.stderr:
        problems.append(f"info missing file: rc {r.returncode} {r.stderr.strip()!r}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    failed = False
    try:
        for arch in ("llama", "qwen3"):
            for ttype in TYPES:
                problems, types, n = check_model(args, arch, ttype, args.workdir)
                status = "ok" if not problems else "MISMATCH"
                print(f"{arch:6} {ttype:5} {n:3} tensors {','.join(types):16} {status}")
                for p in problems[:20]:
                    print("   ", p)
                failed |= bool(problems)
        problems = check_info(args, args.workdir)
        print(f"model info + corrupt files {'ok' if not problems else 'MISMATCH'}")
        for p in problems:
            print("   ", p)
        failed |= bool(problems)
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
