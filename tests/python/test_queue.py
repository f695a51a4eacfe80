# SPDX-License-Identifier: MIT
"""The request queue: several requests submitted at once, their images iterated as they
finish (each equal to the same image generated alone), one cancelled while it waits, handle
status, stats and waits, a full queue refused without waiting, and one context's calls from
several threads at once."""
import threading

import pytest

import flexdiag


def as_lists(grid):
    return grid.tolist() if hasattr(grid, "tolist") else grid


def test_images_of_several_requests_as_they_finish(ctx):
    reqs = [("a cat", 2, 11), ("a dog", 3, 12), ("a fox", 1, 13)]
    handles = [ctx.submit(p, images_per_prompt=n, seed=s) for p, n, s in reqs]
    got = {(handles.index(r.handle), r.index): r for r in ctx.images(handles)}
    assert sorted(got) == [(k, i) for k, (_, n, _) in enumerate(reqs) for i in range(n)]
    for k, (prompt, n, seed) in enumerate(reqs):
        alone = ctx.generate(prompt, images_per_prompt=n, seed=seed, image_format=None)
        assert [as_lists(got[k, i].tokens) for i in range(n)] == [as_lists(a.tokens) for a in alone]
        assert got[k, 0].image.size == (32, 32)
        assert handles[k].status == flexdiag.Status.OK
        stats = handles[k].stats()
        assert stats["n_images"] == stats["done_images"] == n and stats["total_s"] >= 0
        handles[k].close()


def test_cancel_a_waiting_request(micro):
    with flexdiag.Context(micro, max_images=1, max_prompt_len=64) as c:
        first = c.submit("a cat", images_per_prompt=6, seed=1)
        waiting = c.submit("a dog", images_per_prompt=4, seed=2)
        last = c.submit("a fox", images_per_prompt=1, seed=3)
        assert not waiting.wait(0)  # behind six images on one slot
        waiting.cancel()
        got = [(r.handle, r.index) for r in c.images([first, waiting, last])]
        assert [i for h, i in got if h is first] == list(range(6))
        assert [i for h, i in got if h is last] == [0]
        assert not [i for h, i in got if h is waiting]
        assert waiting.status == flexdiag.Status.CANCELLED and waiting.done
        assert waiting.stats()["done_images"] == 4  # ended, none made
        assert first.result(image_format=None)[5].index == 5


def test_full_queue_without_waiting_is_busy(micro):
    with flexdiag.Context(micro, max_images=1, max_prompt_len=64, queue_images=2) as c:
        h = c.submit("a cat", images_per_prompt=4, seed=1)
        with pytest.raises(flexdiag.Error) as e:
            c.submit("a dog", seed=2, wait_for_room=False)
        assert e.value.status == flexdiag.Status.BUSY and "queue_images" in e.value.message
        assert len(h.result()) == 4


def test_one_context_from_several_threads(ctx):
    seeds = [31, 32, 33, 34]
    got, errors = {}, []

    def run(seed):
        try:
            got[seed] = ctx.generate("a cat", images_per_prompt=2, seed=seed, image_format=None)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for s in seeds:
        alone = ctx.generate("a cat", images_per_prompt=2, seed=s, image_format=None)
        assert [as_lists(r.tokens) for r in got[s]] == [as_lists(r.tokens) for r in alone]
