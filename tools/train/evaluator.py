#!/usr/bin/env python3
"""
evaluator.py - a GenEval-style scorer for the toy shapes model.

The detector is a small CNN trained on the procedural data of shapes.py (CenterNet-like): the
image is cut into a 12 x 12 grid of cells and each cell predicts whether an object's centre lies
in it, the object's shape (6 classes) and colour (8 classes) and the centre's offset inside the
cell. Objects never overlap and their centres are >= 1.5 cells apart, so a cell holds at most
one. Detections (cells with p > 0.5 that are the maximum of their 3 x 3 neighbourhood) feed
GenEval's rules (shapes.geneval_check): presence (>= count), exact counts for `counting`
(exclude count + 1), colours, relative position, and our absolute regions.

Training mixes clean renders, renders with a little noise and blur, and - when train.py passes
its VQ-VAE - VQ reconstructions, so that it judges decoded images like clean ones. It also sees
5% empty scenes.

Scoring reads the images `flexdiag generate` wrote, in either layout:
  --layout geneval : DIR/<i:05d>/metadata.jsonl + DIR/<i:05d>/samples/*.png
  --layout plain   : DIR/results.jsonl (prompt, file) matched to --metadata by prompt text
PNGs are read with PIL when it is installed, else with png.py (zlib). Per category it prints
the accuracy of the images, and two references:
  chance   the same images scored against a random prompt of the same category (mean of 8
           draws): what a generator that ignores its prompt (but makes images of the
           category's kind) scores
  oracle   procedural renders of each prompt (shapes.py): the evaluator's ceiling
Usage:
  python3 tools/train/evaluator.py train --out evaluator.pt [--steps 1500] [--device cuda]
  python3 tools/train/evaluator.py score --evaluator DIR/evaluator.pt --images GEN_DIR \
      [--metadata prompts.jsonl] [--json out.json]
"""

import argparse
import glob
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import png  # noqa: E402
import shapes  # noqa: E402

GRID = 12
CHANCE_DRAWS = 8
NS, NC = len(shapes.SHAPES), len(shapes.COLORS)


class Detector(nn.Module):
    def __init__(self, side=96, width=32):
        super().__init__()
        self.side = side
        stride = side // GRID
        layers, c = [], 3

        def block(cin, cout, dil=1):
            return [nn.Conv2d(cin, cout, 3, padding=dil, dilation=dil), nn.BatchNorm2d(cout),
                    nn.ReLU(inplace=True)]
        layers += [nn.Conv2d(c, width, 3, stride=2, padding=1), nn.BatchNorm2d(width),
                   nn.ReLU(inplace=True)] + block(width, width)
        c = width
        stride //= 2
        while stride > 1:
            layers += [nn.MaxPool2d(2)] + block(c, min(2 * c, 128)) + block(min(2 * c, 128),
                                                                           min(2 * c, 128))
            c = min(2 * c, 128)
            stride //= 2
        layers += block(c, c, 2) + block(c, c, 4)
        self.body = nn.Sequential(*layers)
        self.head = nn.Conv2d(c, 1 + NS + NC + 2, 1)

    def forward(self, x):
        return self.head(self.body(x))


def targets(lay, device):
    """Per-cell targets of a layout: obj [B, G, G], shape, color (long), offsets [B, 2, G, G]."""
    side = lay["side"]
    stride = side / GRID
    B = lay["active"].shape[0]
    obj = np.zeros((B, GRID, GRID), np.float32)
    shp = np.zeros((B, GRID, GRID), np.int64)
    col = np.zeros((B, GRID, GRID), np.int64)
    off = np.zeros((B, 2, GRID, GRID), np.float32)
    b, j = np.nonzero(lay["active"])
    gx = np.clip((lay["cx"][b, j] / stride).astype(int), 0, GRID - 1)
    gy = np.clip((lay["cy"][b, j] / stride).astype(int), 0, GRID - 1)
    obj[b, gy, gx] = 1
    shp[b, gy, gx] = lay["shape"][b, j]
    col[b, gy, gx] = lay["color"][b, j]
    off[b, 0, gy, gx] = lay["cx"][b, j] / stride - gx - 0.5
    off[b, 1, gy, gx] = lay["cy"][b, j] / stride - gy - 0.5
    t = lambda a: torch.as_tensor(a, device=device)
    return t(obj), t(shp), t(col), t(off)


