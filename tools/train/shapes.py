"""
shapes.py - procedural training data for the Janus-shaped toy model (issue #18).

A scene is a small composition of flat-coloured shapes on a light background, described by a
*spec* from which both the caption and a GenEval-style check follow:

    {"kind": "single",   "groups": [{"shape": "circle", "count": 3, "color": "red", "region": "left"}]}
    {"kind": "pair",     "groups": [{"shape": "circle", "count": 1, "color": "red"},
                                    {"shape": "square", "count": 1, "color": None}]}
    {"kind": "relation", "groups": [A, B], "relation": "left of"}      # "A left of B"

An attribute the caption leaves out (color None, region None) is drawn at random for each object,
so the caption states exactly what the image must show. Captions:

    single    "three red circles on the left", "a square", "an orange star at the top"
    pair      "a red circle and a blue square", "a circle and a star"
    relation  "a red circle left of a blue square", "a star above a cross"

Sampling is deterministic: every random choice comes from the numpy Generator passed in (train.py
keys one per (seed, stream, step)), and rendering is plain torch arithmetic (same result on CPU
and GPU up to float rounding). Scene parameters are drawn on the CPU (vectorised numpy over the
batch); rendering runs on whatever device the tensors are on.

Geometry: images are S x S pixels (96 by default); object centres and radii are in pixels,
(0, 0) the top-left corner. Objects never overlap (centre distance >= 1.15 (r_i + r_j) + 3).
Regions for a stated position: left x < 0.45 S, right x > 0.55 S, top y < 0.45 S, bottom
y > 0.55 S, center both within [0.3 S, 0.7 S]; the checker (geneval_check) is looser (halves and
the middle half) so that a generated image is judged by which side an object is on.
"""

import math

import numpy as np
import torch

SHAPES = ["circle", "square", "triangle", "diamond", "star", "cross"]
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles",
           "diamond": "diamonds", "star": "stars", "cross": "crosses"}
COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "black"]
COLOR_RGB = {"red": (215, 35, 35), "orange": (245, 135, 20), "yellow": (240, 205, 25),
             "green": (35, 160, 60), "blue": (35, 75, 215), "purple": (135, 45, 185),
             "pink": (245, 125, 185), "black": (30, 30, 30)}
COUNT_WORDS = {1: "a", 2: "two", 3: "three", 4: "four"}
REGIONS = ["left", "right", "top", "bottom", "center"]
REGION_PHRASE = {"left": "on the left", "right": "on the right", "top": "at the top",
                 "bottom": "at the bottom", "center": "in the center"}
RELATIONS = ["left of", "right of", "above", "below"]
# light backgrounds (RGB); each image jitters its own and may add a faint linear gradient
BACKGROUNDS = [(246, 246, 246), (228, 228, 228), (242, 234, 218), (222, 232, 244),
               (232, 242, 228)]
# every word a caption can contain (the tokenizer gives each one a single token)
LEXICON = (["a", "an", "two", "three", "four", "and", "of", "on", "at", "in", "the"]
           + REGIONS + ["above", "below"] + COLORS + SHAPES + [PLURALS[s] for s in SHAPES])

MAX_OBJECTS = 4
# region boxes for a stated position: (x0, x1, y0, y1) as fractions of the side
REGION_BOX = {None: (0.0, 1.0, 0.0, 1.0), "left": (0.0, 0.45, 0.0, 1.0),
              "right": (0.55, 1.0, 0.0, 1.0), "top": (0.0, 1.0, 0.0, 0.45),
              "bottom": (0.0, 1.0, 0.55, 1.0), "center": (0.3, 0.7, 0.3, 0.7)}
# relation "A rel B": boxes for A's and B's centres; the placement then enforces the relation
REL_BOX = {"left of": ((0.0, 0.6, 0.0, 1.0), (0.4, 1.0, 0.0, 1.0)),
           "right of": ((0.4, 1.0, 0.0, 1.0), (0.0, 0.6, 0.0, 1.0)),
           "above": ((0.0, 1.0, 0.0, 0.6), (0.0, 1.0, 0.4, 1.0)),
           "below": ((0.0, 1.0, 0.4, 1.0), (0.0, 1.0, 0.0, 0.6))}

