#!/usr/bin/env python3
"""make_golden.py - golden fixture of a trained model folder for flexdiag's golden suite.

Loads DIR into the PyTorch models (check_logits.load_exported: the stored bf16 weights widened
to f32, f32 compute), samples one image for a caption with CFG, and writes to OUT:
  score_input.json   prompt ids (built as flexdiag builds them), the 576 image ids, cfg weight
  logits_cond.npy    teacher-forced conditional logits of the positions in `positions`
  logits_uncond.npy  the unconditional row's, same positions
  logits_cfg.npy     the CFG-combined ones, same positions
  golden.json        generator, versions, positions, model folder and its weights' sha256
Only two windows of positions are kept (the start and the end of the image, 64 each), so the
fixture stays small while covering a short and the longest context.

  /usr/bin/python3 tools/train/make_golden.py --model models/shapes-janus \\
      --out tests/golden/data/shapes
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_logits  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--caption", default="two red circles on the left")
    ap.add_argument("--cfg", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=64)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    lm, _, tok, cfg = check_logits.load_exported(a.model)
    n = cfg["vq_config"]["num_patches"] ** 2
    pids, ids, l_cfg, l_raw = check_logits.sample_scored(lm, tok, a.caption, n, a.cfg, a.seed)
    pos = list(range(a.window)) + list(range(n - a.window, n))
    os.makedirs(a.out, exist_ok=True)
    f32 = lambda t: np.ascontiguousarray(t.numpy()[pos].astype(np.float32))
    np.save(os.path.join(a.out, "logits_cond.npy"), f32(l_raw[0, 0]))
    np.save(os.path.join(a.out, "logits_uncond.npy"), f32(l_raw[1, 0]))
    np.save(os.path.join(a.out, "logits_cfg.npy"), f32(l_cfg[0]))
    with open(os.path.join(a.out, "score_input.json"), "w") as f:
        json.dump({"prompt_ids": pids, "image_ids": ids[0].tolist(), "cfg_weight": a.cfg}, f)
    with open(os.path.join(a.model, "model.safetensors"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump({"magic": "flexdiag-golden", "version": 1,
                   "generator": "tools/train/make_golden.py", "torch": torch.__version__,
                   "numpy": np.__version__, "model": os.path.relpath(a.model),
                   "model_sha256": sha, "caption": a.caption, "seed": a.seed,
                   "positions": pos}, f, indent=1)
    print("wrote %s: %d prompt ids, %d image ids, logits at %d positions" % (
        a.out, len(pids), n, len(pos)))


if __name__ == "__main__":
    main()
