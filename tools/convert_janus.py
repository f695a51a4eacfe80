#!/usr/bin/env python3
"""convert_janus.py - turn the official Janus-Pro PyTorch `.bin` checkpoint into safetensors.

deepseek-ai/Janus-Pro-{1B,7B} (main branch) ship pickled `pytorch_model*.bin` shards. flexdiag
reads safetensors only, so this one-off tool rewrites them: same tensor names, same dtype (bf16),
shards of at most --shard-size bytes plus `model.safetensors.index.json` (or a single
`model.safetensors` when everything fits in one shard). config.json, tokenizer files and
generation settings are copied alongside. Needs torch and safetensors; not used at run time.

usage: python3 tools/convert_janus.py SRC_DIR DST_DIR [--shard-size 5GB]
"""
import argparse
import json
import os
import shutil
import sys


def parse_size(text):
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for unit, mul in units.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * mul)
    return int(text)


def bin_files(src):
    index = os.path.join(src, "pytorch_model.bin.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    files = sorted(f for f in os.listdir(src) if f.endswith(".bin"))
    if not files:
        sys.exit(f"{src}: no pytorch_model*.bin files found")
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--shard-size", default="5GB")
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    os.makedirs(args.dst, exist_ok=True)
    limit = parse_size(args.shard_size)
    shards, current, size = [], {}, 0
    for name in bin_files(args.src):
        state = torch.load(os.path.join(args.src, name), map_location="cpu", weights_only=True)
        for key, tensor in state.items():
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > limit:
                shards.append(current)
                current, size = {}, 0
            current[key] = tensor.contiguous()
            size += nbytes
    if current:
        shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = ("model.safetensors" if len(shards) == 1
                 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
        save_file(shard, os.path.join(args.dst, fname), metadata={"format": "pt"})
        for key, tensor in shard.items():
            weight_map[key] = fname
            total += tensor.numel() * tensor.element_size()
        print(f"wrote {fname}: {len(shard)} tensors")
    if len(shards) > 1:
        with open(os.path.join(args.dst, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    for extra in ("config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "generation_config.json", "processor_config.json"):
        if os.path.exists(os.path.join(args.src, extra)):
            shutil.copy(os.path.join(args.src, extra), args.dst)
    print(f"{len(weight_map)} tensors, {total / 1e9:.2f} GB -> {args.dst}")


if __name__ == "__main__":
    main()
