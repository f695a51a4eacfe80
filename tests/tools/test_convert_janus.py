#!/usr/bin/env python3
"""test_convert_janus.py - tools/convert_janus.py against checkpoints in torch.save's format.

No torch here (CI has none), so the test writes the `.bin` shards itself the way torch.save
(torch >= 1.6) lays them out: a zip archive `<name>/data.pkl` + `<name>/data/<key>` (stored, raw
little-endian storage bytes) + `version` + `byteorder`, where data.pkl is a protocol-2 pickle of
an OrderedDict whose tensors reduce to torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, requires_grad, backward_hooks) and whose storages are persistent ids ('storage',
torch.<Type>Storage, key, location, numel). Stand-in `torch` modules registered in sys.modules
let the standard pickler emit exactly those global references.

The tensors are the golden Janus fixture's (tests/golden/data/janus, transformers-made), written
as two .bin shards with pytorch_model.bin.index.json, one tensor stored transposed (a strided
view) and two sharing one storage at different offsets. Checks: every converted tensor has the
fixture's name, dtype, shape and bytes; the output is sharded with an index under a small
--shard-size; `flexdiag score` gives byte-identical logits from the fixture and from the
converted folder; a data.pkl that names any other global, and a truncated storage, are refused
with a message naming the file.

usage: test_convert_janus.py CONVERTER  (FLEXDIAG_TEST_DATA and FLEXDIAG_BIN from the meson env)
"""
import collections
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import types
import zipfile

STORAGE_NAMES = {"BF16": ("BFloat16Storage", 2), "F16": ("HalfStorage", 2),
                 "F32": ("FloatStorage", 4), "I64": ("LongStorage", 8)}


def read_safetensors(path):
    """name -> (dtype, shape, bytes) of one safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            f.seek(base + e["data_offsets"][0])
            out[name] = (e["dtype"], tuple(e["shape"]),
                         f.read(e["data_offsets"][1] - e["data_offsets"][0]))
    return out


def read_folder(path):
    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(path, f)))
    return out, files


# ---- a torch.save writer without torch ----

class Storage:
    def __init__(self, dtype, data):
        self.dtype, self.data = dtype, data


class Tensor:
    def __init__(self, storage, offset, shape, stride):
        self.storage, self.offset, self.shape, self.stride = storage, offset, shape, stride

    def __reduce_ex__(self, protocol):
        return (TORCH_UTILS._rebuild_tensor_v2,
                (self.storage, self.offset, self.shape, self.stride, False,
                 collections.OrderedDict()))


def install_fake_torch():
    """Modules `torch` and `torch._utils` with the globals torch.save's pickle names."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):
        raise AssertionError("only pickled here, never called")

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", \
        "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    for name, _ in STORAGE_NAMES.values():
        setattr(torch, name, type(name, (), {"__module__": "torch"}))
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
    torch._utils = utils
    return torch, utils


TORCH, TORCH_UTILS = install_fake_torch()


