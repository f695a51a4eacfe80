# SPDX-License-Identifier: MIT
"""The ctypes structs (python/flexdiag/_structs.py) against the C layout of include/flexdiag.h,
printed by tests/python/layout.c: same fields in the same order, same offsets and sizes; and
the library's _init() defaults as the binding takes them."""
import ctypes
import json
import os
import subprocess

import pytest

import flexdiag
from flexdiag import _lib
from flexdiag import _structs as S


@pytest.fixture(scope="module")
def layout():
    exe = os.environ.get("FLEXDIAG_LAYOUT_BIN")
    if not exe:
        pytest.skip("FLEXDIAG_LAYOUT_BIN is not set to tests/python/layout.c's program "
                    "(meson test sets it)")
    return json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)


def test_header_is_the_version_the_binding_needs(layout):
    assert layout["api_version"] >= flexdiag.MIN_API_VERSION
    assert flexdiag.api_version() == layout["api_version"]


def test_structs_match_the_header(layout):
    assert len(layout["structs"]) == 13
    for name, want in layout["structs"].items():
        cls = getattr(S, name)
        fields = [f for f, _ in cls._fields_ if f != "struct_size"]
        assert fields == list(want["fields"]), name
        assert {f: getattr(cls, f).offset for f in fields} == want["fields"], name
        assert ctypes.sizeof(cls) == want["size"], name


def test_init_fills_the_library_defaults():
    c = _lib.init(S.ContextParams())
    assert c.struct_size == ctypes.sizeof(S.ContextParams)
    assert (c.max_images, c.max_prompt_len, c.max_new_tokens) == (16, 128, 128)
    assert c.policy.struct_size == ctypes.sizeof(S.PolicyParams)
    r = _lib.init(S.Request())
    assert (r.images_per_prompt, r.cfg_weight, r.temperature, r.top_p) == (1, 5.0, 1.0, 1.0)
    m = _lib.init(S.ModelParams())
    assert (m.arch, m.random_weights, m.seed) == (b"tiny-janus", True, 1)
    assert set(S.INIT) == {type(s) for s in (c, r, m)} | {S.RuntimeParams, S.ScoreRequest,
                                                         S.SubmitParams}
