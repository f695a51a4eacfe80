# SPDX-License-Identifier: MIT
"""Object lifetimes: `with` and close() free the C objects, a use after close raises
ClosedError, closing a model closes its contexts and handles first, closing a context cancels
what runs, handles are released when collected, and no callback state is left behind."""
import gc
import threading
import weakref

import pytest

import flexdiag
from flexdiag import _native


def test_with_closes_and_use_after_close_raises(runtime):
    with flexdiag.Model(runtime, arch="micro-janus") as m:
        with flexdiag.Context(m, max_images=1) as c:
            assert not c.closed
        assert c.closed
        with pytest.raises(flexdiag.ClosedError, match="Context is closed"):
            c.generate("a cat")
        c.close()  # idempotent
    assert m.closed
    with pytest.raises(flexdiag.ClosedError, match="Model is closed"):
        m.image_size


def test_model_close_takes_its_contexts_and_handles(runtime):
    m = flexdiag.Model(runtime, arch="micro-janus")
    c = flexdiag.Context(m, max_images=1)
    h = c.submit("a cat", images_per_prompt=8, seed=1)
    m.close()
    assert c.closed and h.closed and m.closed
    assert not runtime.closed


def test_context_close_cancels_and_handles_stay_readable(micro):
    c = flexdiag.Context(micro, max_images=1)
    h = c.submit("a cat", images_per_prompt=16, seed=1)
    c.close()
    assert h.status == flexdiag.Status.CANCELLED
    assert h.error == "generation cancelled"
    with pytest.raises(flexdiag.Error) as e:
        h.result()
    assert e.value.status == flexdiag.Status.CANCELLED
    h.close()


def test_close_from_a_callback_is_refused(micro):
    holder = {}

    def close_me(phase, done, total):
        holder["c"].close()

    with flexdiag.Context(micro, max_images=1, progress=close_me) as c:
        holder["c"] = c
        with pytest.raises(RuntimeError, match="from a callback would wait"):
            c.generate("a cat", image_format=None)


def test_dropped_handles_are_released_and_leave_no_state(ctx):
    done = threading.Event()
    h = ctx.submit("a cat", images_per_prompt=2, seed=1, on_done=lambda h, st: done.set())
    ref = weakref.ref(h)
    del h
    gc.collect()
    assert ref() is None  # released while it runs; the request goes on
    assert done.wait(30)
    ctx.generate("a cat", image_format=None)
    assert not _native._registry  # every request's callback state is gone


def test_runtime_close_takes_everything():
    rt = flexdiag.Runtime(device=-1, threads=1)
    m = flexdiag.Model(rt, arch="micro-janus")
    c = flexdiag.Context(m, max_images=1)
    rt.close()
    assert rt.closed and m.closed and c.closed
