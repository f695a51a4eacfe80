#!/usr/bin/env python3
"""convert_janus.py - turn the official Janus-Pro PyTorch `.bin` checkpoint into safetensors.

deepseek-ai/Janus-Pro-{1B,7B} (main branch) ship pickled `pytorch_model*.bin` shards. flexdiag
reads safetensors only, so this one-off tool rewrites them: same tensor names, same dtype (bf16),
same bytes, in shards of at most --shard-size bytes plus `model.safetensors.index.json` (or a
single `model.safetensors` when everything fits in one shard). config.json, tokenizer files and
generation settings are copied alongside.

It needs nothing but the Python standard library: a `.bin` written by torch.save (torch >= 1.6)
is a zip archive holding `<name>/data.pkl`, the pickled state dict, and `<name>/data/<key>`, the
raw little-endian bytes of each storage. The pickle is read with an unpickler that only knows the
handful of globals a state dict uses (tensor rebuild functions, storage types, OrderedDict) and
refuses anything else, so a checkpoint cannot run code; each tensor becomes a reference into its
storage (dtype, shape, strides, offset) and its bytes are copied straight into the output, one
tensor at a time. Non-contiguous views are gathered into row-major order.

usage: python3 tools/convert_janus.py SRC_DIR DST_DIR [--shard-size 5GB]
"""
import argparse
import collections
import json
import os
import pickle
import shutil
import struct
import sys
import zipfile

# torch storage class -> (safetensors dtype, bytes per element)
STORAGE_DTYPES = {
    "BFloat16Storage": ("BF16", 2), "HalfStorage": ("F16", 2), "FloatStorage": ("F32", 4),
    "DoubleStorage": ("F64", 8), "LongStorage": ("I64", 8), "IntStorage": ("I32", 4),
    "ShortStorage": ("I16", 2), "CharStorage": ("I8", 1), "ByteStorage": ("U8", 1),
    "BoolStorage": ("BOOL", 1),
}
EXTRA_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "generation_config.json", "processor_config.json",
               "preprocessor_config.json")


class ConvertError(Exception):
    """A checkpoint this tool cannot convert; the message names the file and the reason."""


StorageRef = collections.namedtuple("StorageRef", "dtype elt key numel")
TensorRef = collections.namedtuple("TensorRef", "storage offset shape stride")


def rebuild_tensor(storage, offset, size, stride, *_rest):
    return TensorRef(storage, int(offset), tuple(int(s) for s in size),
                     tuple(int(s) for s in stride))


def rebuild_parameter(data, *_rest):
    return data


