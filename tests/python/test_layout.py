# SPDX-License-Identifier: MIT
"""The ctypes structs (python/flexdiag/_structs.py) against the C layout of include/flexdiag.h,
printed by tests/python/layout.c: same fields in the same order, same offsets and sizes."""
import ctypes
import json
import os
import subprocess

import pytest

import flexdiag
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
