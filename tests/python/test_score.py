# SPDX-License-Identifier: MIT
"""Teacher-forced scoring on micro-janus: shapes, the CFG combination of the raw rows, the same
logits twice, and the same values with and without numpy."""
import pytest

import flexdiag
from conftest import byte_prompt

IDS = [(i * 37) % 256 for i in range(64)]


def test_cfg_logits_combine_the_rows(ctx):
    np = pytest.importorskip("numpy")
    s = ctx.score(byte_prompt("a cat"), IDS, cfg_weight=3.0, raw=True)
    assert s.logits.shape == (64, 256) and s.raw.shape == (2, 64, 256)
    cond, uncond = s.raw
    assert np.allclose(s.logits, uncond + 3.0 * (cond - uncond), rtol=1e-3, atol=1e-3)
    assert np.isfinite(s.logits).all()
    again = ctx.score(byte_prompt("a cat"), IDS, cfg_weight=3.0)
    assert again.raw is None and (again.logits == s.logits).all()


def test_plain_python_scores_are_the_same(ctx, without_numpy_pil):
    s = ctx.score(byte_prompt("a cat"), IDS[:16], raw=True)
    assert len(s.logits) == 16 and len(s.logits[0]) == 256
    assert len(s.raw) == 2 and len(s.raw[0]) == 16
    w = 5.0  # the library's default cfg_weight
    for c_row, u_row, l_row in zip(s.raw[0], s.raw[1], s.logits):
        assert all(abs(l - (u + w * (c - u))) <= 1e-3 * (1 + abs(l))
                   for c, u, l in zip(c_row, u_row, l_row))


def test_score_errors_name_the_field(ctx):
    with pytest.raises(flexdiag.Error) as e:
        ctx.score(byte_prompt("a cat"), [])
    assert e.value.status == flexdiag.Status.INVALID_ARG
