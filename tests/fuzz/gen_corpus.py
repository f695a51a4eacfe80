#!/usr/bin/env python3
"""Write the seed corpus of the safetensors fuzz target (tests/fuzz/corpus/safetensors/).

Run once from anywhere: `python3 tests/fuzz/gen_corpus.py`; the output is committed and replayed
by the 'format' suite. Seeds are small valid files (every dtype family, metadata, rank 0, empty
tensors, an empty header), valid and invalid index JSON (the fuzz harness provides the shard
s1.safetensors holding "a" F32 [2] and "b" BF16 [3]), and one corrupt file per class of
docs/architecture.md §10.1, so mutations start next to every validation branch. Standard library
only. """
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "F64": 8, "U8": 1}


def header_bytes(obj):
    """u64 length + compact JSON padded with spaces to a multiple of 8, as the writer does."""
    text = json.dumps(obj, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); data is a byte ramp of the right length."""
    obj, data = {}, b""
    if metadata is not None:
        obj["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + i) % 251 for i in range(n))
    return header_bytes(obj) + data


def raw_header(text, data_len):
    """A header written verbatim (may be invalid), then data_len zero bytes."""
    return struct.pack("<Q", len(text)) + text + b"\0" * data_len


def seeds():
    two = safetensors([("a", "BF16", [2, 3]), ("b", "F32", [2])], {"format": "pt"})
    entry = b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    return {
        "valid_two.safetensors": two,
        "valid_dtypes.safetensors": safetensors([
            ("h", "F16", [3]), ("i", "I32", [1]), ("l", "I64", [1]), ("d", "F64", [1]),
            ("u", "U8", [3]), ("s", "BF16", []), ("e", "F32", [0, 4])]),
        "valid_empty_header.safetensors": header_bytes({}),
        "index_valid.json": json.dumps(
            {"metadata": {"total_size": 14},
             "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}).encode(),
        "index_self_and_shard.json": json.dumps(
            {"weight_map": {"a": "s1.safetensors", "x": "t.safetensors"}}).encode(),
        "index_dotdot.json": json.dumps({"weight_map": {"a": "../s1.safetensors"}}).encode(),
        "bad_giant_header.safetensors": struct.pack("<Q", 4000000000) + b"{}      ",
        "bad_truncated_mid_tensor.safetensors": two[:-5],
        "bad_dup_keys.safetensors": raw_header(b"{" + entry + b"," + entry + b"}", 8),
        "bad_utf8.safetensors": raw_header(b'{"\xff":{"dtype":"U8","shape":[1],'
                                           b'"data_offsets":[0,1]}}', 1),
        "bad_overlap.safetensors": raw_header(
            b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12),
        "bad_hole.safetensors": raw_header(
            b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', 12),
        "bad_size_mismatch.safetensors": raw_header(
            b'{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}}', 10),
        "bad_shape_overflow.safetensors": raw_header(
            b'{"a":{"dtype":"U8","shape":[1099511627776,1099511627776],'
            b'"data_offsets":[0,1]}}', 1),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in sorted(seeds().items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