# training mixture
P_KIND = {"single": 0.5, "pair": 0.25, "relation": 0.25}
P_COUNT = [0.4, 0.2, 0.2, 0.2]          # counts 1..4 for single scenes
P_COLOR_SINGLE = 0.6                     # a single group names its colour
P_REGION_SINGLE = 0.4                    # a single group names a region
P_COLOR_PAIR = 0.6                       # each group of a pair / relation names its colour


# ---- specs and captions ----

def _noun(shape, count):
    return shape if count == 1 else PLURALS[shape]


def group_phrase(g):
    """'three red circles', 'an orange star', 'a square'."""
    words = []
    if g.get("color"):
        words.append(g["color"])
    words.append(_noun(g["shape"], g["count"]))
    det = COUNT_WORDS[g["count"]]
    if g["count"] == 1 and words[0][0] in "aeiou":
        det = "an"
    return " ".join([det] + words)


def caption(spec):
    gs = spec["groups"]
    if spec["kind"] == "single":
        text = group_phrase(gs[0])
        if gs[0].get("region"):
            text += " " + REGION_PHRASE[gs[0]["region"]]
        return text
    if spec["kind"] == "pair":
        return group_phrase(gs[0]) + " and " + group_phrase(gs[1])
    return group_phrase(gs[0]) + " " + spec["relation"] + " " + group_phrase(gs[1])


def sample_spec(rng):
    """One random training spec."""
    u = rng.random()
    if u < P_KIND["single"]:
        count = int(rng.choice(4, p=P_COUNT)) + 1
        g = {"shape": SHAPES[rng.integers(len(SHAPES))], "count": count,
             "color": COLORS[rng.integers(len(COLORS))] if rng.random() < P_COLOR_SINGLE else None,
             "region": REGIONS[rng.integers(len(REGIONS))] if rng.random() < P_REGION_SINGLE
             else None}
        return {"kind": "single", "groups": [g]}
    s1, s2 = rng.choice(len(SHAPES), size=2, replace=False)
    c1, c2 = rng.choice(len(COLORS), size=2, replace=False)
    groups = [{"shape": SHAPES[s1], "count": 1,
               "color": COLORS[c1] if rng.random() < P_COLOR_PAIR else None},
              {"shape": SHAPES[s2], "count": 1,
               "color": COLORS[c2] if rng.random() < P_COLOR_PAIR else None}]
    if u < P_KIND["single"] + P_KIND["pair"]:
        return {"kind": "pair", "groups": groups}
    return {"kind": "relation", "groups": groups,
            "relation": RELATIONS[rng.integers(len(RELATIONS))]}


def all_caption_words():
    return list(dict.fromkeys(LEXICON))


# ---- GenEval-style metadata and check ----

def geneval_metadata(spec, tag):
    """GenEval's evaluation_metadata.jsonl record for a spec (classes are our shape names);
    single-group regions are an extension: 'region' on the include entry."""
    gs = spec["groups"]
    if spec["kind"] == "relation":
        a, b = gs
        inc = [{"class": b["shape"], "count": 1}, {"class": a["shape"], "count": 1,
                                                   "position": [spec["relation"], 0]}]
        if b.get("color"):
            inc[0]["color"] = b["color"]
        if a.get("color"):
            inc[1]["color"] = a["color"]
        return {"tag": tag, "include": inc, "prompt": caption(spec), "spec": spec}
    inc, exc = [], []
    for g in gs:
        e = {"class": g["shape"], "count": g["count"]}
        if g.get("color"):
            e["color"] = g["color"]
        if g.get("region"):
            e["region"] = g["region"]
        inc.append(e)
        if tag == "counting":
            exc.append({"class": g["shape"], "count": g["count"] + 1})
    rec = {"tag": tag, "include": inc, "prompt": caption(spec), "spec": spec}
    if exc:
        rec["exclude"] = exc
    return rec


def relative_ok(rel, a, b, side):
    """GenEval-like relation of object a to object b (dicts with cx, cy): a is `rel` b when its
    centre is at least 4% of the side beyond b's along the named axis."""
    m = 0.04 * side
    dx, dy = a["cx"] - b["cx"], a["cy"] - b["cy"]
    return {"left of": dx < -m, "right of": dx > m, "above": dy < -m, "below": dy > m}[rel]


