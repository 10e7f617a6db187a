#!/usr/bin/env python3
"""Independent GGUF reader and dequantizers in numpy, written from the GGUF spec and the GGML
block layouts (not from Tessera's C++). Used as the reference the C++ reader, writer, quantizers
and (later) forward pass are checked against.

    python3 gguf_reader.py MODEL.gguf              # metadata summary + per-tensor checksums (JSON)
    python3 gguf_reader.py MODEL.gguf --tensor NAME --out FILE.f32   # dequantized float32 dump
"""
import json
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

# ggml type id -> (name, elements per block, bytes per block)
TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 8: ("q8_0", 32, 34),
         12: ("q4_K", 256, 144), 14: ("q6_K", 256, 210), 30: ("bf16", 1, 2)}


class GGUFError(Exception):
    pass


class Tensor:
    def __init__(self, name, dims, type_id, offset, nbytes):
        self.name, self.dims, self.type_id, self.offset, self.nbytes = name, dims, type_id, offset, nbytes

    @property
    def type_name(self):
        return TYPES[self.type_id][0]

    @property
    def n_elements(self):
        return int(np.prod(self.dims, dtype=np.int64))

    @property
    def shape(self):
        """numpy shape: GGUF dims are innermost first, so reverse them ([out][in] for weights)."""
        return tuple(reversed(self.dims))