class TorchPickler(pickle.Pickler):
    def __init__(self, f, keys):
        super().__init__(f, protocol=2)
        self.keys = keys

    def persistent_id(self, obj):
        if not isinstance(obj, Storage):
            return None
        key = self.keys.setdefault(id(obj), (str(len(self.keys)), obj))[0]
        name, elt = STORAGE_NAMES[obj.dtype]
        return ("storage", getattr(TORCH, name), key, "cpu", len(obj.data) // elt)


def torch_save(state, path, archive="pytorch_model"):
    import io
    keys = {}
    buf = io.BytesIO()
    TorchPickler(buf, keys).dump(state)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{archive}/data.pkl", buf.getvalue())
        z.writestr(f"{archive}/byteorder", "little")
        for key, storage in keys.values():
            z.writestr(f"{archive}/data/{key}", storage.data)
        z.writestr(f"{archive}/version", "3\n")


def transpose_bytes(data, rows, cols, elt):
    """(rows, cols) row-major -> (cols, rows) row-major."""
    out = bytearray(len(data))
    for r in range(rows):
        for c in range(cols):
            out[(c * rows + r) * elt:(c * rows + r + 1) * elt] = data[(r * cols + c) * elt:
                                                                      (r * cols + c + 1) * elt]
    return bytes(out)


def contiguous_stride(shape):
    stride, acc = [], 1
    for n in reversed(shape):
        stride.insert(0, acc)
        acc *= n
    return tuple(stride)


def make_bins(ref, dst):
    """Two .bin shards + index from ref; returns the names of the strided and shared tensors."""
    names = list(ref)
    two_d = next(n for n in names if len(ref[n][1]) == 2 and ref[n][1][0] != ref[n][1][1])
    one_d = [n for n in names if len(ref[n][1]) == 1][:2]
    tensors = collections.OrderedDict()
    shared = Storage(ref[one_d[0]][0], ref[one_d[0]][2] + ref[one_d[1]][2])
    for name in names:
        dtype, shape, data = ref[name]
        elt = STORAGE_NAMES[dtype][1]
        if name == two_d:  # stored transposed: a (rows, cols) view with strides (1, rows)
            rows, cols = shape
            st = Storage(dtype, transpose_bytes(data, rows, cols, elt))
            tensors[name] = Tensor(st, 0, shape, (1, rows))
        elif name in one_d:
            off = 0 if name == one_d[0] else len(ref[one_d[0]][2]) // elt
            tensors[name] = Tensor(shared, off, shape, contiguous_stride(shape))
        else:
            tensors[name] = Tensor(Storage(dtype, data), 0, shape, contiguous_stride(shape))
    half = len(names) // 2
    parts = [collections.OrderedDict(list(tensors.items())[:half]),
             collections.OrderedDict(list(tensors.items())[half:])]
    weight_map = {}
    for i, part in enumerate(parts):
        fname = f"pytorch_model-{i + 1:05d}-of-00002.bin"
        torch_save(part, os.path.join(dst, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(dst, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    return two_d, one_d


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}")


def main():
    converter = sys.argv[1]
    data = os.path.join(os.environ["FLEXDIAG_TEST_DATA"], "golden", "data", "janus")
    bin_ = os.environ.get("FLEXDIAG_BIN")
    if not os.path.exists(os.path.join(data, "model.safetensors")):
        print("golden Janus fixture missing: skipped")
        sys.exit(77)
    ref = read_safetensors(os.path.join(data, "model.safetensors"))
    tmp = tempfile.mkdtemp(prefix="convert_janus_")
    try:
        src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
        os.makedirs(src)
        for extra in ("config.json", "tokenizer.json", "generation_config.json"):
            shutil.copy(os.path.join(data, extra), src)
        two_d, one_d = make_bins(ref, src)
        r = run([sys.executable, converter, src, dst, "--shard-size", "1MB"])
        check(r.returncode == 0, f"converter runs ({r.stdout.strip()[-200:]} {r.stderr.strip()})")
        got, files = read_folder(dst)
        check(len(files) > 1, f"output sharded under --shard-size 1MB ({len(files)} shards)")
        check(sorted(got) == sorted(ref), f"same {len(ref)} tensor names")
        bad = [n for n in ref if got.get(n) != ref[n]]
        check(not bad, f"dtype, shape and bytes equal for all {len(ref)} tensors "
                       f"(incl. strided '{two_d}' and shared-storage {one_d}); differing: {bad[:3]}")
        check(os.path.exists(os.path.join(dst, "config.json")), "config.json copied")
        if bin_ and os.path.exists(bin_):
            outs = []
            for model in (data, dst):
                out = os.path.join(tmp, f"logits{len(outs)}.npy")
                r = run([bin_, "score", "--cpu", "--model", model, "--input",
                         os.path.join(data, "score_input.json"), "--out", out])
                check(r.returncode == 0, f"flexdiag score --model {model} ({r.stderr.strip()})")
                outs.append(open(out, "rb").read())
            check(outs[0] == outs[1], "flexdiag score: converted checkpoint gives identical logits")
        # a data.pkl naming another global is refused
        evil = os.path.join(tmp, "evil")
        os.makedirs(evil)
        with zipfile.ZipFile(os.path.join(evil, "pytorch_model.bin"), "w") as z:
            z.writestr("pytorch_model/data.pkl", b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq"
                                                 b"\x00\x85q\x01Rq\x02.")
        r = run([sys.executable, converter, evil, os.path.join(tmp, "evil_out")])
        check(r.returncode != 0 and "os.system" in r.stderr and "pytorch_model.bin" in r.stderr,
              f"foreign global refused: {r.stderr.strip()}")
        # a storage shorter than its tensor is refused
        short = os.path.join(tmp, "short")
        os.makedirs(short)
        name = next(iter(ref))
        dtype, shape, blob = ref[name]
        torch_save(collections.OrderedDict(
            [(name, Tensor(Storage(dtype, blob[:-2]), 0, shape, contiguous_stride(shape)))]),
            os.path.join(short, "pytorch_model.bin"))
        r = run([sys.executable, converter, short, os.path.join(tmp, "short_out")])
        check(r.returncode != 0 and "storage" in r.stderr, f"truncated storage refused: "
                                                          f"{r.stderr.strip()}")
    finally:
        shutil.rmtree(tmp)
    print("convert_janus: all checks passed")


if __name__ == "__main__":
    main()
