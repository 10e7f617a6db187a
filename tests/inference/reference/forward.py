#!/usr/bin/env python3
"""Float64 reference forward pass for llama, qwen3 and qwen3moe GGUF models (numpy only).

Follows ../shared/notes/llama-numerics.md: embedding row lookup; per layer RMSNorm -> Q, K, V;
qwen3 applies RMSNorm with attn_q_norm / attn_k_norm to every head of Q and K; RoPE ("normal",
consecutive pairs, for llama; NeoX, half split, for qwen2/qwen3); causal softmax attention with
GQA (query head h uses KV head h // (n_head / n_head_kv)); output projection; RMSNorm -> SwiGLU
FFN; final RMSNorm and output.weight (token_embd.weight when output.weight is absent: tied).
Mixture of experts (qwen3moe, and llama with expert_count: Mixtral): per token the router
ffn_gate_inp gives logits over the experts, softmax, the expert_used_count most probable (ties to
the lower index), their probabilities renormalised to sum 1; the FFN output is the weighted sum of
those experts' SwiGLU outputs (ffn_{gate,up,down}_exps[e]).

    python3 forward.py MODEL.gguf --tokens 1,450,2 [--all-positions] [--top 5]

prints JSON: {"tokens": [...], "logits": [[...], ...] (last position only unless --all-positions),
"argmax": [...] (every position)}.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_reader import GGUFFile  # noqa: E402


class Model:
    def __init__(self, path):
        self.f = GGUFFile(path)
        m = self.f.metadata
        self.arch = m["general.architecture"]
        if self.arch not in ("llama", "qwen2", "qwen3", "qwen3moe"):
            raise SystemExit(f"{path}: architecture {self.arch} not supported by the reference")
        p = self.arch + "."
        self.dim = int(m[p + "embedding_length"])
        self.n_layer = int(m[p + "block_count"])
        self.n_head = int(m[p + "attention.head_count"])
        self.n_kv = int(m.get(p + "attention.head_count_kv", self.n_head))
        self.head_dim = int(m.get(p + "attention.key_length", self.dim // self.n_head))
        self.eps = float(m.get(p + "attention.layer_norm_rms_epsilon", 1e-5))
        self.base = float(m.get(p + "rope.freq_base", 10000.0))
        self.neox = self.arch in ("qwen2", "qwen3", "qwen3moe")
        self.qk_norm = self.arch in ("qwen3", "qwen3moe")
        self.n_expert = int(m.get(p + "expert_count", 0))
        self.n_used = int(m.get(p + "expert_used_count", 0))
        self.min_route_gap = np.inf  # smallest gap between the k-th and (k+1)-th router logit
        self._cache = {}

    def w(self, name):
        if name not in self._cache:
            self._cache[name] = self.f.dequantize(name).astype(np.float64)
        return self._cache[name]

    def has(self, name):
        return name in self.f.tensors


def rmsnorm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x, positions, base, neox):
    """x: (T, heads, head_dim); rotate by position. normal: pairs (2i, 2i+1); neox: (i, i + d/2)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
    ang = positions[:, None].astype(np.float64) * inv[None, :]  # (T, d/2)
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    out = np.empty_like(x)
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
        out[..., : d // 2] = a * cos - b * sin
        out[..., d // 2:] = a * sin + b * cos
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def ffn(M, p, h):
    """The FFN of layer prefix p over rows h (T, dim): dense SwiGLU, or the mixture of experts."""
    if M.n_expert == 0:
        g = h @ M.w(p + "ffn_gate.weight").T
        u = h @ M.w(p + "ffn_up.weight").T
        return (silu(g) * u) @ M.w(p + "ffn_down.weight").T
    h = np.atleast_2d(h)
    logits = h @ M.w(p + "ffn_gate_inp.weight").T  # (T, n_expert)
    gate, up, down = (M.w(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        z = logits[t]
        prob = np.exp(z - z.max())
        prob /= prob.sum()
        order = np.argsort(-prob, kind="stable")
        chosen = order[: M.n_used]
        if M.n_used < M.n_expert:
            M.min_route_gap = min(M.min_route_gap, float(z[order[M.n_used - 1]] - z[order[M.n_used]]))
        w = prob[chosen] / prob[chosen].sum()
        for e, we in zip(chosen, w):
            out[t] += we * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
    return out


def forward(model, tokens):
    """Logits (T, vocab) for every position of `tokens`, in float64."""
    M = model
    tokens = np.asarray(tokens, dtype=np.int64)
    T = len(tokens)
    pos = np.arange(T)
    x = M.w("token_embd.weight")[tokens].copy()  # (T, dim)
    group = M.n_head // M.n_kv
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for l in range(M.n_layer):
        p = f"blk.{l}."
        h = rmsnorm(x, M.w(p + "attn_norm.weight"), M.eps)
        q = (h @ M.w(p + "attn_q.weight").T).reshape(T, M.n_head, M.head_dim)
        k = (h @ M.w(p + "attn_k.weight").T).reshape(T, M.n_kv, M.head_dim)
        v = (h @ M.w(p + "attn_v.weight").T).reshape(T, M.n_kv, M.head_dim)
        if M.qk_norm:
            q = rmsnorm(q, M.w(p + "attn_q_norm.weight"), M.eps)
            k = rmsnorm(k, M.w(p + "attn_k_norm.weight"), M.eps)
        q = rope(q, pos, M.base, M.neox)
        k = rope(k, pos, M.base, M.neox)
        out = np.empty((T, M.n_head, M.head_dim))
        for hh in range(M.n_head):
            kv = hh // group
            s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(M.head_dim) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, hh, :] = s @ v[:, kv, :]
        x = x + out.reshape(T, -1) @ M.w(p + "attn_output.weight").T
        h = rmsnorm(x, M.w(p + "ffn_norm.weight"), M.eps)
        x = x + ffn(M, p, h)
    h = rmsnorm(x, M.w("output_norm.weight"), M.eps)
    out_w = M.w("output.weight") if M.has("output.weight") else M.w("token_embd.weight")
    return h @ out_w.T


def forward_incremental(model, tokens):
    """Same logits computed one token at a time with a KV cache and explicit per-head loops: a
    second formulation used to cross-check forward() (positions, masking, cache order)."""
    M = model
    group = M.n_head // M.n_kv
    ks = [[] for _ in range(M.n_layer)]
    vs = [[] for _ in range(M.n_layer)]
    rows = []
    for t, tok in enumerate(tokens):
        x = M.w("token_embd.weight")[tok].copy()
        for l in range(M.n_layer):
            p = f"blk.{l}."
            h = rmsnorm(x, M.w(p + "attn_norm.weight"), M.eps)
            q = (M.w(p + "attn_q.weight") @ h).reshape(1, M.n_head, M.head_dim)
            k = (M.w(p + "attn_k.weight") @ h).reshape(1, M.n_kv, M.head_dim)
            v = (M.w(p + "attn_v.weight") @ h).reshape(M.n_kv, M.head_dim)
            if M.qk_norm:
                q = rmsnorm(q, M.w(p + "attn_q_norm.weight"), M.eps)
                k = rmsnorm(k, M.w(p + "attn_k_norm.weight"), M.eps)
            q = rope(q, np.array([t]), M.base, M.neox)[0]
            k = rope(k, np.array([t]), M.base, M.neox)[0]
            ks[l].append(k)
            vs[l].append(v)
            K = np.stack(ks[l])  # (t+1, n_kv, hd)
            V = np.stack(vs[l])
            heads = []
            for hh in range(M.n_head):
                kv = hh // group
                s = np.array([q[hh] @ K[j, kv] for j in range(t + 1)]) / np.sqrt(M.head_dim)
                e = np.exp(s - s.max())
                e /= e.sum()
                heads.append(sum(e[j] * V[j, kv] for j in range(t + 1)))
            x = x + M.w(p + "attn_output.weight") @ np.concatenate(heads)
            h = rmsnorm(x, M.w(p + "ffn_norm.weight"), M.eps)
            x = x + ffn(M, p, h[None, :])[0]
        h = rmsnorm(x, M.w("output_norm.weight"), M.eps)
        out_w = M.w("output.weight") if M.has("output.weight") else M.w("token_embd.weight")
        rows.append(out_w @ h)
    return np.stack(rows)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--all-positions", action="store_true")
    ap.add_argument("--top", type=int, default=0, help="also list the top-k ids per position")
    a = ap.parse_args(argv)
    model = Model(a.model)
    tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
    vocab = model.f.tensors["token_embd.weight"].dims[1]
    if not tokens or any(t < 0 or t >= vocab for t in tokens):
        print(f"token ids must be in [0, {vocab})", file=sys.stderr)
        return 1
    logits = forward(model, tokens)
    out = {"model": a.model, "architecture": model.arch, "tokens": tokens,
           "argmax": [int(i) for i in logits.argmax(axis=-1)],
           "logits": (logits if a.all_positions else logits[-1:]).tolist()}
    if a.top:
        out["top"] = [[int(i) for i in np.argsort(-row)[:a.top]] for row in logits]
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
