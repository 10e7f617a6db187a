#!/usr/bin/env python3
"""The C++ forward pass against the independent float64 numpy reference (../reference/forward.py).

For llama (normal RoPE, untied output), qwen3 (NeoX RoPE, q/k norm, tied embeddings) and the
mixtures of experts qwen3moe and Mixtral-style llama (router, top-k experts, renormalised weights)
and every tensor type (f32, f16, bf16, q8_0, q4_0, q4_K, q6_K), `tessera model synth` writes a small model,
`tessera_model_logits` prints the engine's logits for every position of a fixed token sequence
(teacher forcing: both sides see the same tokens), and the reference computes them in float64 from
the dequantized weights. Per position:

  rel = RMS(cpp - ref) / RMS(ref)  must be below the type's tolerance (TOL below, stated with the
        reasons: the engine keeps activations in f32, rounds the KV cache to f16, and quantizes
        activations to q8_0 / q8_K blocks for the quantized weight types, as llama.cpp does);
  argmax equal wherever the reference's top-1/top-2 margin exceeds MARGIN x RMS(cpp - ref) of that
        position (random-weight models have tiny margins, see ../shared/notes/llama-numerics.md).

Greedy decoding (f32 and q8_0): the engine's greedy continuation is fed to the reference, which must
pick the same token at every step whose margin is clear; on f32 all steps here are clear, so the
sequences are identical. Also: two layer shards chained by hidden states, and two threads.

    compare_reference.py --tessera BUILD/cli/tessera --logits BUILD/.../tessera_model_logits
                         --reference SRC/tests/inference/reference --workdir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"]
# The MoE models' experts run on the same kernels: a float, the int8 and a K-quant type suffice.
MOE_TYPES = ["f32", "f16", "q8_0", "q4_k"]
# Relative RMS error bounds per weight type. Measured worst cases on these models (2026-11-23):
# f32/f16/bf16 2.4e-4 (f32 arithmetic and the f16 KV cache), q8_0 1.4e-2, q4_0 1.4e-2, q4_K 1.9e-2,
# q6_K 1.8e-2 (activations quantized to q8_0 / q8_K blocks, as llama.cpp does). The kernels' integer
# dot products are exact on every ISA, so these numbers do not move between machines.
TOL = {"f32": 1e-3, "f16": 1e-3, "bf16": 1e-3, "q8_0": 3e-2, "q4_0": 3e-2, "q4_k": 3e-2,
       "q6_k": 3e-2}
MARGIN = 8.0
TOKENS = [1, 17, 300, 45, 599, 2, 88, 88, 7, 123, 456, 31]


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=None if env is None else {**os.environ, **env})
    if r.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r.stdout


def compare(label, cpp, ref, tol, failures):
    """cpp, ref: (T, vocab). Returns the worst relative error."""
    worst = 0.0
    checked = 0
    for t in range(ref.shape[0]):
        d = cpp[t] - ref[t]
        rms_d = float(np.sqrt(np.mean(d * d)))
        rel = rms_d / float(np.sqrt(np.mean(ref[t] * ref[t])))
        worst = max(worst, rel)
        if not np.all(np.isfinite(cpp[t])):
            failures.append(f"{label}: position {t}: non-finite logits")
        if rel > tol:
            failures.append(f"{label}: position {t}: relative RMS error {rel:.2e} > {tol:.0e}")
        top = np.argsort(-ref[t])[:2]
        margin = float(ref[t][top[0]] - ref[t][top[1]])
        if margin > MARGIN * max(rms_d, 1e-6):
            checked += 1
            if int(np.argmax(cpp[t])) != int(top[0]):
                failures.append(f"{label}: position {t}: argmax {int(np.argmax(cpp[t]))} != "
                                f"reference {int(top[0])} (margin {margin:.3f})")
    return worst, checked


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--types", default=",".join(TYPES))
    a = ap.parse_args()
    sys.path.insert(0, a.reference)
    import forward as ref  # noqa: E402

    os.makedirs(a.workdir, exist_ok=True)
    failures = []
    tok_arg = ",".join(map(str, TOKENS))
    try:
        # Mixtures of experts (issue 33): qwen3moe, and llama with experts (Mixtral's layout);
        # 8 experts, 2 used per token, each of FFN width 256 (a K-quant block).
        moe = ["--experts", "8", "--experts-used", "2", "--expert-ffn", "256"]
        models = (("llama", "llama", [], TYPES), ("qwen3", "qwen3", ["--tied"], TYPES),
                  ("qwen3moe", "qwen3moe", ["--tied", *moe], MOE_TYPES),
                  ("mixtral", "llama", moe, MOE_TYPES))
        for name, arch, extra, types in models:
            for ttype in a.types.split(","):
                if ttype not in types:
                    continue
                path = os.path.join(a.workdir, f"{name}_{ttype}.gguf")
                # dim 256 and ffn 512: every 2-D weight is a multiple of 256, so the K-quant files
                # really are K-quant (no q8_0 fallback).
                run([a.tessera, "model", "synth", "--arch", arch, "--dim", "256", "--layers", "2",
                     "--heads", "4", "--kv-heads", "2", "--ffn", "512", "--vocab", "600", "--type",
                     ttype, "--seed", "11", "-o", path, *extra])
                m = ref.Model(path)
                want = ref.forward(m, TOKENS)
                got = np.array(json.loads(run([a.logits, path, "--tokens", tok_arg]))["logits"],
                               dtype=np.float64)
                if got.shape != want.shape:
                    failures.append(f"{name} {ttype}: shape {got.shape} vs {want.shape}")
                    continue
                label = f"{name} {ttype}"
                worst, checked = compare(label, got, want, TOL[ttype], failures)
                print(f"{label:12s} worst relative RMS error {worst:.2e} (tolerance "
                      f"{TOL[ttype]:.0e}); argmax checked at {checked}/{len(TOKENS)} positions")
                if ttype in ("f32", "q8_0"):
                    # Shards and threads: the same numbers (the kernels are split-invariant).
                    split = np.array(json.loads(run([a.logits, path, "--tokens", tok_arg,
                                                     "--layers-split", "1"]))["logits"])
                    if not np.array_equal(split, got):
                        failures.append(f"{label}: layer shards [0,1)+[1,2) differ from the full model")
                    two = np.array(json.loads(run([a.logits, path, "--tokens", tok_arg, "--threads",
                                                   "2", "--batch", "5"]))["logits"])
                    if not np.array_equal(two, got):
                        failures.append(f"{label}: 2 threads, batches of 5 differ from 1 thread")
                    # The portable scalar kernels (and scalar softmax) against the same reference.
                    scalar = np.array(json.loads(run([a.logits, path, "--tokens", tok_arg],
                                                     env={"TESSERA_KERNEL_ISA": "scalar"}))["logits"])
                    w, _ = compare(label + " scalar", scalar, want, TOL[ttype], failures)
                    print(f"{label:12s} scalar kernels: worst relative RMS error {w:.2e}")
                    # Greedy continuation, judged by the reference with teacher forcing.
                    prompt = TOKENS[:4]
                    gen = json.loads(run([a.logits, path, "--tokens", ",".join(map(str, prompt)),
                                          "--generate", "12"]))["generated"]
                    full = ref.forward(m, prompt + gen[:-1])
                    clear = 0
                    for i, g in enumerate(gen):
                        row = full[len(prompt) - 1 + i]
                        top = np.argsort(-row)[:2]
                        margin = float(row[top[0]] - row[top[1]])
                        if margin > 0.02 * float(np.sqrt(np.mean(row * row))) or ttype == "f32":
                            clear += 1
                            if int(top[0]) != g:
                                failures.append(f"{label}: greedy step {i}: engine {g}, reference "
                                                f"{int(top[0])} (margin {margin:.4f})")
                    print(f"{label:12s} greedy: {len(gen)} tokens, {clear} judged, "
                          f"sequence {gen}")
    finally:
        shutil.rmtree(a.workdir, ignore_errors=True)
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        return 1
    print("ok: C++ logits match the float64 reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
