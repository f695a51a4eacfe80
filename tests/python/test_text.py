# SPDX-License-Identifier: MIT
"""Text generation: the golden OPT fixture (tests/golden/data/opt, with its tokenizer.json)
greedy from a text prompt gives transformers' ids and text; the builtin micro-opt (no
tokenizer) takes prompt ids, streams tokens and stops at its end id."""
import json

import pytest

import flexdiag
from conftest import GOLDEN

OPT = GOLDEN / "opt"


@pytest.fixture(scope="module")
def greedy():
    return json.loads((OPT / "greedy.json").read_text())


@pytest.fixture(scope="module")
def opt(runtime):
    with flexdiag.Model(runtime, OPT) as m:  # a path-like folder
        yield m


def test_greedy_text_equals_transformers(opt, greedy):
    with flexdiag.Context(opt, max_images=1, max_new_tokens=greedy["max_new_tokens"]) as c:
        (r,) = c.generate_text(greedy["prompt"], top_k=1, stop_at_eos=False)
    assert r.ids == greedy["generated"]
    assert r.text == greedy["text"]
    assert opt.eos == greedy["eos_id"] and opt.image_size == (0, 0)


def test_text_prompt_equals_its_ids(opt, greedy):
    with flexdiag.Context(opt, max_images=2, max_new_tokens=8) as c:
        a = c.generate_text([greedy["prompt"], "Once"], top_k=1)
        b = c.generate_text([greedy["prompt_ids"]], top_k=1)
        with pytest.raises(TypeError, match="a list of texts, or a list of token id lists"):
            c.generate_text([greedy["prompt"], greedy["prompt_ids"]])
    assert a[0].ids == b[0].ids == greedy["generated"][:8]
    assert [r.index for r in a] == [0, 1] and a[1].ids != a[0].ids


@pytest.fixture(scope="module")
def micro_opt(runtime):
    with flexdiag.Model(runtime, arch="micro-opt") as m:
        yield m


def test_prompt_ids_stream_and_stop_at_eos(micro_opt):
    streamed = {}

    def on_token(handle, index, step, token):
        streamed.setdefault(index, []).append(token)

    with flexdiag.Context(micro_opt, max_images=4, max_new_tokens=48) as c:
        rs = c.generate_text([[2, 50, 81], [2, 60]], images_per_prompt=3, seed=9,
                             on_token=on_token)
    assert [r.index for r in rs] == list(range(6))
    for r in rs:
        assert r.text is None  # the builtin shape has no tokenizer.json
        assert r.ids == streamed[r.index]
        assert 1 <= len(r.ids) <= 48
        assert len(r.ids) == 48 or r.ids[-1] == micro_opt.eos
        assert micro_opt.eos not in r.ids[:-1]


def test_max_new_tokens_per_request(micro_opt):
    with flexdiag.Context(micro_opt, max_images=2, max_new_tokens=32) as c:
        (r,) = c.generate_text([[2, 50]], max_new_tokens=5, stop_at_eos=False, seed=1)
        assert len(r.ids) == 5
        with pytest.raises(flexdiag.Error) as e:
            c.generate_text([[2, 50]], max_new_tokens=33)
    assert e.value.status == flexdiag.Status.INVALID_ARG
    assert "max_new_tokens 33" in e.value.message


def test_text_prompt_without_tokenizer_names_the_fix(micro_opt):
    with flexdiag.Context(micro_opt, max_images=1) as c, pytest.raises(flexdiag.Error) as e:
        c.generate_text("hello")
    assert e.value.status == flexdiag.Status.NOT_FOUND
    assert "pass prompt token ids" in e.value.message