class StateDictUnpickler(pickle.Unpickler):
    """Unpickles a torch state dict into TensorRefs; every other global is refused."""

    GLOBALS = {
        ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
        ("torch._utils", "_rebuild_tensor"): rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }

    def __init__(self, fileobj, source):
        super().__init__(fileobj)
        self.source = source

    def find_class(self, module, name):
        if (module, name) in self.GLOBALS:
            return self.GLOBALS[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        raise ConvertError(f"{self.source}: data.pkl refers to {module}.{name}, which a plain "
                           "state dict of tensors does not use; refusing to load it")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ConvertError(f"{self.source}: unexpected persistent id {pid!r} in data.pkl")
        dtype, key, numel = pid[1], str(pid[2]), int(pid[4])
        if not isinstance(dtype, tuple):
            raise ConvertError(f"{self.source}: storage {key} has an unsupported type {dtype!r}")
        return StorageRef(dtype[0], dtype[1], key, numel)


class BinFile:
    """One torch.save zip archive: its tensors (name -> TensorRef) and their bytes."""

    def __init__(self, path):
        self.path = path
        if not zipfile.is_zipfile(path):
            raise ConvertError(f"{path}: not a zip archive; checkpoints written by torch < 1.6 "
                               "(legacy tar/pickle format) are not supported: re-save them with a "
                               "recent torch")
        self.zf = zipfile.ZipFile(path)
        pkls = [n for n in self.zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkls) != 1:
            raise ConvertError(f"{path}: expected one data.pkl in the archive, found {len(pkls)}")
        self.prefix = pkls[0][: -len("data.pkl")]
        with self.zf.open(pkls[0]) as f:
            state = StateDictUnpickler(f, path).load()
        if not isinstance(state, dict):
            raise ConvertError(f"{path}: data.pkl holds a {type(state).__name__}, not a state dict")
        self.tensors = collections.OrderedDict()
        for name, t in state.items():
            if not isinstance(t, TensorRef):
                raise ConvertError(f"{path}: entry '{name}' is a {type(t).__name__}, not a tensor")
            self.check(name, t)
            self.tensors[name] = t

    def check(self, name, t):
        if len(t.shape) != len(t.stride) or any(s < 0 for s in t.shape + t.stride):
            raise ConvertError(f"{self.path}: tensor '{name}' has shape {t.shape} and strides "
                               f"{t.stride}")
        last = t.offset + sum((n - 1) * s for n, s in zip(t.shape, t.stride)) if all(t.shape) \
            else t.offset - 1
        if last >= t.storage.numel:
            raise ConvertError(f"{self.path}: tensor '{name}' reaches element {last} of a "
                               f"{t.storage.numel}-element storage")

    def tensor_bytes(self, t):
        """The tensor's elements in row-major order as bytes."""
        n = 1
        for s in t.shape:
            n *= s
        elt = t.storage.elt
        with self.zf.open(f"{self.prefix}data/{t.storage.key}") as f:
            if is_contiguous(t.shape, t.stride):
                f.seek(t.offset * elt)
                data = f.read(n * elt)
                if len(data) != n * elt:
                    raise ConvertError(f"{self.path}: storage {t.storage.key} is truncated")
                return data
            raw = f.read()
        return gather(raw, t, elt)


def is_contiguous(shape, stride):
    expect = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def gather(raw, t, elt):
    """Row-major copy of a strided view (rare in checkpoints: transposed or sliced tensors)."""
    out = bytearray()
    idx = [0] * len(t.shape)
    total = 1
    for s in t.shape:
        total *= s
    for _ in range(total):
        pos = t.offset + sum(i * s for i, s in zip(idx, t.stride))
        out += raw[pos * elt:(pos + 1) * elt]
        for d in reversed(range(len(idx))):
            idx[d] += 1
            if idx[d] < t.shape[d]:
                break
            idx[d] = 0
    return bytes(out)


def nbytes(t):
    n = t.storage.elt
    for s in t.shape:
        n *= s
    return n


def parse_size(text):
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        for unit, mul in units.items():
            if text.upper().endswith(unit):
                return int(float(text[: -len(unit)]) * mul)
        return int(text)
    except ValueError:
        raise ConvertError(f"--shard-size '{text}': expected bytes or a size like 5GB") from None


def bin_files(src):
    index = os.path.join(src, "pytorch_model.bin.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    files = sorted(f for f in os.listdir(src) if f.endswith(".bin"))
    if not files:
        raise ConvertError(f"{src}: no pytorch_model*.bin files found")
    return files


def plan_shards(entries, limit):
    """Split [(name, BinFile, TensorRef)] in order into shards of at most limit bytes."""
    shards, current, size = [], [], 0
    for e in entries:
        if current and size + nbytes(e[2]) > limit:
            shards.append(current)
            current, size = [], 0
        current.append(e)
        size += nbytes(e[2])
    if current:
        shards.append(current)
    return shards


def write_shard(path, shard):
    """Safetensors file: 8-byte header size, JSON header padded to 8 bytes, tensor bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, _, t in shard:
        header[name] = {"dtype": t.storage.dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes(t)]}
        offset += nbytes(t)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, binf, t in shard:
            f.write(binf.tensor_bytes(t))
    os.replace(tmp, path)
    return offset


def convert(src, dst, limit):
    entries, seen = [], {}
    for name in bin_files(src):
        binf = BinFile(os.path.join(src, name))
        for key, t in binf.tensors.items():
            if key in seen:
                raise ConvertError(f"tensor '{key}' is in both {seen[key]} and {name}")
            seen[key] = name
            entries.append((key, binf, t))
    os.makedirs(dst, exist_ok=True)
    shards = plan_shards(entries, limit)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = ("model.safetensors" if len(shards) == 1
                 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
        total += write_shard(os.path.join(dst, fname), shard)
        for key, _, _ in shard:
            weight_map[key] = fname
        print(f"wrote {fname}: {len(shard)} tensors")
    if len(shards) > 1:
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    for extra in EXTRA_FILES:
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), dst)
    print(f"{len(weight_map)} tensors, {total / 1e9:.2f} GB -> {dst}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="folder with pytorch_model*.bin (+ index) and config.json")
    ap.add_argument("dst", help="output folder (created)")
    ap.add_argument("--shard-size", default="5GB", help="largest output shard (default 5GB)")
    args = ap.parse_args()
    try:
        convert(args.src, args.dst, parse_size(args.shard_size))
    except (ConvertError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        sys.exit(f"convert_janus: {e}")


if __name__ == "__main__":
    main()
