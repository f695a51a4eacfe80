# SPDX-License-Identifier: MIT
"""Fixtures of the Python binding's tests (tests/python/meson.build runs them with
FLEXDIAG_LIBRARY set to the built library and PYTHONPATH to python/): one CPU runtime of two
threads and the builtin models, loaded once per session; a small micro-janus context per test.
"""
import os
import pathlib
import sys

import pytest

import flexdiag

TESTS = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = TESTS / "golden" / "data"


def byte_prompt(text):
    """The prompt ids the builtin byte tokenizer of tiny-janus and micro-janus makes of text
    (runtime/text/prompt.c): BOS, "User: ", the bytes, "\\n\\nAssistant:", <begin_of_image>."""
    return [256, 259, ord(":"), ord(" ")] + list(text.encode()) + [10, 10, 260, ord(":"), 261]


@pytest.fixture(scope="session")
def runtime():
    with flexdiag.Runtime(device=-1, threads=2) as rt:
        yield rt


@pytest.fixture(scope="session")
def micro(runtime):
    with flexdiag.Model(runtime, arch="micro-janus") as m:
        yield m


@pytest.fixture(scope="session")
def tiny(runtime):
    with flexdiag.Model(runtime, arch="tiny-janus") as m:
        yield m


@pytest.fixture
def ctx(micro):
    with flexdiag.Context(micro, max_images=4, max_prompt_len=64) as c:
        yield c


@pytest.fixture
def without_numpy_pil(monkeypatch):
    """Block numpy and Pillow: importing them raises ImportError for the test's duration."""
    for name in ("numpy", "PIL", "PIL.Image"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(scope="session")
def cli():
    """The flexdiag CLI of the same build (FLEXDIAG_BIN)."""
    path = os.environ.get("FLEXDIAG_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("FLEXDIAG_BIN is not set to the built flexdiag CLI (meson test sets it)")
    return path
