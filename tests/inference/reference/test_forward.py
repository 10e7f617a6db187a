#!/usr/bin/env python3
"""Self-checks of the float64 reference forward pass on small synthetic models written by
`tessera model synth` (llama: normal RoPE, untied; qwen3: NeoX RoPE, q/k norm, tied embeddings):

- the batched forward() equals the token-by-token KV-cache formulation forward_incremental();
- causality: logits of a prefix do not depend on later tokens;
- logits are finite and O(1..10) (the synthetic weights keep activations sane through the layers);
- the architecture's RoPE matters: swapping normal/NeoX changes the logits;
- the command line prints the JSON the C++ comparison will read.

    test_forward.py --tessera BUILD/cli/tessera --workdir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forward as ref  # noqa: E402


def synth(tessera, arch, path, extra=()):
    cmd = [tessera, "model", "synth", "--arch", arch, "--dim", "128", "--layers", "3", "--heads",
           "4", "--kv-heads", "2", "--ffn", "256", "--vocab", "600", "--type", "f32", "--seed",
           "3", "-o", path, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    try:
        tokens = [1, 17, 300, 45, 599, 2, 88, 88]
        for arch, extra in (("llama", ()), ("qwen3", ("--tied",))):
            path = os.path.join(a.workdir, f"{arch}.gguf")
            synth(a.tessera, arch, path, extra)
            m = ref.Model(path)
            check(m.neox == (arch == "qwen3") and m.qk_norm == (arch == "qwen3"),
                  f"{arch}: rope/qk-norm flags from metadata")
            check(m.has("output.weight") == (arch == "llama"), f"{arch}: tied = {arch == 'qwen3'}")
            full = ref.forward(m, tokens)
            check(full.shape == (len(tokens), 600), f"{arch}: logits shape {full.shape}")
            check(bool(np.all(np.isfinite(full))), f"{arch}: logits finite")
            sd = float(full.std())
            check(0.1 < sd < 50, f"{arch}: logit std {sd:.3f} is sane")
            inc = ref.forward_incremental(m, tokens)
            err = float(np.abs(inc - full).max())
            check(err < 1e-9 * max(1.0, float(np.abs(full).max())),
                  f"{arch}: batched == incremental KV cache (max diff {err:.2e})")
            prefix = ref.forward(m, tokens[:4])
            check(float(np.abs(prefix - full[:4]).max()) < 1e-10, f"{arch}: causal (prefix invariant)")
            changed = ref.forward(m, tokens[:4] + [5, 6, 7, 8])
            check(float(np.abs(changed[:4] - full[:4]).max()) < 1e-10 and
                  float(np.abs(changed[4:] - full[4:]).max()) > 1e-6,
                  f"{arch}: later tokens change only later logits")
            m.neox = not m.neox
            other = ref.forward(m, tokens)
            check(float(np.abs(other[1:] - full[1:]).max()) > 1e-3 and
                  float(np.abs(other[0] - full[0]).max()) < 1e-10,
                  f"{arch}: the RoPE variant matters (position 0 unrotated)")
            out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "forward.py"),
                                  path, "--tokens", ",".join(map(str, tokens)), "--all-positions"],
                                 check=True, stdout=subprocess.PIPE, text=True).stdout
            j = json.loads(out)
            check(np.allclose(np.array(j["logits"]), full, rtol=0, atol=1e-9) and
                  j["argmax"] == [int(i) for i in full.argmax(-1)], f"{arch}: forward.py JSON")
            bad = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "forward.py"),
                                  path, "--tokens", "1,600"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            check(bad.returncode != 0 and "token ids must be" in bad.stderr,
                  f"{arch}: out-of-range token id rejected")
    finally:
        shutil.rmtree(a.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
