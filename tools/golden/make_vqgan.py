#!/usr/bin/env python3
"""
make_vqgan.py - golden fixture for flexdiag's taming / Chameleon (Lumina-mGPT) VQGAN decoder.

A small PyTorch implementation of taming-transformers' VQGAN decode path, written here from the
architecture description (docs/architecture.md §4.4; not imported from taming or transformers):

  codes (n, h*w) -> quantize.embedding rows (no L2 normalisation) as (n, e, h, w)
  -> post_quant_conv (1x1, e -> z) -> decoder:
     conv_in (3x3, z -> ch*ch_mult[-1])
     mid: block_1 (ResnetBlock), attn_1 (AttnBlock), block_2 (ResnetBlock)
     for i_level = L-1 .. 0: up[i_level].block[0..num_res_blocks] (no attention: attn_resolutions
       is empty), then up[i_level].upsample (nearest x2 + 3x3 conv) when i_level != 0
     norm_out (GroupNorm), swish, conv_out (3x3 -> RGB)
  ResnetBlock: norm1, swish, conv1 (3x3), norm2, swish, dropout(0), conv2 (3x3), plus the input
    through nin_shortcut (1x1) when the channel count changes.
  AttnBlock: GroupNorm, q, k, v (1x1 convs), softmax over key positions of q^T k / sqrt(c),
    proj_out (1x1), residual.

Sizes are tiny (codebook 64 x 8, z 16, ch 16, ch_mult (1, 2, 2), 3 ResBlocks per level,
GroupNorm(8 groups, eps 1e-6), 4x4 codes -> 16x16 pixels; about 195 k parameters). Weights are
seeded random values rounded to bf16 and stored as BF16 safetensors; the reference pixels are
computed on the CPU in float64 from exactly those bf16 values, so flexdiag (bf16 weights, fp32
activations) should match within ~1e-6 relative L2.

Writes under --out (default tests/image/data/vqgan, relative to the repository root):
  vqgan.safetensors  the decoder + codebook under taming names (decoder.*, post_quant_conv.*,
                     quantize.embedding.weight), BF16
  codes.npy          int64 [2, 16]: codebook indices, raster order (row-major 4x4 grid)
  pixels.npy         float32 [2, 16, 16, 3]: decoder output, NHWC, not clamped or scaled
                     (what flexdiag__vq_decode returns)
  golden.json        magic "flexdiag-golden", version 1, generator, torch version, the shape
                     (groups, eps, grid, ...) and the arrays
Needs only torch (no numpy, safetensors or transformers): the files are written with the
standard library. Deterministic: fixed seeds; float64 on the CPU.
Usage: python3 tools/golden/make_vqgan.py [--out DIR]
"""

import argparse
import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

GENERATOR = "tools/golden/make_vqgan.py"
SEED = 20250301

# The fixture's shape. taming's num_res_blocks is 2: its Decoder has num_res_blocks + 1 = 3
# ResnetBlocks per level, so block.2 exists as in Chameleon's VQGAN.
N_EMBED = 64          # codebook rows
EMBED_DIM = 8         # codebook vector length
Z_CHANNELS = 16       # post_quant_conv output, conv_in input
CH = 16               # base channels (level 0, full resolution)
CH_MULT = (1, 2, 2)   # levels 0 (full resolution) .. 2 (lowest): 16, 32, 32 channels
NUM_RES_BLOCKS = 2    # taming's parameter: 3 ResnetBlocks per decoder level
GROUPS = 8            # GroupNorm groups (Chameleon has 32; 16 channels need fewer)
EPS = 1e-6            # GroupNorm epsilon (taming's Normalize)
GRID = 4              # GRID x GRID codes per image -> GRID * 2^(levels-1) pixels per side
N_IMAGES = 2


def log(msg):
    """Progress line on stdout (the device run's log)."""
    print("make_vqgan: " + msg, flush=True)


# ---- the model (taming-transformers structure, written from the description) ----

