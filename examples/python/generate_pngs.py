#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generate images with the flexdiag Python binding and write them as PNGs.

    python3 examples/python/generate_pngs.py --prompt "a red apple" --images 4 --out apples

Without --model it runs the builtin tiny-janus (random weights: noise images, no download).
PNGs are written with Pillow when it is installed, else by the binding's own writer. The
library comes from FLEXDIAG_LIBRARY or the linker's path (python/README.md).
"""
import argparse
import os
import sys
import time

import flexdiag


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model folder (config.json + safetensors)")
    ap.add_argument("--arch", default="tiny-janus", help="builtin shape without --model")
    ap.add_argument("--prompt", default="a red apple on a wooden table")
    ap.add_argument("--images", type=int, default=2, help="images of the prompt")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    ap.add_argument("--out", default="out-python", help="folder of the PNGs")
    ap.add_argument("--cpu", action="store_true", help="the CPU engine even with a GPU")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    rt_args = {"device": -1} if a.cpu else {}
    model_args = {} if a.model else {"arch": a.arch}

    def progress(phase, done, total):
        if phase == flexdiag.PHASE_DECODE and done == total:
            print(f"decode: {done}/{total} tokens", file=sys.stderr)

    t0 = time.time()
    with flexdiag.Runtime(**rt_args) as rt, flexdiag.Model(rt, a.model, **model_args) as model, \
            flexdiag.Context(model, max_images=a.images, progress=progress) as ctx:
        for r in ctx.generate(a.prompt, images_per_prompt=a.images, seed=a.seed):
            path = os.path.join(a.out, f"{r.index}.png")
            flexdiag.save_png(r.image, path)
            print(path)
    print(f"{a.images} image(s) in {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