def region_ok(region, o, side):
    h = side / 2.0
    return {"left": o["cx"] < h, "right": o["cx"] > h, "top": o["cy"] < h,
            "bottom": o["cy"] > h,
            "center": abs(o["cx"] - h) < side / 4.0 and abs(o["cy"] - h) < side / 4.0}[region]


def geneval_check(meta, objects, side):
    """GenEval's evaluate() on our detections: objects = list of dicts {shape, color, cx, cy,
    score} (any order; sorted by score here). Returns (correct, reason)."""
    by_class = {}
    for o in sorted(objects, key=lambda o: -o.get("score", 1.0)):
        by_class.setdefault(o["shape"], []).append(o)
    correct, reasons, matched = True, [], []
    for req in meta.get("include", []):
        found = by_class.get(req["class"], [])[:req["count"]]
        ok = True
        if len(found) < req["count"]:
            ok = False
            reasons.append("expected %s>=%d, found %d" % (req["class"], req["count"], len(found)))
        else:
            if "color" in req and sum(o["color"] == req["color"] for o in found) < req["count"]:
                ok = False
                reasons.append("expected %s %s" % (req["color"], req["class"]))
            if ok and "region" in req and not all(region_ok(req["region"], o, side)
                                                  for o in found):
                ok = False
                reasons.append("expected %s %s" % (req["class"], REGION_PHRASE[req["region"]]))
            if ok and "position" in req:
                rel, tgt = req["position"]
                if matched[tgt] is None:
                    ok = False
                    reasons.append("no target for %s" % rel)
                elif not all(relative_ok(rel, o, t, side) for o in found for t in matched[tgt]):
                    ok = False
                    reasons.append("expected %s %s target" % (req["class"], rel))
        correct = correct and ok
        matched.append(found if ok else None)
    for req in meta.get("exclude", []):
        if len(by_class.get(req["class"], [])) >= req["count"]:
            correct = False
            reasons.append("expected %s<%d" % (req["class"], req["count"]))
    return correct, "; ".join(reasons)


# ---- layout: object parameters for a batch of specs (vectorised placement) ----

def _radius(rng, count, kind):
    """Object size in pixels at side 96 (layout scales it with the side)."""
    if kind != "single":
        return rng.uniform(9.0, 14.0)
    if count == 1:
        return rng.uniform(10.0, 16.0)
    if count == 2:
        return rng.uniform(9.0, 13.0)
    return rng.uniform(7.0, 10.5)


