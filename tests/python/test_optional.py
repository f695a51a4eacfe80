# SPDX-License-Identifier: MIT
"""numpy and Pillow are optional: with both blocked the results are lists and RawImage (whose
PNG writer makes a valid file); with them, numpy arrays and PIL images; the pixels are the
same bytes on every path."""
import sys

import pytest

import flexdiag
from flexdiag import _images

PROMPT, SEED = "a cat", 21


def test_without_numpy_and_pillow(ctx, without_numpy_pil, tmp_path):
    (r,) = ctx.generate(PROMPT, seed=SEED)
    assert isinstance(r.tokens, list) and len(r.tokens) == 8 and len(r.tokens[0]) == 8
    assert isinstance(r.image, flexdiag.RawImage) and r.image.size == (32, 32)
    assert len(r.image.data) == 32 * 32 * 3
    with pytest.raises(ImportError, match="needs Pillow"):
        ctx.generate(PROMPT, seed=SEED, image_format="pil")
    flexdiag.save_png(r.image, tmp_path / "raw.png")
    assert (tmp_path / "raw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def generate_blocked(ctx, monkeypatch):
    with monkeypatch.context() as mp:
        for name in ("numpy", "PIL", "PIL.Image"):
            mp.setitem(sys.modules, name, None)
        return ctx.generate(PROMPT, seed=SEED)[0]


def test_every_path_gives_the_same_pixels(ctx, monkeypatch, tmp_path):
    np = pytest.importorskip("numpy")
    pil = pytest.importorskip("PIL.Image")
    plain = generate_blocked(ctx, monkeypatch)
    (auto,) = ctx.generate(PROMPT, seed=SEED)
    (arr,) = ctx.generate(PROMPT, seed=SEED, image_format="numpy")
    assert isinstance(auto.image, pil.Image) and isinstance(auto.tokens, np.ndarray)
    assert auto.tokens.tolist() == plain.tokens
    assert arr.image.shape == (32, 32, 3) and arr.image.dtype == np.uint8
    assert auto.image.tobytes() == arr.image.tobytes() == plain.image.data
    flexdiag.save_png(plain.image, tmp_path / "raw.png")
    flexdiag.save_png(arr.image, tmp_path / "numpy.png")
    for name in ("raw.png", "numpy.png"):
        assert pil.open(tmp_path / name).convert("RGB").tobytes() == plain.image.data


def test_conversion_rule_on_both_paths():
    np = pytest.importorskip("numpy")
    edges = [-2.0, -1.0, -0.5, 0.0, 0.999, 1.0, 3.0, float("nan")]
    assert list(_images.u8_plain(edges)) == [0, 0, 63, 127, 254, 255, 255, 0]
    # every value whose fp32 steps land next to an integer, and random ones
    k = np.arange(256, dtype=np.float32)
    near = np.concatenate([k * 2 / 255 - 1 + d for d in (-1e-7, 0, 1e-7)]).astype(np.float32)
    rand = np.random.default_rng(1).uniform(-1.1, 1.1, 20000)
    x = np.concatenate([near, rand]).astype(np.float32)
    assert _images.u8_plain(x.tolist()) == _images.u8_numpy(np, x).tobytes()
