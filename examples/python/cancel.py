#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Three ways to stop generation with the flexdiag Python binding.

    python3 examples/python/cancel.py --cpu

1. Context.cancel() from another thread (here a timer): the call in flight raises
   flexdiag.Error with status CANCELLED. Ctrl+C during generate() cancels the same way.
2. A progress callback that returns False cancels every request of its context.
3. Handle.cancel() on a queued request: it ends CANCELLED, the others go on.
"""
import argparse
import threading

import flexdiag


def cancel_from_a_timer(model, after):
    with flexdiag.Context(model, max_images=4) as ctx:
        timer = threading.Timer(after, ctx.cancel)
        timer.start()
        try:
            ctx.generate("a slow request", images_per_prompt=4, image_format=None)
            print("1. finished before the timer")
        except flexdiag.Error as e:
            if e.status != flexdiag.Status.CANCELLED:
                raise
            print(f"1. cancelled after {after} s: {e.message} [{e.status_name}]")
        timer.cancel()


def cancel_from_progress(model, steps):
    def stop(phase, done, total):
        return not (phase == flexdiag.PHASE_DECODE and done >= steps)

    with flexdiag.Context(model, max_images=1, progress=stop) as ctx:
        try:
            ctx.generate("stopped by its progress callback", image_format=None)
        except flexdiag.Error as e:
            print(f"2. progress returned False after {steps} steps: {e.status_name}")


def cancel_a_queued_request(model):
    with flexdiag.Context(model, max_images=1) as ctx:
        first = ctx.submit("first", seed=1)
        queued = ctx.submit("queued behind it", images_per_prompt=2, seed=2)
        queued.cancel()
        made = len(first.result(image_format=None))
        queued.wait()
        print(f"3. first: {first.status.name}, {made} image(s); queued: {queued.status.name}")
        first.close()
        queued.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="tiny-janus", help="builtin shape")
    ap.add_argument("--after", type=float, default=0.5, help="seconds before the timer cancels")
    ap.add_argument("--cpu", action="store_true", help="the CPU engine even with a GPU")
    a = ap.parse_args()
    with flexdiag.Runtime(**({"device": -1} if a.cpu else {})) as rt, \
            flexdiag.Model(rt, arch=a.arch) as model:
        cancel_from_a_timer(model, a.after)
        cancel_from_progress(model, 10)
        cancel_a_queued_request(model)


if __name__ == "__main__":
    main()
