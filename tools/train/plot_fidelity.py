#!/usr/bin/env python3
"""
plot_fidelity.py - KL and top-1 agreement of the KV policies against sparsity, drawn as PNGs;
optionally the evaluator's score of the generated images too.

Reads the JSON lines that `compare_policies.py --json FILE` writes (one row per prompt, policy
and sparsity: fields policy, sparsity, kl, top1, attn_err, prompt_text), averages each metric
over the prompts of every (policy, sparsity) and draws one line per policy:

  fidelity_kl.png     mean KL(dense || policy) of the CFG next-token distribution, log-scale y
  fidelity_top1.png   mean top-1 agreement with dense, linear y

With --scores FILE (the JSON lines `score_policies.py --json FILE` writes: one row per policy and
sparsity, fields policy, sparsity (null for dense), overall, categories) it also draws

  policy_scores.png   the evaluator's overall score against sparsity, one line per sparse
                      policy (rows of one (policy, sparsity) averaged), dense as a horizontal
                      dashed line, linear y

  /usr/bin/python3 tools/train/plot_fidelity.py [--json bench/figures/fidelity_shapes_janus.jsonl]
      [--out bench/figures] [--scores bench/figures/policy_scores_full_shapes_janus.jsonl]

No matplotlib/PIL: the charts are drawn into numpy arrays (a 5x7 bitmap font, lines, squares)
and written with png.py. The drawing kit below (Canvas, FONT, ramp) is shared with
attention_maps.py.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import png  # noqa: E402

# ---------------------------------------------------------------- drawing kit

# 5x7 font: 7 rows of 5 bits (bit 4 = leftmost column), two hex digits per row.
FONT = {
    "0": "0E11131519110E", "1": "040C040404040E", "2": "0E11010204081F",
    "3": "1F02040201110E", "4": "02060A121F0202", "5": "1F101E0101110E",
    "6": "0608101E11110E", "7": "1F010204080808", "8": "0E11110E11110E",
    "9": "0E11110F01020C", "A": "0E1111111F1111", "B": "1E11111E11111E",
    "C": "0E11101010110E", "D": "1C12111111121C", "E": "1F10101E10101F",
    "F": "1F10101E101010", "G": "0E11101711110F", "H": "1111111F111111",
    "I": "0E04040404040E", "J": "0702020202120C", "K": "11121418141211",
    "L": "1010101010101F", "M": "111B1515111111", "N": "11111915131111",
    "O": "0E11111111110E", "P": "1E11111E101010", "Q": "0E11111115120D",
    "R": "1E11111E141211", "S": "0F10100E01011E", "T": "1F040404040404",
    "U": "1111111111110E", "V": "11111111110A04", "W": "1111111515150A",
    "X": "11110A040A1111", "Y": "1111110A040404", "Z": "1F01020408101F",
    "-": "0000001F000000", ".": "00000000000C0C", ":": "000C0C000C0C00",
    "=": "00001F001F0000", "/": "00010204081000", "(": "02040808080402",
    ")": "08040202020408", "_": "0000000000001F", ",": "000000000C0408",
    "%": "18190204081303", "+": "0004041F040400", " ": "00000000000000",
    "<": "02040810080402", ">": "08040201020408", "|": "04040404040404",
}


def glyph(ch):
    h = FONT.get(ch.upper(), "1F11111111111F")     # unknown characters: a box
    rows = [int(h[2 * i:2 * i + 2], 16) for i in range(7)]
    return np.array([[(r >> (4 - c)) & 1 for c in range(5)] for r in rows], bool)


class Canvas:
    """An RGB image with the few primitives the charts need (coordinates x right, y down)."""

    def __init__(self, w, h, bg=(255, 255, 255)):
        self.img = np.empty((h, w, 3), np.uint8)
        self.img[:] = bg

    @property
    def w(self):
        return self.img.shape[1]

    @property
    def h(self):
        return self.img.shape[0]

    def rect(self, x0, y0, x1, y1, col):
        """Filled rectangle [x0, x1) x [y0, y1), clipped."""
        x0, x1 = max(int(x0), 0), min(int(x1), self.w)
        y0, y1 = max(int(y0), 0), min(int(y1), self.h)
        if x0 < x1 and y0 < y1:
            self.img[y0:y1, x0:x1] = col

    def frame(self, x0, y0, x1, y1, col=(0, 0, 0)):
        self.rect(x0, y0, x1, y0 + 1, col)
        self.rect(x0, y1 - 1, x1, y1, col)
        self.rect(x0, y0, x0 + 1, y1, col)
        self.rect(x1 - 1, y0, x1, y1, col)

    def line(self, xa, ya, xb, yb, col, width=1):
        n = int(max(abs(xb - xa), abs(yb - ya))) + 1
        for s in np.linspace(0.0, 1.0, n + 1):
            x, y = xa + s * (xb - xa), ya + s * (yb - ya)
            r = width // 2
            self.rect(round(x) - r, round(y) - r, round(x) - r + width, round(y) - r + width, col)

    def text(self, x, y, s, col=(0, 0, 0), scale=1):
        """5x7 glyphs, 6*scale px per character; (x, y) the top left corner."""
        for i, ch in enumerate(str(s)):
            g = glyph(ch)
            ys, xs = np.nonzero(g)
            for yy, xx in zip(ys, xs):
                self.rect(x + (6 * i + xx) * scale, y + yy * scale,
                          x + (6 * i + xx + 1) * scale, y + (yy + 1) * scale, col)

    def blit(self, x, y, rgb):
        h, w, _ = rgb.shape
        self.img[y:y + h, x:x + w] = rgb

    def save(self, path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        png.write(path, self.img)


def text_w(s, scale=1):
    return 6 * scale * len(str(s))


# black -> purple -> red -> orange -> yellow -> white (an "inferno"-like ramp written by hand)
RAMP = np.array([[0, 0, 0], [60, 10, 110], [170, 30, 90], [235, 90, 30], [250, 200, 40],
                 [255, 255, 230]], np.float64)


def ramp(v):
    """v in [0, 1] (any shape) -> uint8 RGB [..., 3]."""
    v = np.clip(np.asarray(v, np.float64), 0.0, 1.0) * (len(RAMP) - 1)
    i = np.minimum(np.floor(v).astype(int), len(RAMP) - 2)
    f = (v - i)[..., None]
    return (RAMP[i] * (1 - f) + RAMP[i + 1] * f).round().astype(np.uint8)


# 8 distinct line colours
COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (23, 190, 207), (127, 127, 127), (188, 189, 34)]


def line_chart(path, title, xs_labels, series, ylog, ylabel, hlines=()):
    """series: [(name, [y per x or None])]; x categorical (equally spaced; a label may have a
    second line after a newline), y log10 if ylog. hlines: [(name, y, rgb)], each drawn as a
    horizontal dashed line across the plot and listed after the series in the legend."""
    W, H, L, R, T, B = 900, 570, 80, 250, 50, 70
    c = Canvas(W, H)
    px0, px1, py0, py1 = L, W - R, T, H - B
    vals = [v for _, ys in series for v in ys if v is not None and (v > 0 or not ylog)]
    vals += [v for _, v, _ in hlines if v is not None and (v > 0 or not ylog)]
    if ylog:
        lo = math.floor(math.log10(min(vals)))
        hi = math.ceil(math.log10(max(vals)))
        hi = max(hi, lo + 1)
        f = lambda v: (math.log10(v) - lo) / (hi - lo)            # noqa: E731
        ticks = [(10.0 ** e, "1E%d" % e) for e in range(lo, hi + 1)]
    else:
        step = 0.05 if max(vals) - min(vals) <= 0.4 else 0.1
        lo = math.floor(min(vals) / step) * step
        hi = max(min(1.0, math.ceil(max(vals) / step) * step), lo + step)
        f = lambda v: (v - lo) / (hi - lo)                          # noqa: E731
        ticks = [(lo + k * step, "%.2f" % (lo + k * step))
                 for k in range(int(round((hi - lo) / step)) + 1)]
    ypix = lambda v: py1 - f(v) * (py1 - py0)                       # noqa: E731
    n = len(xs_labels)
    xpix = lambda i: px0 + 40 + i * (px1 - px0 - 80) / max(n - 1, 1)  # noqa: E731
    for v, lab in ticks:                                             # grid and y ticks
        y = int(round(ypix(v)))
        c.rect(px0, y, px1, y + 1, (225, 225, 225))
        c.rect(px0 - 5, y, px0, y + 1, (0, 0, 0))
        c.text(px0 - 8 - text_w(lab), y - 3, lab)
        if ylog and v < 10 ** hi:                                    # minor log ticks
            for m in range(2, 10):
                ym = int(round(ypix(v * m)))
                c.rect(px0 - 3, ym, px0, ym + 1, (0, 0, 0))
    for i, lab in enumerate(xs_labels):                              # x ticks, 2 lines
        x = int(round(xpix(i)))
        c.rect(x, py1, x + 1, py1 + 5, (0, 0, 0))
        for k, part in enumerate(lab.split("\n")):
            c.text(x - text_w(part) // 2, py1 + 9 + 11 * k, part)
    c.frame(px0, py0, px1 + 1, py1 + 1)
    c.text((px0 + px1) // 2 - text_w("SPARSITY") // 2, py1 + 36, "SPARSITY")
    c.text(8, py0 - 20, ylabel)
    c.text(W // 2 - text_w(title, 2) // 2, 12, title, scale=2)
    for k, (name, ys) in enumerate(series):                          # lines, markers, legend
        col = COLOURS[k % len(COLOURS)]
        pts = [(xpix(i), ypix(v)) for i, v in enumerate(ys) if v is not None
               and (v > 0 or not ylog)]
        for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
            c.line(xa, ya, xb, yb, col, width=2)
        for x, y in pts:
            c.rect(x - 3, y - 3, x + 4, y + 4, col)
        ly = py0 + 10 + 22 * k
        c.rect(px1 + 20, ly, px1 + 32, ly + 12, col)
        c.text(px1 + 40, ly + 1, name, scale=1)
    for j, (name, v, col) in enumerate(hlines):                      # dashed reference lines
        if v is None or (ylog and v <= 0):
            continue
        y = int(round(ypix(v)))
        for x in range(px0 + 2, px1 - 1, 12):
            c.rect(x, y - 1, min(x + 7, px1 - 1), y + 1, col)
        ly = py0 + 10 + 22 * (len(series) + j) + 5
        c.rect(px1 + 14, ly, px1 + 21, ly + 2, col)
        c.rect(px1 + 26, ly, px1 + 33, ly + 2, col)
        c.text(px1 + 40, ly - 2, name, scale=1)
    c.save(path)


# ---------------------------------------------------------------- evaluator score chart

def scores_chart(path, out):
    """policy_scores.png from score_policies.py's JSON lines: overall score per policy and
    sparsity (mean of the rows of each pair), dense as a dashed horizontal line."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    dense = [r["overall"] for r in rows if r["sparsity"] is None and r.get("overall") is not None]
    sparse = [r for r in rows if r["sparsity"] is not None]
    if not sparse:
        sys.exit("plot_fidelity: %s has no sparse policy rows" % path)
    policies = []
    for r in sparse:
        if r["policy"] not in policies:
            policies.append(r["policy"])
    sps = sorted({r["sparsity"] for r in sparse})

    def mean(pol, s):
        v = [r["overall"] for r in sparse if r["policy"] == pol and r["sparsity"] == s
             and r.get("overall") is not None]
        return sum(v) / len(v) if v else None

    d = sum(dense) / len(dense) if dense else None
    n_img = sorted({r.get("n_images") for r in rows if r.get("n_images")})
    print("%d score rows, policies %s, sparsities %s, dense %s" % (
        len(rows), policies, sps, "-" if d is None else "%.4f" % d))
    print("| policy | " + " | ".join("score@%g" % s for s in sps) + " |")
    for p in policies:
        print("| %s | " % p + " | ".join("-" if mean(p, s) is None else "%.4f" % mean(p, s)
                                          for s in sps) + " |")
    n_att = {}
    for r in sparse:
        n_att.setdefault(r["sparsity"], r.get("n_att"))
    xl = ["%g" % s + ("\nN_ATT %d" % n_att[s] if n_att.get(s) else "") for s in sps]
    sub = " (%d IMAGES EACH)" % n_img[0] if len(n_img) == 1 else ""
    png_path = os.path.join(out, "policy_scores.png")
    line_chart(png_path, "EVALUATOR SCORE" + sub, xl,
               [(p, [mean(p, s) for s in sps]) for p in policies], False, "OVERALL SCORE",
               hlines=[("dense %.3f" % d, d, (0, 0, 0))] if d is not None else [])
    print("wrote %s" % png_path)


