# SPDX-License-Identifier: MIT
"""Progress callbacks and cancel: both phases reported, cancel by returning False, by
Context.cancel() from another thread while a run is in flight and by Ctrl+C, and exceptions
raised inside callbacks raised again in the caller (the context stays usable)."""
import _thread
import threading
import time

import pytest

import flexdiag
from flexdiag._queue import WAIT_SLICE_S

PROMPT = "a cat"


def context(micro, progress):
    return flexdiag.Context(micro, max_images=2, max_prompt_len=64, progress=progress)


def test_progress_reports_prefill_and_decode(micro):
    calls = []
    with context(micro, lambda phase, done, total: calls.append((phase, done, total))) as c:
        c.generate(PROMPT, images_per_prompt=2, seed=1, image_format=None)
    prefill = [x for x in calls if x[0] == flexdiag.PHASE_PREFILL]
    decode = [x for x in calls if x[0] == flexdiag.PHASE_DECODE]
    assert prefill and decode
    assert decode[-1][1] == decode[-1][2] == 64  # micro-janus: 64 tokens an image
    assert [d for _, d, _ in decode] == sorted(d for _, d, _ in decode)


def test_returning_false_cancels(micro):
    steps = []

    def stop_at_ten(phase, done, total):
        steps.append(done)
        return not (phase == flexdiag.PHASE_DECODE and done >= 10)

    with context(micro, stop_at_ten) as c:
        with pytest.raises(flexdiag.Error) as e:
            c.generate(PROMPT, seed=1, image_format=None)
        assert e.value.status == flexdiag.Status.CANCELLED
        assert e.value.status_name == "CANCELLED" and "cancelled" in e.value.message
        assert max(steps) < 64


def test_cancel_from_another_thread(micro):
    started, cancelled = threading.Event(), threading.Event()

    def hold_until_cancelled(phase, done, total):
        if phase == flexdiag.PHASE_DECODE and not started.is_set():
            started.set()
            assert cancelled.wait(30)
        return True

    with context(micro, hold_until_cancelled) as c:
        def cancel_when_started():
            started.wait(30)
            c.cancel()
            cancelled.set()

        t = threading.Thread(target=cancel_when_started)
        t.start()
        with pytest.raises(flexdiag.Error) as e:
            c.generate(PROMPT, seed=1, image_format=None)
        t.join()
        assert e.value.status == flexdiag.Status.CANCELLED
        assert len(c.generate(PROMPT, seed=1, image_format=None)) == 1  # usable again


class Boom(Exception):
    pass


def test_exception_in_progress_is_raised_in_the_caller(micro):
    raised = []

    def explode_once(phase, done, total):
        if phase == flexdiag.PHASE_DECODE and done == 5 and not raised:
            raised.append(done)
            raise Boom("from the progress callback")
        return True

    with context(micro, explode_once) as c:
        with pytest.raises(Boom, match="from the progress callback"):
            c.generate(PROMPT, seed=1, image_format=None)
        assert len(c.generate(PROMPT, seed=2, image_format=None)) == 1  # the error is not kept


def test_exception_in_image_callback_is_raised_by_result(ctx):
    seen = []

    def explode(handle, index, tokens):
        seen.append(index)
        raise Boom(f"image {index}")

    h = ctx.submit(PROMPT, images_per_prompt=3, seed=1, on_image=explode)
    with pytest.raises(Boom, match="image"):
        h.result()
    assert len(seen) == 1  # the first failure stops the user's callbacks
    h.close()


def test_done_callback_gets_the_status(ctx):
    got = []
    done = threading.Event()
    def on_done(handle, st):
        got.append((handle, st))
        done.set()

    h = ctx.submit(PROMPT, seed=1, on_done=on_done)
    assert done.wait(30)
    assert got == [(h, flexdiag.Status.OK)]
    h.close()


def test_ctrl_c_cancels_the_request(micro):
    steps, fired = [], []

    def interrupt_once(phase, done, total):
        steps.append(done)
        if phase == flexdiag.PHASE_DECODE and done == 2 and not fired:
            fired.append(done)
            _thread.interrupt_main()  # what Ctrl+C does to the waiting main thread
            time.sleep(3 * WAIT_SLICE_S)  # the wait returns to Python meanwhile
        return True

    with context(micro, interrupt_once) as c:
        with pytest.raises(KeyboardInterrupt):
            c.generate(PROMPT, images_per_prompt=2, seed=1, image_format=None)
        assert max(steps) < 64
        assert len(c.generate(PROMPT, seed=1, image_format=None)) == 1