def layout(rng, specs, side=96, candidates=48):
    """Objects of every spec: dict of numpy arrays [B, MAX_OBJECTS] (active, shape, color, r, cx,
    cy, rgb [B, 4, 3]) and background parameters. Placement is vectorised over the batch: slot
    j takes the first of `candidates` uniform draws in its box that keeps clear of slots < j
    (and, for relations, satisfies the relation); if none does, the draw with the most room
    (the relation still enforced when any draw satisfies it)."""
    B, K, J = len(specs), candidates, MAX_OBJECTS
    scale = side / 96.0
    active = np.zeros((B, J), bool)
    shape = np.zeros((B, J), np.int64)
    color = np.zeros((B, J), np.int64)
    rad = np.zeros((B, J), np.float64)
    box = np.zeros((B, J, 4), np.float64)
    rel = np.full(B, -1, np.int64)            # relation index for slot 1 vs slot 0
    for b, sp in enumerate(specs):
        j = 0
        for gi, g in enumerate(sp["groups"]):
            for _ in range(g["count"]):
                active[b, j] = True
                shape[b, j] = SHAPES.index(g["shape"])
                color[b, j] = (COLORS.index(g["color"]) if g.get("color")
                               else rng.integers(len(COLORS)))
                rad[b, j] = _radius(rng, g["count"], sp["kind"]) * scale
                if sp["kind"] == "relation":
                    box[b, j] = REL_BOX[sp["relation"]][gi]
                else:
                    box[b, j] = REGION_BOX[g.get("region")]
                j += 1
        if sp["kind"] == "relation":
            rel[b] = RELATIONS.index(sp["relation"])
    cx = np.zeros((B, J))
    cy = np.zeros((B, J))
    for j in range(J):
        r = rad[:, j:j + 1]
        lo_x = np.maximum(box[:, j, 0:1] * side, 1.2 * r + scale)
        hi_x = np.maximum(np.minimum(box[:, j, 1:2] * side, side - scale - 1.2 * r), lo_x)
        lo_y = np.maximum(box[:, j, 2:3] * side, 1.2 * r + scale)
        hi_y = np.maximum(np.minimum(box[:, j, 3:4] * side, side - scale - 1.2 * r), lo_y)
        ux, uy = rng.random((B, K)), rng.random((B, K))
        px = lo_x + ux * (hi_x - lo_x)
        py = lo_y + uy * (hi_y - lo_y)
        slack = np.full((B, K), 1e9)
        for i in range(j):
            need = 1.15 * (rad[:, i:i + 1] + r) + 3.0 * scale
            d = np.hypot(px - cx[:, i:i + 1], py - cy[:, i:i + 1]) - need
            slack = np.where(active[:, i:i + 1], np.minimum(slack, d), slack)
        relok = np.ones((B, K), bool)
        if j == 1:
            dx = cx[:, :1] - px               # slot 0 (A) relative to this candidate (B)
            dy = cy[:, :1] - py
            m = 0.1 * side
            conds = [(dx < -m) & (np.abs(dx) > np.abs(dy)), (dx > m) & (np.abs(dx) > np.abs(dy)),
                     (dy < -m) & (np.abs(dy) > np.abs(dx)), (dy > m) & (np.abs(dy) > np.abs(dx))]
            for k in range(4):
                relok = np.where((rel == k)[:, None], conds[k], relok)
        valid = (slack >= 0) & relok
        first = np.argmax(valid, axis=1)
        best = np.argmax(np.where(relok.any(1, keepdims=True) & ~relok, -1e18, slack), axis=1)
        pick = np.where(valid.any(1), first, best)
        cx[:, j] = px[np.arange(B), pick]
        cy[:, j] = py[np.arange(B), pick]
    rgb = np.array([COLOR_RGB[c] for c in COLORS], np.float64)[color]
    rgb = np.clip(rgb + rng.uniform(-14, 14, size=rgb.shape), 0, 255)
    bg_idx = rng.integers(len(BACKGROUNDS), size=B)
    bg = np.array(BACKGROUNDS, np.float64)[bg_idx] + rng.uniform(-8, 8, size=(B, 3))
    ang = rng.uniform(0, 2 * math.pi, size=B)
    amp = np.where(rng.random(B) < 0.5, rng.uniform(0, 14, size=B), 0.0)
    return {"active": active, "shape": shape, "color": color, "r": rad, "cx": cx, "cy": cy,
            "rgb": rgb, "bg": np.clip(bg, 0, 255), "grad": np.stack([np.cos(ang) * amp,
                                                                      np.sin(ang) * amp], 1),
            "side": side}


def objects_of(lay, b):
    """Ground-truth objects of image b as evaluator-style dicts."""
    out = []
    for j in range(MAX_OBJECTS):
        if lay["active"][b, j]:
            out.append({"shape": SHAPES[lay["shape"][b, j]], "color": COLORS[lay["color"][b, j]],
                        "cx": float(lay["cx"][b, j]), "cy": float(lay["cy"][b, j]),
                        "score": 1.0})
    return out


# ---- rendering ----

def _star_line(inner=0.45):
    """Edge of a unit star from the point (1, 0) to the valley at pi/5, radius `inner`: the
    distance d of its line from the centre and the angle phi of the line's foot."""
    px, py = 1.0, 0.0
    qx, qy = inner * math.cos(math.pi / 5), inner * math.sin(math.pi / 5)
    ex, ey = qx - px, qy - py
    t = -(px * ex + py * ey) / (ex * ex + ey * ey)
    fx, fy = px + t * ex, py + t * ey
    return math.hypot(fx, fy), math.atan2(fy, fx)


_STAR_D, _STAR_PHI = _star_line()


