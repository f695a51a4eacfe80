#!/usr/bin/env python3
"""
attention_maps.py - what the trained Janus model attends to: per-layer and per-head attention
maps over the 24 x 24 image tokens, the attention mass per lag, and how much of it a budget of
N_att = 29 tokens captures along the best fixed lags (Diagonal) vs the 29 most recent tokens
(sliding window).

For each caption it samples one image with CFG (PyTorch KV-cache sampler, lm.generate, seeded as
check_logits.py does), then runs ONE teacher-forced forward of the conditional row (prompt +
image tokens 0..574) with the model's own weights but an explicit softmax, so the attention
probabilities of every layer and head are kept. That forward must reproduce the model's logits:
the relative L2 against lm.generate's KV-cache conditional logits (and against forward_train)
is printed.

Lags. Row t of a map is the query that predicts image token t (the hidden of token t-1; t = 0 is
the <begin_of_image> prompt row); column j is image token j < t. Lag d = t - j >= 1: d = 1 the
left neighbour of the token being predicted, d = 24 the token above it, d = 23 / 25 above-right /
above-left, d = 48 two rows up. flexdiag numbers lags from the query's own token (lag 0 = the
token written at this step): flexdiag lag = d - 1. The window of N_att tokens is d = 1..N_att;
the Diagonal candidates are d = 1..N_r (N_r = 288, the default ring at 576 decode tokens).

Writes (bench/figures/ by default):
  attn_layers.png        per layer, mean over heads and captions: the 576 x 576 image-query x
                         image-key map (log10 p, clipped at 1e-4; 2 x 2 mean-pooled), and below it
                         a 3x zoom of queries 288..335 x keys 240..335
  attn_heads_layerK.png  the same for every head of layer K (--head-layers, default: the layer
                         with the most mass on d = 23..25 and the one the window serves worst)
  attn_lag_profile.png   mean attention mass vs lag d = 1..576 per layer (log y), the prompt's
                         share as a separate bar; the window d <= 29 shaded, N_r = 288 marked
  attn_samples.png       the sampled images
and prints the per-layer lag table and the N_att captured-mass comparison.

  /usr/bin/python3 tools/train/attention_maps.py [--model models/shapes-janus] [--out bench/figures]
      [--captions "two red circles on the left;a blue square;three green stars;a triangle above a circle"]
      [--cfg 5] [--seed 0] [--n-att 29] [--n-r 288] [--head-layers auto|K[,K]]
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from check_logits import load_exported, rel_l2  # noqa: E402
from plot_fidelity import Canvas, ramp, text_w  # noqa: E402

CAPTIONS = "two red circles on the left;a blue square;three green stars;a triangle above a circle"
LOG_MIN = -4.0                      # maps: log10 p clipped here
MASKED = (200, 200, 200)            # colour of keys a query cannot see (j >= t)


# ---------------------------------------------------------------- model side

@torch.no_grad()
def forward_with_probs(lm, pids, img):
    """Teacher-forced conditional row [prompt, image tokens 0..n-2] (positions 0..T-1, as
    forward_train and flexdiag lay them out). Returns the n image logits [n, V] and the softmax
    probabilities of every layer, [L][H, T, T] (float32)."""
    tc = lm.tc
    H, Hkv, dh = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    x = torch.cat([lm.embed_tokens(torch.tensor(pids)), lm.image_embed(img[:-1])], 0)
    T = x.shape[0]
    cos, sin = models.rope_tables(torch.arange(T), dh, tc["rope_theta"], x.device)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs = []
    for layer in lm.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(T, H, dh).transpose(0, 1)
        k = a.k_proj(h).view(T, Hkv, dh).transpose(0, 1)
        v = a.v_proj(h).view(T, Hkv, dh).transpose(0, 1)
        q = q * cos + models.rotate_half(q) * sin
        k = k * cos + models.rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, 0), v.repeat_interleave(H // Hkv, 0)
        s = (q @ k.transpose(1, 2)).float() * dh ** -0.5
        p = torch.softmax(s.masked_fill(future, float("-inf")), -1)
        x = x + a.o_proj((p @ v).transpose(0, 1).reshape(T, H * dh))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        probs.append(p)
    P = len(pids)
    return lm.generation_head(lm.norm(x)[P - 1:]).float(), probs


def image_block(p, P, n):
    """[H, T, T] probabilities -> image block [H, n, n] (row t: the query predicting token t,
    column j: image token j; column n-1 is never visible) and the prompt share [H, n]."""
    rows = p[:, P - 1:P - 1 + n]
    blk = np.zeros((p.shape[0], n, n), np.float32)
    blk[:, :, :n - 1] = rows[:, :, P:P + n - 1].numpy()
    return blk, rows[:, :, :P].sum(-1).numpy()


def lag_mass(blk):
    """[..., n, n] block -> [..., n + 1] mean over the n queries of the mass at lag d = t - j
    (index d; index 0 unused)."""
    n = blk.shape[-1]
    t, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    ok = j < t
    d = (t - j)[ok]
    flat = blk.reshape(-1, n, n)[:, ok]
    out = np.stack([np.bincount(d, weights=f, minlength=n + 1) for f in flat]) / n
    return out.reshape(blk.shape[:-2] + (n + 1,))


# ---------------------------------------------------------------- drawing

PANEL, ZOOM_ROWS, ZOOM_COLS, ZOOM_X = 288, (288, 336), (240, 336), 3


def log_rgb(m, valid):
    """probabilities + visibility mask -> RGB (log10, LOG_MIN .. 0), invisible cells grey."""
    v = (np.log10(np.maximum(m, 10 ** LOG_MIN)) - LOG_MIN) / -LOG_MIN
    rgb = ramp(v)
    rgb[~valid] = MASKED
    return rgb


def map_panel(blk):
    """[n, n] map -> (full map 2x2 mean-pooled over visible cells, 3x zoom crop) as RGB."""
    n = blk.shape[0]
    valid = np.arange(n)[None, :] < np.arange(n)[:, None]
    f = n // PANEL
    cnt = valid.reshape(PANEL, f, PANEL, f).sum((1, 3))
    pooled = blk.reshape(PANEL, f, PANEL, f).sum((1, 3)) / np.maximum(cnt, 1)
    full = log_rgb(pooled, cnt > 0)
    r, c = slice(*ZOOM_ROWS), slice(*ZOOM_COLS)
    zoom = log_rgb(blk[r, c], valid[r, c])
    zoom = zoom.repeat(ZOOM_X, 0).repeat(ZOOM_X, 1)
    return full, zoom


def panel_grid(path, title, panels, cols=4):
    """panels: [(label, [n, n] map)] -> one PNG: label, full map, zoom, a colour bar."""
    pw, ph = PANEL, 14 + PANEL + 6 + (ZOOM_ROWS[1] - ZOOM_ROWS[0]) * ZOOM_X
    gap, top = 14, 34
    rows = (len(panels) + cols - 1) // cols
    W = cols * (pw + gap) + gap
    Hh = top + rows * (ph + gap) + 50
    c = Canvas(W, Hh)
    c.text(gap, 10, title, scale=2)
    for i, (label, blk) in enumerate(panels):
        full, zoom = map_panel(blk)
        x, y = gap + (i % cols) * (pw + gap), top + (i // cols) * (ph + gap)
        c.text(x, y, label)
        c.blit(x, y + 14, full)
        c.blit(x, y + 14 + PANEL + 6, zoom)
        zx = (ZOOM_COLS[1] - ZOOM_COLS[0]) * ZOOM_X
        c.frame(x - 1, y + 14 + PANEL + 5, x + zx + 1,
                y + 14 + PANEL + 7 + (ZOOM_ROWS[1] - ZOOM_ROWS[0]) * ZOOM_X, (0, 0, 0))
        # mark the zoom's rectangle on the full map
        zr = [v // (blk.shape[0] // PANEL) for v in ZOOM_ROWS + ZOOM_COLS]
        c.frame(x + zr[2], y + 14 + zr[0], x + zr[3], y + 14 + zr[1], (0, 200, 255))
    y = Hh - 40                                                   # colour bar
    bar = ramp(np.linspace(0, 1, 300))[None].repeat(12, 0)
    c.blit(gap + 60, y, bar)
    c.text(gap, y + 2, "LOG10 P")
    for e in range(int(LOG_MIN), 1):
        xx = gap + 60 + int((e - LOG_MIN) / -LOG_MIN * 299)
        c.rect(xx, y + 12, xx + 1, y + 17, (0, 0, 0))
        c.text(xx - text_w(str(e)) // 2, y + 20, str(e))
    c.rect(gap + 380, y, gap + 392, y + 12, MASKED)
    c.text(gap + 398, y + 2, "NOT VISIBLE (J >= T).  ROWS: QUERY PREDICTING TOKEN T, "
           "COLUMNS: KEY TOKEN J.  ZOOM: T 288-335, J 240-335 (3X)")
    c.save(path)


HOT = (1, 23, 24, 25, 48)             # lags drawn in red


def lag_bars(c, x0, y0, ph, prof, d_max, px, n_att, n_r, labels):
    """One bar chart of prof[1..d_max] (log10, -5..0) at px pixels per lag, bottom at y0 + ph."""
    lo, yb, w = -5.0, y0 + ph, d_max * px
    ypx = lambda v: yb - (np.log10(max(v, 10 ** lo)) - lo) / -lo * ph      # noqa: E731
    c.rect(x0, y0, x0 + min(n_att, d_max) * px, yb, (220, 232, 250))       # window shading
    if n_r <= d_max:
        c.rect(x0 + n_r * px - 1, y0, x0 + n_r * px, yb, (240, 150, 0))    # ring size
    for e in (-4, -2, 0):                                                  # y grid + labels
        yy = int(ypx(10.0 ** e))
        c.rect(x0, yy, x0 + w, yy + 1, (225, 225, 225))
        c.text(x0 - 8 - text_w(str(e)), yy - 3, str(e))
    bw = max(px - 1, 1)
    for d in range(1, d_max + 1):
        if prof[d] > 10 ** lo:
            c.rect(x0 + (d - 1) * px, int(ypx(prof[d])), x0 + (d - 1) * px + bw, yb,
                   (200, 30, 30) if d in HOT else (40, 80, 170))
    c.rect(x0, yb, x0 + w, yb + 1, (0, 0, 0))
    c.rect(x0 - 1, y0, x0, yb + 1, (0, 0, 0))
    for d in range(24, d_max + 1, 24):                                     # a tick per image row
        xc = x0 + (d - 1) * px + bw // 2
        c.rect(xc, yb, xc + 1, yb + (5 if d in (24, 48) else 3), (0, 0, 0))
    for d in labels:
        xc = x0 + (d - 1) * px + bw // 2
        c.text(max(xc - text_w(str(d)) // 2, x0), yb + 7, str(d))
    return ypx


def lag_chart(path, prof, prompt, n_att, n_r):
    """prof [L, n+1] mean mass per lag, prompt [L] prompt share -> one row of charts per layer:
    the prompt's share, lags 1..n (1 px each), lags 1..96 (3 px each)."""
    L, n = prof.shape[0], prof.shape[1] - 1
    left, ph, gap, top, zx = 110, 84, 20, 38, 3
    x2 = left + n + 60
    W, Hh = x2 + 96 * zx + 20, top + L * (ph + gap) + 20
    c = Canvas(W, Hh)
    c.text(10, 8, "MEAN ATTENTION MASS PER LAG D = T - J (LOG10 -5..0, MEAN OVER HEADS, QUERIES "
           "AND CAPTIONS).  P: THE PROMPT SHARE.  RED BARS: D = 1, 23, 24, 25, 48")
    c.text(10, 20, "SHADED: THE WINDOW D <= %d.  ORANGE LINE: N_R = %d.  TICKS EVERY 24 LAGS "
           "(ONE IMAGE ROW).  RIGHT: LAGS 1-96 ENLARGED" % (n_att, n_r))
    for l in range(L):
        y0 = top + l * (ph + gap)
        ypx = lag_bars(c, left, y0, ph, prof[l], n, 1, n_att, n_r, (1, 24, 48, 96, 192, 288, 576))
        lag_bars(c, x2, y0, ph, prof[l], 96, zx, n_att, n_r, (1, 24, 48, 72, 96))
        c.text(4, y0 + 2, "LAYER %d" % l)
        c.text(4, y0 + 14, "P=%.2f" % prompt[l])
        c.rect(56, int(ypx(prompt[l])), 72, y0 + ph, (40, 160, 60))             # prompt bar
        c.text(62, y0 + ph + 7, "P")
    c.save(path)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/shapes-janus")
    ap.add_argument("--out", default="bench/figures")
    ap.add_argument("--captions", default=CAPTIONS, help="';'-separated")
    ap.add_argument("--cfg", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-att", type=int, default=29)
    ap.add_argument("--n-r", type=int, default=288)
    ap.add_argument("--head-layers", default="auto", help="'auto' or comma list of layers")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    lm, vq, tok, cfg = load_exported(a.model)
    grid = cfg["vq_config"]["num_patches"]
    n = grid * grid
    caps = [s.strip() for s in a.captions.split(";") if s.strip()]
    L, H = len(lm.layers), lm.tc["num_attention_heads"]
    acc = np.zeros((L, H, n, n), np.float32)         # sum over captions of the image blocks
    accp = np.zeros((L, H, n), np.float64)           # sum over captions of the prompt share
    samples = []
    for i, cap in enumerate(caps):
        pids = tok.prompt_ids(cap)
        g = torch.Generator().manual_seed(a.seed + i)
        with torch.no_grad():
            ids, _, raw = lm.generate([pids], n, cfg_weight=a.cfg, generator=g,
                                      uncond_fn=tok.uncond_ids, return_logits=True)
            lt = lm.forward_train(torch.tensor([pids]), torch.tensor([len(pids)]), ids)
            samples.append(vq.decode_ids(ids, grid)[0].permute(1, 2, 0).numpy())
        logits, probs = forward_with_probs(lm, pids, ids[0])
        print("[%d] %-32s prompt %2d ids; logits rel L2 vs KV-cache generate %.2e, vs "
              "forward_train %.2e; attention rows sum to 1 within %.1e" % (
                  i, '"%s"' % cap, len(pids), rel_l2(logits.numpy(), raw[0, 0].numpy()),
                  rel_l2(logits.numpy(), lt[0].numpy()),
                  max(float((p.sum(-1) - 1).abs().max()) for p in probs)), flush=True)
        for l, p in enumerate(probs):
            blk, ps = image_block(p, len(pids), n)
            acc[l] += blk
            accp[l] += ps
        del probs
    acc /= len(caps)
    accp /= len(caps)
    lag = lag_mass(acc)                              # [L, H, n+1]
    prof = lag.mean(1)                               # [L, n+1]
    prompt = accp.mean((1, 2))                       # [L]
    os.makedirs(a.out, exist_ok=True)

    # ---- the lag table
    print("\nmean attention mass per layer (mean over %d heads, %d queries, %d captions); lag d "
          "= t - j, d=1 left neighbour, d=24 above (flexdiag lag = d - 1)" % (H, n, len(caps)))
    print("| layer | prompt | d=1 | d=23 | d=24 | d=25 | d=48 | top-5 lags (mass) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for l in range(L):
        top = np.argsort(-prof[l, 1:])[:5] + 1
        print("| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s |" % (
            l, prompt[l], prof[l, 1], prof[l, 23], prof[l, 24], prof[l, 25], prof[l, 48],
            ", ".join("%d (%.3f)" % (d, prof[l, d]) for d in top)))

    # ---- N_att captured mass: best fixed lags vs the most recent tokens
    k, nr = a.n_att, a.n_r
    win = lag[:, :, 1:k + 1].sum(-1)                                  # [L, H]
    best_h = -np.sort(-lag[:, :, 1:nr + 1], -1)[:, :, :k].sum(-1)     # per-head best lags
    best_l = np.stack([lag[l][:, np.argsort(-prof[l, 1:nr + 1])[:k] + 1].sum(-1)
                       for l in range(L)])                            # one lag set per layer
    img = 1.0 - accp.mean(2)                                          # [L, H] image share
    print("\nN_att = %d: attention mass captured (mean over heads, queries, captions); best "
          "lags chosen among d = 1..%d from these same maps (an oracle, fixed over the image); "
          "'of image' = divided by the image keys' share (1 - prompt)" % (k, nr))
    print("| layer | window d=1..%d | best %d lags per head | best %d lags per layer | "
          "window of image | best/head of image |" % (k, k, k))
    print("|---:|---:|---:|---:|---:|---:|")
    for l in range(L):
        print("| %d | %.3f | %.3f | %.3f | %.3f | %.3f |" % (
            l, win[l].mean(), best_h[l].mean(), best_l[l].mean(), (win[l] / img[l]).mean(),
            (best_h[l] / img[l]).mean()))
    print("| mean | %.3f | %.3f | %.3f | %.3f | %.3f |" % (
        win.mean(), best_h.mean(), best_l.mean(), (win / img).mean(), (best_h / img).mean()))
    print("best-lag sets per layer (sorted): ")
    for l in range(L):
        print("  layer %d: %s" % (l, sorted((np.argsort(-prof[l, 1:nr + 1])[:k] + 1).tolist())))

    # ---- figures
    panel_grid(os.path.join(a.out, "attn_layers.png"),
               "ATTENTION PER LAYER, MEAN OVER HEADS AND %d CAPTIONS" % len(caps),
               [("LAYER %d" % l, acc[l].mean(0)) for l in range(L)])
    if a.head_layers == "auto":
        vert = prof[:, 23:26].sum(1)
        worst = (win / img).mean(1)
        ks = [int(np.argmax(vert))]
        ks += [int(l) for l in np.argsort(worst) if int(l) != ks[0]][:1]
    else:
        ks = [int(s) for s in a.head_layers.split(",")]
    for K in ks:
        panel_grid(os.path.join(a.out, "attn_heads_layer%d.png" % K),
                   "LAYER %d, EVERY HEAD, MEAN OVER %d CAPTIONS" % (K, len(caps)),
                   [("HEAD %d  TOP LAGS %s" % (h, ",".join(str(int(d)) for d in
                                                            np.argsort(-lag[K, h, 1:])[:3] + 1)),
                     acc[K, h]) for h in range(H)])
    lag_chart(os.path.join(a.out, "attn_lag_profile.png"), prof, prompt, k, nr)
    to8 = lambda x: np.clip((x + 1) / 2 * 255, 0, 255).astype(np.uint8)   # noqa: E731
    c = Canvas(len(caps) * 212 + 12, 240)
    for i, (cap, im) in enumerate(zip(caps, samples)):
        c.blit(12 + 212 * i, 12, to8(im).repeat(2, 0).repeat(2, 1))
        c.text(12 + 212 * i, 210, cap[:33])
        c.text(12 + 212 * i, 222, "SEED %d, CFG %g" % (a.seed + i, a.cfg))
    c.save(os.path.join(a.out, "attn_samples.png"))
    print("\nwrote %s: attn_layers.png, %s, attn_lag_profile.png, attn_samples.png" % (
        a.out, ", ".join("attn_heads_layer%d.png" % K for K in ks)))


if __name__ == "__main__":
    main()