def loss_fn(out, tg):
    obj, shp, col, off = tg
    lo = out[:, 0]
    l_obj = F.binary_cross_entropy_with_logits(lo, obj, pos_weight=torch.tensor(4.0,
                                                                                device=lo.device))
    m = obj > 0.5
    if m.any():
        ls = out[:, 1:1 + NS].permute(0, 2, 3, 1)[m]
        lc = out[:, 1 + NS:1 + NS + NC].permute(0, 2, 3, 1)[m]
        lf = out[:, 1 + NS + NC:].permute(0, 2, 3, 1)[m]
        l_cls = F.cross_entropy(ls, shp[m]) + F.cross_entropy(lc, col[m])
        l_off = (lf - off.permute(0, 2, 3, 1)[m]).abs().mean()
    else:
        l_cls = l_off = lo.sum() * 0
    return l_obj + l_cls + l_off


def _amp(device):
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def augment(img, rng, device, vq=None, grid=None):
    """VQ reconstruction of half the images (when vq is given), a 3x3 blur of some others,
    Gaussian noise (sigma up to 0.06) on all."""
    B = img.shape[0]
    u = rng.random(B)
    if vq is not None:
        sel = torch.as_tensor(np.nonzero(u < 0.5)[0], device=img.device)
        if len(sel):
            with torch.no_grad(), _amp(device):
                rec = vq.decode_ids(vq.encode(img[sel])[2], grid).float().clamp(-1, 1)
            img = img.index_copy(0, sel, rec)
    ut = torch.as_tensor(u, device=img.device, dtype=torch.float32)
    blur = F.avg_pool2d(F.pad(img, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    img = torch.where(((ut > 0.5) & (ut < 0.65)).view(B, 1, 1, 1), blur, img)
    noise = torch.as_tensor(rng.standard_normal(img.shape), device=img.device,
                            dtype=torch.float32)
    sig = torch.as_tensor(rng.uniform(0, 0.06, B), device=img.device, dtype=torch.float32)
    return (img + noise * sig.view(B, 1, 1, 1)).clamp(-1, 1)


def train(steps, device="cpu", seed=0, batch=128, side=96, vq=None, grid=24, log=print,
          width=32, seconds=None, window=(5, 20)):
    """Train a detector for `steps` steps, or (steps None) for about `seconds` seconds: the
    step count is fixed from the speed of steps window[0]..window[1] and logged."""
    torch.manual_seed(seed)
    det = Detector(side, width).to(device)
    opt = torch.optim.AdamW(det.parameters(), lr=2e-3, weight_decay=1e-4)
    t0 = time.time()
    step, total = 0, steps
    while total is None or step < total:
        m1, m2 = window
        if total is None and step == m1:
            tm = time.time()
        if total is None and step == m2:
            rate = (m2 - m1) / max(time.time() - tm, 1e-6)
            total = max(m2 + 1, m2 + int(rate * (seconds - (time.time() - t0))))
            log("evaluator: %.1f steps/s, %d steps" % (rate, total))
        steps_now = total if total is not None else 10 ** 9
        rng = np.random.default_rng([seed, 3, step])
        specs = [shapes.sample_spec(rng) for _ in range(batch)]
        lay = shapes.layout(rng, specs, side)
        empty = rng.random(batch) < 0.05
        lay["active"][empty] = False
        img = shapes.render(lay, device)
        img = augment(img, rng, device, vq, grid)
        lr = 2e-3 * min(1.0, (step + 1) / 100) * (0.5 * (1 + np.cos(np.pi * step / steps_now)))
        for g in opt.param_groups:
            g["lr"] = lr
        with _amp(device):
            out = det(img)
        loss = loss_fn(out.float(), targets(lay, device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 200 == 0 or step == steps_now - 1:
            log("evaluator step %d/%s loss %.4f (%.0fs)" % (step, total, loss.item(),
                                                            time.time() - t0))
        step += 1
    det.eval()
    return det


@torch.no_grad()
def detect(det, imgs, device="cpu", thresh=0.5, bs=64):
    """imgs: uint8 [N, H, W, 3] or float [N, 3, H, W] in [-1, 1] -> list of object lists."""
    det.eval()
    out = []
    for i in range(0, len(imgs), bs):
        x = imgs[i:i + bs]
        if isinstance(x, np.ndarray):
            x = torch.as_tensor(x, device=device).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        x = x.to(device).float()
        if x.shape[-1] != det.side:
            x = F.interpolate(x, size=(det.side, det.side), mode="bilinear", align_corners=False)
        o = det(x).float()
        p = torch.sigmoid(o[:, 0])
        peak = F.max_pool2d(p.unsqueeze(1), 3, 1, 1).squeeze(1)
        keep = (p > thresh) & (p >= peak)
        sh = o[:, 1:1 + NS].argmax(1)
        co = o[:, 1 + NS:1 + NS + NC].argmax(1)
        stride = det.side / GRID
        for b in range(o.shape[0]):
            objs = []
            for gy, gx in keep[b].nonzero().tolist():
                objs.append({"shape": shapes.SHAPES[sh[b, gy, gx]],
                             "color": shapes.COLORS[co[b, gy, gx]],
                             "cx": float((gx + 0.5 + o[b, 1 + NS + NC, gy, gx]) * stride),
                             "cy": float((gy + 0.5 + o[b, 2 + NS + NC, gy, gx]) * stride),
                             "score": float(p[b, gy, gx])})
            out.append(objs)
    return out


def save(det, path):
    torch.save({"state": det.state_dict(), "side": det.side,
                "width": det.body[0].out_channels}, path)


def load(path, device="cpu"):
    try:
        d = torch.load(path, map_location=device, weights_only=False)
    except TypeError:
        d = torch.load(path, map_location=device)
    det = Detector(d["side"], d.get("width", 32)).to(device)
    det.load_state_dict(d["state"])
    det.eval()
    return det


# ---- scoring ----

def score_records(det, metas, images, side, device="cpu"):
    """metas[i] the GenEval record of images[i] (uint8 [N, H, W, 3]); returns per-image
    correctness list."""
    dets = detect(det, images, device)
    ok = []
    for m, d in zip(metas, dets):
        ok.append(shapes.geneval_check(m, d, side)[0])
    return ok, dets


def summarise(metas, ok):
    cats = {}
    for m, c in zip(metas, ok):
        cats.setdefault(m["tag"], []).append(c)
    res = {t: float(np.mean(v)) for t, v in cats.items()}
    res["overall"] = float(np.mean(list(res.values()))) if res else 0.0  # GenEval: mean of tags
    return res, {t: len(v) for t, v in cats.items()}


def reassign(metas, rng):
    """For each record a random record of the same tag (itself included)."""
    by_tag = {}
    for i, m in enumerate(metas):
        by_tag.setdefault(m["tag"], []).append(i)
    return [metas[by_tag[m["tag"]][int(rng.integers(len(by_tag[m["tag"]])))]] for m in metas]


def oracle_images(metas, side, seed=0):
    rng = np.random.default_rng([seed, 5])
    lay = shapes.layout(rng, [m["spec"] for m in metas], side)
    return shapes.to_uint8(shapes.render(lay))


def full_report(det, metas, images, side, device="cpu", seed=0, oracle=True):
    """Accuracy per category for images, the chance reference and the oracle."""
    ok, dets = score_records(det, metas, images, side, device)
    res, n = summarise(metas, ok)
    rng = np.random.default_rng([seed, 9])
    draws = []
    for _ in range(CHANCE_DRAWS):
        ch_ok = [shapes.geneval_check(m, d, side)[0] for m, d in zip(reassign(metas, rng), dets)]
        draws.append(summarise(metas, ch_ok)[0])
    chance = {k: float(np.mean([d[k] for d in draws])) for k in draws[0]}
    orc = None
    if oracle and all("spec" in m for m in metas):
        o_ok, _ = score_records(det, metas, oracle_images(metas, side, seed), side, device)
        orc, _ = summarise(metas, o_ok)
    return {"images": res, "chance": chance, "oracle": orc, "n": n}


def print_report(rep, out=sys.stdout):
    tags = [t for t in rep["n"]]
    out.write("%-14s %6s %8s %8s %8s\n" % ("category", "n", "images", "chance", "oracle"))
    for t in tags + ["overall"]:
        o = rep["oracle"][t] if rep["oracle"] else float("nan")
        out.write("%-14s %6s %8.3f %8.3f %8.3f\n" % (t, rep["n"].get(t, sum(rep["n"].values())),
                                                    rep["images"][t], rep["chance"][t], o))
    out.flush()


def load_generated(folder, metadata=None):
    """(metas, uint8 images) of a flexdiag generate --out folder (geneval or plain layout)."""
    metas, imgs = [], []
    subs = sorted(glob.glob(os.path.join(folder, "[0-9][0-9][0-9][0-9][0-9]", "metadata.jsonl")))
    if subs:
        for mpath in subs:
            with open(mpath) as f:
                meta = json.loads(f.readline())
            for p in sorted(glob.glob(os.path.join(os.path.dirname(mpath), "samples", "*.png"))):
                metas.append(meta)
                imgs.append(png.read(p))
        return metas, np.stack(imgs)
    res = os.path.join(folder, "results.jsonl")
    if not os.path.exists(res):
        raise SystemExit("evaluator: %s has neither <index>/metadata.jsonl (geneval layout) nor "
                         "results.jsonl (plain layout)" % folder)
    by_prompt = {}
    if metadata:
        with open(metadata) as f:
            for line in f:
                if line.strip():
                    m = json.loads(line)
                    by_prompt.setdefault(m["prompt"], m)
    with open(res) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if not r.get("file"):
                continue
            m = by_prompt.get(r["prompt"])
            if m is None:
                raise SystemExit("evaluator: prompt %r of %s is not in --metadata (plain layout "
                                 "needs the prompts.jsonl the prompts came from)"
                                 % (r["prompt"], res))
            metas.append(m)
            imgs.append(png.read(os.path.join(folder, r["file"])))
    return metas, np.stack(imgs)


def main():
    ap = argparse.ArgumentParser(description="GenEval-style scorer for the toy shapes model")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the detector on procedural data")
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--batch", type=int, default=128)
    t.add_argument("--side", type=int, default=96)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    s = sub.add_parser("score", help="score a folder written by flexdiag generate")
    s.add_argument("--evaluator", required=True, help="evaluator.pt (train.py writes "
                   "DIR/evaluator.pt)")
    s.add_argument("--images", required=True, help="flexdiag generate --out folder")
    s.add_argument("--metadata", help="prompts.jsonl (needed for --layout plain folders)")
    s.add_argument("--json", help="append the report as one JSON line to this file")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    if a.cmd == "train":
        det = train(a.steps, a.device, a.seed, a.batch, a.side)
        save(det, a.out)
        print("wrote %s" % a.out)
        return
    det = load(a.evaluator, a.device)
    metas, imgs = load_generated(a.images, a.metadata)
    rep = full_report(det, metas, imgs, det.side, a.device, a.seed)
    print("%d images from %s" % (len(imgs), a.images))
    print_report(rep)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(dict(rep, images_dir=a.images)) + "\n")


if __name__ == "__main__":
    main()