def _sdf(kind, dx, dy, r):
    """Approximate signed distance (pixels, < 0 inside) of shape `kind` with size r."""
    ax, ay = dx.abs(), dy.abs()
    if kind == 0:                                   # circle
        return torch.sqrt(dx * dx + dy * dy) - r
    if kind == 1:                                   # square (axis aligned)
        return torch.maximum(ax, ay) - 0.85 * r
    if kind == 2:                                   # equilateral triangle, apex up
        R = 1.2 * r
        c = math.sqrt(3.0) / 2.0
        d1 = dy - 0.5 * R                           # bottom edge (y grows downward)
        d2 = c * dx - 0.5 * dy - 0.5 * R
        d3 = -c * dx - 0.5 * dy - 0.5 * R
        return torch.maximum(d1, torch.maximum(d2, d3))
    if kind == 3:                                   # diamond
        return (ax + ay - 1.05 * r) / math.sqrt(2.0)
    if kind == 4:                                   # five-pointed star, straight edges
        R = 1.2 * r
        per = 2 * math.pi / 5
        u = torch.remainder(torch.atan2(dx, -dy), per)
        u = torch.minimum(u, per - u)               # 0 at a point, pi/5 at a valley
        rad = torch.sqrt(dx * dx + dy * dy)
        return (rad - R * _STAR_D / torch.cos(u - _STAR_PHI)) * 0.5
    # cross (plus sign)
    L, w = 1.0 * r, 0.36 * r
    return torch.minimum(torch.maximum(ax - L, ay - w), torch.maximum(ax - w, ay - L))


def render(lay, device="cpu"):
    """Images of a layout: float32 [B, 3, S, S] in [-1, 1] on `device`."""
    S = lay["side"]
    f = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32, device=device)
    B = lay["active"].shape[0]
    coords = torch.arange(S, dtype=torch.float32, device=device) + 0.5
    X = coords.view(1, 1, S)
    Y = coords.view(1, S, 1)
    bg = f(lay["bg"]).view(B, 3, 1, 1)
    g = f(lay["grad"])
    ramp = ((X - S / 2) * g[:, 0].view(B, 1, 1) + (Y - S / 2) * g[:, 1].view(B, 1, 1)) / (S / 2)
    img = bg + ramp.unsqueeze(1)
    active = torch.as_tensor(lay["active"], device=device)
    shape = torch.as_tensor(lay["shape"], device=device)
    cx, cy, r, rgb = f(lay["cx"]), f(lay["cy"]), f(lay["r"]), f(lay["rgb"])
    for j in range(MAX_OBJECTS):
        if not bool(active[:, j].any()):
            continue
        dx = X - cx[:, j].view(B, 1, 1)
        dy = Y - cy[:, j].view(B, 1, 1)
        rr = r[:, j].view(B, 1, 1)
        sdf = torch.zeros(B, S, S, device=device)
        for k in range(len(SHAPES)):
            sel = (shape[:, j] == k) & active[:, j]
            if bool(sel.any()):
                sdf = torch.where(sel.view(B, 1, 1), _sdf(k, dx, dy, rr), sdf)
        alpha = (0.5 - sdf).clamp(0.0, 1.0) * active[:, j].float().view(B, 1, 1)
        alpha = alpha.unsqueeze(1)
        img = img * (1 - alpha) + rgb[:, j].view(B, 3, 1, 1) * alpha
    return (img.clamp(0, 255) / 127.5 - 1.0)


def batch(rng, n, side=96, device="cpu"):
    """n random training scenes: (images [-1, 1], specs, captions, layout)."""
    specs = [sample_spec(rng) for _ in range(n)]
    lay = layout(rng, specs, side)
    return render(lay, device), specs, [caption(s) for s in specs], lay


def to_uint8(img):
    """[-1, 1] float images [B, 3, H, W] -> uint8 [B, H, W, 3] as flexdiag converts them."""
    x = ((img.detach().float().cpu() + 1.0) / 2.0 * 255.0).clamp(0, 255)
    return x.to(torch.uint8).permute(0, 2, 3, 1).numpy()


if __name__ == "__main__":   # a quick look: captions of a few random specs
    rng = np.random.default_rng(0)
    for _ in range(12):
        print(caption(sample_spec(rng)))
