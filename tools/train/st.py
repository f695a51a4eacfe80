"""
st.py - a minimal safetensors writer and reader (the format: 8-byte little-endian header length,
a JSON header {name: {dtype, shape, data_offsets}}, then the tensors back to back), so the
pipeline needs neither the `safetensors` package nor a particular torch version. BF16 is written
from torch.bfloat16 bits; F32 as is. Tensors are written in name order and tile the data section
exactly, as flexdiag's reader requires (docs/formats.md §2.5).
"""

import hashlib
import json
import os
import struct

import numpy as np
import torch

_DT = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.int64: "I64",
       torch.int32: "I32"}
_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4}


def _bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def save(tensors, path, metadata=None):
    """Write {name: tensor} to path atomically; returns the file's sha256 (hex)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        b = _bytes(t)
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp.%d" % os.getpid()
    sha = hashlib.sha256()
    with open(tmp, "wb") as f:
        for chunk in [struct.pack("<Q", len(h)), h] + blobs:
            f.write(chunk)
            sha.update(chunk)
    os.replace(tmp, path)
    return sha.hexdigest()


def load(path):
    """{name: float32 or integer torch tensor} (BF16/F16 widened to float32)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[base + a:base + b]
        dt = e["dtype"]
        if dt == "BF16":
            x = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = x.view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
        elif dt == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        elif dt == "I64":
            arr = np.frombuffer(raw, dtype=np.int64)
        elif dt == "I32":
            arr = np.frombuffer(raw, dtype=np.int32)
        else:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, dt))
        out[name] = torch.from_numpy(arr.copy()).reshape(e["shape"])
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