class GGUFFile:
    def __init__(self, path):
        self.path = path
        self.data = np.memmap(path, dtype=np.uint8, mode="r")
        self.pos = 0
        self.metadata = {}
        self.tensors = {}
        self._parse()

    # -- primitive reads ------------------------------------------------------------------------
    def _take(self, n):
        if self.pos + n > len(self.data):
            raise GGUFError(f"{self.path}: truncated at offset {self.pos}")
        b = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return b

    def _scalar(self, fmt):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self._take(size))[0]

    def _string(self):
        n = self._scalar("<Q")
        return self._take(n).decode("utf-8", errors="surrogateescape")

    def _value(self, vtype):
        if vtype in _SCALAR:
            return self._scalar(_SCALAR[vtype])
        if vtype == STRING:
            return self._string()
        if vtype == ARRAY:
            etype = self._scalar("<I")
            count = self._scalar("<Q")
            if etype in _SCALAR and etype != BOOL:
                size = struct.calcsize(_SCALAR[etype])
                raw = self._take(size * count)
                return np.frombuffer(raw, dtype=np.dtype(_SCALAR[etype])).tolist()
            return [self._value(etype) for _ in range(count)]
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype}")

    # -- structure ------------------------------------------------------------------------------
    def _parse(self):
        if self._take(4) != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file")
        self.version = self._scalar("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported version {self.version}")
        n_tensors = self._scalar("<Q")
        n_kv = self._scalar("<Q")
        for _ in range(n_kv):
            key = self._string()
            vtype = self._scalar("<I")
            self.metadata[key] = self._value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar("<I")
            dims = [self._scalar("<Q") for _ in range(n_dims)]
            type_id = self._scalar("<I")
            offset = self._scalar("<Q")
            if type_id not in TYPES:
                raise GGUFError(f"{self.path}: tensor {name} has unsupported type {type_id}")
            infos.append((name, dims, type_id, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (self.pos + align - 1) // align * align
        self.data_start = data_start
        for name, dims, type_id, offset in infos:
            _, blk, bb = TYPES[type_id]
            n = int(np.prod(dims, dtype=np.int64))
            if dims[0] % blk:
                raise GGUFError(f"{self.path}: tensor {name} row not a multiple of the block")
            nbytes = n // blk * bb
            start = data_start + offset
            if start + nbytes > len(self.data):
                raise GGUFError(f"{self.path}: tensor {name} extends past end of file")
            self.tensors[name] = Tensor(name, dims, type_id, start, nbytes)

    def raw(self, name):
        t = self.tensors[name]
        return self.data[t.offset:t.offset + t.nbytes]

    def dequantize(self, name):
        """The tensor as float32, numpy shape reversed from the GGUF dims."""
        t = self.tensors[name]
        flat = dequantize(t.type_id, np.asarray(self.raw(name)), t.n_elements)
        return flat.reshape(t.shape)


# -- dequantizers (float32 results, computed in float32 like GGML's reference code) ----------------

def _f16(raw_u8):
    return raw_u8.view(np.float16).astype(np.float32)


def dequantize(type_id, raw, n):
    name = TYPES[type_id][0]
    if name == "f32":
        return raw.view(np.float32).copy()
    if name == "f16":
        return _f16(raw)
    if name == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if name == "q8_0":
        b = raw.reshape(-1, 34)
        d = _f16(b[:, :2].copy().reshape(-1)).reshape(-1, 1)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if name == "q4_0":
        b = raw.reshape(-1, 18)
        d = _f16(b[:, :2].copy().reshape(-1)).reshape(-1, 1)
        qs = b[:, 2:]
        lo = (qs & 0x0F).astype(np.int8) - 8
        hi = (qs >> 4).astype(np.int8) - 8
        q = np.concatenate([lo, hi], axis=1).astype(np.float32)  # element j, then j + 16
        return (d * q).reshape(-1)
    if name == "q4_K":
        return _dequant_q4_k(raw.reshape(-1, 144))
    if name == "q6_K":
        return _dequant_q6_k(raw.reshape(-1, 210))
    raise GGUFError(f"no dequantizer for {name}")


def _dequant_q4_k(b):
    nb = b.shape[0]
    d = _f16(b[:, 0:2].copy().reshape(-1)).reshape(nb, 1)
    dmin = _f16(b[:, 2:4].copy().reshape(-1)).reshape(nb, 1)
    s = b[:, 4:16].astype(np.uint8)
    qs = b[:, 16:144]
    # 8 sub-blocks of 32: 6-bit scale and min. Sub-blocks 0..3 sit in the low 6 bits of bytes
    # 0..3 (scales) and 4..7 (mins); 4..7 take their low 4 bits from bytes 8..11 and their top
    # 2 bits from the top bits of bytes 0..3 (scales) and 4..7 (mins).
    sc = np.zeros((nb, 8), dtype=np.float32)
    mn = np.zeros((nb, 8), dtype=np.float32)
    for j in range(4):
        sc[:, j] = s[:, j] & 63
        mn[:, j] = s[:, j + 4] & 63
    for j in range(4, 8):
        sc[:, j] = (s[:, j + 4] & 0x0F) | ((s[:, j - 4] >> 6) << 4)
        mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    out = np.empty((nb, 256), dtype=np.float32)
    for pair in range(4):  # each 32 bytes of qs: low nibbles -> sub-block 2p, high -> 2p + 1
        q = qs[:, pair * 32:(pair + 1) * 32]
        d1 = d * sc[:, 2 * pair:2 * pair + 1]
        m1 = dmin * mn[:, 2 * pair:2 * pair + 1]
        d2 = d * sc[:, 2 * pair + 1:2 * pair + 2]
        m2 = dmin * mn[:, 2 * pair + 1:2 * pair + 2]
        out[:, pair * 64:pair * 64 + 32] = d1 * (q & 0x0F).astype(np.float32) - m1
        out[:, pair * 64 + 32:pair * 64 + 64] = d2 * (q >> 4).astype(np.float32) - m2
    return out.reshape(-1)


def _dequant_q6_k(b):
    nb = b.shape[0]
    ql = b[:, 0:128]
    qh = b[:, 128:192]
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210].copy().reshape(-1)).reshape(nb, 1)
    out = np.empty((nb, 256), dtype=np.float32)
    for half in range(2):  # 128 elements each
        L = ql[:, half * 64:(half + 1) * 64]
        H = qh[:, half * 32:(half + 1) * 32]
        s = sc[:, half * 8:(half + 1) * 8]
        l = np.arange(32)
        q1 = ((L[:, l] & 0x0F) | (((H[:, l] >> 0) & 3) << 4)).astype(np.int16) - 32
        q2 = ((L[:, l + 32] & 0x0F) | (((H[:, l] >> 2) & 3) << 4)).astype(np.int16) - 32
        q3 = ((L[:, l] >> 4) | (((H[:, l] >> 4) & 3) << 4)).astype(np.int16) - 32
        q4 = ((L[:, l + 32] >> 4) | (((H[:, l] >> 6) & 3) << 4)).astype(np.int16) - 32
        isub = l // 16  # 16-element sub-blocks: scale index l/16 + {0, 2, 4, 6}
        base = half * 128
        for k, q in enumerate((q1, q2, q3, q4)):
            scale = np.take_along_axis(s, np.broadcast_to(isub + 2 * k, (nb, 32)), axis=1)
            out[:, base + 32 * k:base + 32 * k + 32] = d * scale * q.astype(np.float32)
    return out.reshape(-1)


def checksums(f):
    out = {}
    for name, t in f.tensors.items():
        x = f.dequantize(name).astype(np.float64).reshape(-1)
        out[name] = {"type": t.type_name, "dims": t.dims, "sum": float(x.sum()),
                     "sumsq": float((x * x).sum()), "first": [float(v) for v in x[:4]]}
    return out


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tensor")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    try:
        f = GGUFFile(a.model)
    except GGUFError as e:
        print(str(e), file=sys.stderr)
        return 1
    if a.tensor:
        f.dequantize(a.tensor).astype(np.float32).tofile(a.out)
        return 0
    meta = {k: (v if not isinstance(v, list) or len(v) <= 8 else f"[{len(v)} items]")
            for k, v in f.metadata.items()}
    json.dump({"version": f.version, "metadata": meta, "tensors": checksums(f)}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