# ---------------------------------------------------------------- fidelity charts

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="bench/figures/fidelity_shapes_janus.jsonl",
                    help="compare_policies.py --json output")
    ap.add_argument("--out", default="bench/figures")
    ap.add_argument("--scores", default=None, metavar="FILE",
                    help="score_policies.py --json output: also draw policy_scores.png "
                         "(default: off)")
    a = ap.parse_args()
    with open(a.json) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    policies = []
    for r in rows:
        if r["policy"] not in policies:
            policies.append(r["policy"])
    sps = sorted({r["sparsity"] for r in rows})
    n_prompts = len({r.get("prompt_text") for r in rows})

    def mean(pol, s, key):
        v = [r[key] for r in rows if r["policy"] == pol and r["sparsity"] == s
             and r.get(key) is not None]
        return sum(v) / len(v) if v else None

    print("%d rows, %d prompts, policies %s, sparsities %s" % (len(rows), n_prompts,
                                                               policies, sps))
    print("| policy | " + " | ".join("KL@%g" % s for s in sps) + " | "
          + " | ".join("top1@%g" % s for s in sps) + " |")
    fmt = lambda v, f: "-" if v is None else f % v                 # noqa: E731
    for p in policies:
        print("| %s | " % p + " | ".join(fmt(mean(p, s, "kl"), "%.4g") for s in sps) + " | "
              + " | ".join(fmt(mean(p, s, "top1"), "%.4f") for s in sps) + " |")
    n_att = {r["sparsity"]: r.get("n_att") for r in rows}
    xl = ["%g" % s + ("\nN_ATT %d" % n_att[s] if n_att[s] else "") for s in sps]
    sub = " (MEAN OF %d PROMPTS)" % n_prompts
    line_chart(os.path.join(a.out, "fidelity_kl.png"), "KL(DENSE||POLICY)" + sub, xl,
               [(p, [mean(p, s, "kl") for s in sps]) for p in policies], True, "KL (LOG)")
    line_chart(os.path.join(a.out, "fidelity_top1.png"), "TOP-1 AGREEMENT" + sub, xl,
               [(p, [mean(p, s, "top1") for s in sps]) for p in policies], False, "TOP-1")
    print("wrote %s/fidelity_kl.png, %s/fidelity_top1.png" % (a.out, a.out))
    if a.scores:
        scores_chart(a.scores, a.out)


if __name__ == "__main__":
    main()
