#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Two contexts of one model generating on two threads at once.

    python3 examples/python/two_threads.py --cpu

A model is loaded once and shared; each context owns its KV cache and engine thread, so calls
on different contexts run side by side (include/flexdiag.h, "Threads"). On the CPU engine
every context starts its own worker pool of the runtime's `threads`: give each half the cores.
"""
import argparse
import os
import threading
import time

import flexdiag


def worker(model, prompt, seed, images, results):
    with flexdiag.Context(model, max_images=images) as ctx:
        t0 = time.time()
        rs = ctx.generate(prompt, images_per_prompt=images, seed=seed, image_format=None)
        results[prompt] = (rs, time.time() - t0, threading.current_thread().name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="tiny-janus", help="builtin shape")
    ap.add_argument("--images", type=int, default=2, help="images per thread")
    ap.add_argument("--cpu", action="store_true", help="the CPU engine even with a GPU")
    a = ap.parse_args()

    threads = max(1, (os.cpu_count() or 2) // 2)
    rt_args = {"device": -1} if a.cpu else {}
    results = {}
    with flexdiag.Runtime(threads=threads, **rt_args) as rt, \
            flexdiag.Model(rt, arch=a.arch) as model:
        jobs = [threading.Thread(target=worker, name=f"job-{i}",
                                 args=(model, prompt, i, a.images, results))
                for i, prompt in enumerate(["a red apple", "a blue car"])]
        for t in jobs:
            t.start()
        for t in jobs:
            t.join()
    if len(results) != len(jobs):
        raise SystemExit("a thread failed (its traceback is above)")
    for prompt, (rs, seconds, name) in results.items():
        print(f"{name}: {len(rs)} image(s) of {prompt!r} in {seconds:.1f} s; first tokens "
              f"{[int(v) for v in list(rs[0].tokens[0])[:4]]}")


if __name__ == "__main__":
    main()