def normalize(c):
    return nn.GroupNorm(num_groups=GROUPS, num_channels=c, eps=EPS, affine=True)


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.cin, self.cout = cin, cout
        self.norm1 = normalize(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2 = normalize(cout)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0)

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        if self.cin != self.cout:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = normalize(c)
        self.q = nn.Conv2d(c, c, 1, 1, 0)
        self.k = nn.Conv2d(c, c, 1, 1, 0)
        self.v = nn.Conv2d(c, c, 1, 1, 0)
        self.proj_out = nn.Conv2d(c, c, 1, 1, 0)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        b, c, hh, ww = q.shape
        q = q.reshape(b, c, hh * ww).permute(0, 2, 1)     # (b, i, c)
        k = k.reshape(b, c, hh * ww)                      # (b, c, j)
        w = torch.bmm(q, k) * (float(c) ** -0.5)          # (b, i, j) = q_i . k_j / sqrt(c)
        w = F.softmax(w, dim=2)                           # over key positions j
        v = v.reshape(b, c, hh * ww)                      # (b, c, j)
        out = torch.bmm(v, w.permute(0, 2, 1))            # (b, c, i) = sum_j v_j w_ij
        return x + self.proj_out(out.reshape(b, c, hh, ww))


class Upsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        n_levels = len(CH_MULT)
        block_in = CH * CH_MULT[-1]
        self.conv_in = nn.Conv2d(Z_CHANNELS, block_in, 3, 1, 1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in)
        self.mid.attn_1 = AttnBlock(block_in)
        self.mid.block_2 = ResnetBlock(block_in, block_in)
        self.up = nn.ModuleList()
        for i_level in reversed(range(n_levels)):
            up = nn.Module()
            up.block = nn.ModuleList()
            up.attn = nn.ModuleList()  # attn_resolutions is empty: no level attention
            block_out = CH * CH_MULT[i_level]
            for _ in range(NUM_RES_BLOCKS + 1):
                up.block.append(ResnetBlock(block_in, block_out))
                block_in = block_out
            if i_level != 0:
                up.upsample = Upsample(block_in)
            self.up.insert(0, up)  # up[0] is the full resolution, up[-1] the lowest
        self.norm_out = normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, 3, 3, 1, 1)

    def forward(self, z):
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for i_level in reversed(range(len(CH_MULT))):
            for blk in self.up[i_level].block:
                h = blk(h)
            if i_level != 0:
                h = self.up[i_level].upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class Quantize(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(N_EMBED, EMBED_DIM)


class VQGANDecode(nn.Module):
    """The decode half of taming's VQModel: codes -> pixels."""

    def __init__(self):
        super().__init__()
        self.quantize = Quantize()
        self.post_quant_conv = nn.Conv2d(EMBED_DIM, Z_CHANNELS, 1)
        self.decoder = Decoder()

    def forward(self, codes):
        n = codes.shape[0]
        z = self.quantize.embedding(codes)                        # (n, h*w, e), rows as stored
        z = z.reshape(n, GRID, GRID, EMBED_DIM).permute(0, 3, 1, 2).contiguous()  # NCHW
        return self.decoder(self.post_quant_conv(z))


# ---- weights ----

def randomize(model, seed):
    """Seeded wide initialisation, rounded to bf16: GroupNorm weights 1 + N(0, 0.1²), biases
    N(0, 0.05²), codebook N(0, 1), convolutions N(0, 1/fan_in). Returns the parameter count."""
    g = torch.Generator().manual_seed(seed)
    count = 0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(tuple(p.shape), generator=g, dtype=torch.float32)
            if name == "quantize.embedding.weight":
                value = noise
            elif name.endswith("bias"):
                value = 0.05 * noise
            elif p.ndim == 1:
                value = 1.0 + 0.1 * noise
            else:
                fan_in = p.shape[1] * p.shape[2] * p.shape[3]
                value = noise / (fan_in ** 0.5)
            p.copy_(value.to(torch.bfloat16).to(p.dtype))
            count += p.numel()
    return count


def expected_names():
    """Every tensor name of the fixture, from the architecture description (checked against
    the module's state_dict so a naming slip in the model above is caught)."""
    names = ["quantize.embedding.weight", "post_quant_conv.weight", "post_quant_conv.bias",
             "decoder.conv_in.weight", "decoder.conv_in.bias",
             "decoder.norm_out.weight", "decoder.norm_out.bias",
             "decoder.conv_out.weight", "decoder.conv_out.bias"]

    def res(base, nin):
        out = []
        for part in ["norm1", "conv1", "norm2", "conv2"] + (["nin_shortcut"] if nin else []):
            out += ["%s.%s.weight" % (base, part), "%s.%s.bias" % (base, part)]
        return out

    names += res("decoder.mid.block_1", False) + res("decoder.mid.block_2", False)
    for part in ["norm", "q", "k", "v", "proj_out"]:
        names += ["decoder.mid.attn_1.%s.weight" % part, "decoder.mid.attn_1.%s.bias" % part]
    cin = CH * CH_MULT[-1]
    for lvl in reversed(range(len(CH_MULT))):
        cout = CH * CH_MULT[lvl]
        for r in range(NUM_RES_BLOCKS + 1):
            names += res("decoder.up.%d.block.%d" % (lvl, r), cin != cout)
            cin = cout
        if lvl != 0:
            names += ["decoder.up.%d.upsample.conv.weight" % lvl,
                      "decoder.up.%d.upsample.conv.bias" % lvl]
    return sorted(names)


# ---- writers (standard library only) ----

def bf16_bytes(t):
    """Little-endian bf16 bytes of a float tensor whose values are already bf16-exact."""
    bits = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).flatten().tolist()
    return struct.pack("<%dh" % len(bits), *bits)


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, float tensor), stored BF16 in name order, 8-byte aligned header."""
    header, blobs, offset = {}, [], 0
    for name, t in sorted(tensors, key=lambda kv: kv[0]):
        blob = bf16_bytes(t)
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    return 8 + len(text) + offset


def read_safetensors_bf16(path):
    """Independent reader for the round-trip check: name -> (shape, list of bf16 bit patterns)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        out[name] = (h["shape"], list(struct.unpack("<%dh" % (len(raw) // 2), raw)))
    return out


def write_npy(path, values, shape, kind):
    """NumPy format 1.0, C order, little-endian; kind 'f4' (float32) or 'i8' (int64)."""
    descr, fmt = {"f4": ("<f4", "f"), "i8": ("<i8", "q")}[kind]
    if len(shape) == 1:
        shape_txt = "(%d,)" % shape[0]
    else:
        shape_txt = "(" + ", ".join(str(d) for d in shape) + ")"
    head = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_txt)
    pad = 64 - (10 + len(head) + 1) % 64
    head = head + " " * (pad % 64) + "\n"
    count = 1
    for d in shape:
        count *= d
    assert len(values) == count, (len(values), shape)
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00")
        f.write(struct.pack("<H", len(head)))
        f.write(head.encode("latin1"))
        f.write(struct.pack("<%d%s" % (count, fmt), *values))


# ---- main ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--out", default="tests/image/data/vqgan",
                    help="output folder (default: tests/image/data/vqgan)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log("torch %s, python %s, output %s" % (torch.__version__, sys.version.split()[0],
                                              os.path.abspath(args.out)))
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # one reduction order for the float64 reference

    # weights: seeded, bf16-exact, float32 module
    model = VQGANDecode().eval()
    n_params = randomize(model, SEED)
    sd = model.state_dict()
    names, want = sorted(sd.keys()), expected_names()
    if names != want:
        log("state_dict names differ from the description:")
        log("  only in the model: %s" % sorted(set(names) - set(want)))
        log("  only in the description: %s" % sorted(set(want) - set(names)))
        sys.exit(1)
    log("model: %d tensors, %d parameters (codebook %d x %d, z %d, ch %d, ch_mult %s, "
        "%d ResBlocks per level, GroupNorm %d groups)" % (len(names), n_params, N_EMBED,
                                                          EMBED_DIM, Z_CHANNELS, CH,
                                                          list(CH_MULT), NUM_RES_BLOCKS + 1,
                                                          GROUPS))
    for lvl in range(len(CH_MULT)):
        nin = [r for r in range(NUM_RES_BLOCKS + 1)
               if "decoder.up.%d.block.%d.nin_shortcut.weight" % (lvl, r) in sd]
        log("  up.%d: %d channels, nin_shortcut at blocks %s, upsample %s" % (
            lvl, CH * CH_MULT[lvl], nin, "decoder.up.%d.upsample.conv.weight" % lvl in sd))

    # codes: seeded, both ends of the codebook included
    g = torch.Generator().manual_seed(SEED + 1)
    codes = torch.randint(0, N_EMBED, (N_IMAGES, GRID * GRID), generator=g, dtype=torch.int64)
    codes[0, 0], codes[0, 1], codes[1, GRID * GRID - 1] = 0, N_EMBED - 1, N_EMBED - 1
    log("codes: %s" % codes.tolist())

    # reference in float64 on the CPU from the bf16 values
    ref_model = VQGANDecode().eval()
    ref_model.load_state_dict(sd)
    ref_model = ref_model.double()
    with torch.no_grad():
        px64 = ref_model(codes)                       # (n, 3, H, W) float64
        px32 = model(codes)                           # float32 run, for the log only
    side = GRID * 2 ** (len(CH_MULT) - 1)
    assert tuple(px64.shape) == (N_IMAGES, 3, side, side), px64.shape
    rel32 = float((px32.double() - px64).norm() / px64.norm())
    log("pixels: shape %s (NCHW), min %.4f max %.4f mean %.4f std %.4f; float32 run vs float64 "
        "relative L2 %.3g" % (list(px64.shape), float(px64.min()), float(px64.max()),
                              float(px64.mean()), float(px64.std()), rel32))
    if not torch.isfinite(px64).all():
        log("non-finite pixels: refusing to write the fixture")
        sys.exit(1)
    nhwc = px64.permute(0, 2, 3, 1).contiguous().to(torch.float32)  # what flexdiag returns

    # files
    st_path = os.path.join(args.out, "vqgan.safetensors")
    meta = {"format": "pt", "generator": GENERATOR}
    size = write_safetensors(st_path, [(k, v) for k, v in sd.items()], meta)
    back = read_safetensors_bf16(st_path)
    for k, v in sd.items():
        shape, bits = back[k]
        want_bits = v.to(torch.bfloat16).view(torch.int16).flatten().tolist()
        if shape != list(v.shape) or bits != want_bits:
            log("round trip of %s failed" % k)
            sys.exit(1)
    log("wrote %s: %d bytes, %d tensors (BF16), round trip exact" % (st_path, size, len(back)))
    write_npy(os.path.join(args.out, "codes.npy"), codes.flatten().tolist(),
              list(codes.shape), "i8")
    write_npy(os.path.join(args.out, "pixels.npy"), nhwc.flatten().tolist(),
              list(nhwc.shape), "f4")
    doc = {
        "magic": "flexdiag-golden", "version": 1, "generator": GENERATOR,
        "torch": torch.__version__,
        "model": {"layout": "taming-vqgan", "weights": "vqgan.safetensors",
                  "codebook_size": N_EMBED, "embed_dim": EMBED_DIM, "z_channels": Z_CHANNELS,
                  "ch": CH, "ch_mult": list(CH_MULT), "res_blocks": NUM_RES_BLOCKS + 1,
                  "groups": GROUPS, "eps": EPS, "grid": [GRID, GRID],
                  "image": [side, side], "params": n_params, "seed": SEED},
        "arrays": {
            "codes": {"file": "codes.npy", "dtype": "int64", "shape": list(codes.shape)},
            "pixels": {"file": "pixels.npy", "dtype": "float32", "shape": list(nhwc.shape),
                       "layout": "NHWC decoder output, not clamped or scaled"},
        },
    }
    with open(os.path.join(args.out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(args.out, n))
                for n in ["vqgan.safetensors", "codes.npy", "pixels.npy", "golden.json"])
    log("wrote codes.npy %s, pixels.npy %s, golden.json; %d bytes in all" % (
        list(codes.shape), list(nhwc.shape), total))
    log("done")


if __name__ == "__main__":
    main()
