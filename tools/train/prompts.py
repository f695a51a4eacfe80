#!/usr/bin/env python3
"""
prompts.py - the GenEval-style evaluation prompt set of the toy shapes model.

Seven categories (GenEval's six, plus absolute position), `--per-category` distinct prompts each
(default 24, 168 prompts), deterministic for a seed:

  single_object  "a circle"                          the shape is there (>= 1)
  two_object     "a circle and a square"             both shapes are there
  counting       "three triangles"                   exactly that many of the shape
  colors         "a blue star"                       the shape in that colour
  position       "a star left of a cross"            GenEval's relative position
  color_attr     "a red circle and a green square"   each shape in its own colour
  abs_position   "two squares on the left"           the shapes in that half / the middle

A category with fewer distinct prompts than --per-category (single_object: 6, counting: 18)
repeats its prompts in order.

Writes GenEval's evaluation_metadata.jsonl layout (one JSON object per line with "prompt",
"tag", "include", optional "exclude", plus our "spec"), which `flexdiag generate --layout geneval
--prompts FILE` accepts and copies to each <index>/metadata.jsonl, and optionally a plain
one-prompt-per-line file for `--layout plain`.

  python3 tools/train/prompts.py --out prompts.jsonl [--txt prompts.txt] [--per-category 24]
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes  # noqa: E402

CATEGORIES = ["single_object", "two_object", "counting", "colors", "position", "color_attr",
              "abs_position"]


def _spec(rng, tag):
    S, C = shapes.SHAPES, shapes.COLORS
    pick = lambda seq: seq[int(rng.integers(len(seq)))]
    if tag == "single_object":
        return {"kind": "single", "groups": [{"shape": pick(S), "count": 1}]}
    if tag == "counting":
        return {"kind": "single", "groups": [{"shape": pick(S), "count": int(rng.integers(2, 5))}]}
    if tag == "colors":
        return {"kind": "single", "groups": [{"shape": pick(S), "count": 1, "color": pick(C)}]}
    if tag == "abs_position":
        return {"kind": "single", "groups": [{"shape": pick(S), "count": int(rng.integers(1, 3)),
                                              "region": pick(shapes.REGIONS)}]}
    s1, s2 = rng.choice(len(S), 2, replace=False)
    g1, g2 = {"shape": S[s1], "count": 1}, {"shape": S[s2], "count": 1}
    if tag == "two_object":
        return {"kind": "pair", "groups": [g1, g2]}
    if tag == "color_attr":
        c1, c2 = rng.choice(len(C), 2, replace=False)
        g1["color"], g2["color"] = C[c1], C[c2]
        return {"kind": "pair", "groups": [g1, g2]}
    return {"kind": "relation", "groups": [g1, g2], "relation": pick(shapes.RELATIONS)}


def build(per_category=24, seed=0):
    """List of metadata records, category by category. Prompts are distinct within a category
    while the category has enough (single_object has 6, counting 18): then the distinct list
    repeats in order (flexdiag draws every image of the job from its own image index, so a
    repeated prompt still gets new images)."""
    out = []
    for ci, tag in enumerate(CATEGORIES):
        rng = np.random.default_rng([seed, 77, ci])
        recs, seen, misses = [], set(), 0
        while len(recs) < per_category and misses < 2000:
            rec = shapes.geneval_metadata(_spec(rng, tag), tag)
            if rec["prompt"] in seen:
                misses += 1
                continue
            seen.add(rec["prompt"])
            recs.append(rec)
        n = len(recs)
        out += [recs[i % n] for i in range(per_category)]
    return out


def write_jsonl(records, path):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, separators=(", ", ": ")) + "\n")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="evaluation_metadata.jsonl to write")
    ap.add_argument("--txt", help="also write the prompts one per line (flexdiag --layout plain)")
    ap.add_argument("--per-category", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    recs = build(a.per_category, a.seed)
    write_jsonl(recs, a.out)
    if a.txt:
        with open(a.txt, "w") as f:
            f.write("".join(r["prompt"] + "\n" for r in recs))
    counts = {t: sum(r["tag"] == t for r in recs) for t in CATEGORIES}
    print("%d prompts -> %s (%s)" % (len(recs), a.out,
                                     ", ".join("%s %d" % kv for kv in counts.items())))


if __name__ == "__main__":
    main()
