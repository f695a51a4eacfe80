# SPDX-License-Identifier: MIT
"""Image generation through the binding: tiny-janus against the CLI (same tokens and pixels
for the same seed), token grids, seeds, first_image, prompt ids and decoding."""
import json
import subprocess

import pytest

import flexdiag
from conftest import byte_prompt

PROMPT, SEED = "a cat", 7


@pytest.fixture(scope="module")
def tiny_image(tiny):
    with flexdiag.Context(tiny, max_images=1) as c:
        (r,) = c.generate(PROMPT, seed=SEED)
    return r


@pytest.fixture(scope="module")
def cli_out(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    subprocess.run([cli, "generate", "--cpu", "--threads", "2", "--images-per-prompt", "1",
                    "--prompt", PROMPT, "--sample-seed", str(SEED), "--out", str(out),
                    "--quiet"], check=True, capture_output=True)
    return out


def as_lists(grid):
    return grid.tolist() if hasattr(grid, "tolist") else grid


def test_tiny_janus_tokens_equal_the_cli(tiny_image, cli_out):
    cli = json.loads((cli_out / "tokens.json").read_text())["images"][0]["grid"]
    assert as_lists(tiny_image.tokens) == cli
    assert len(cli) == 24 and all(len(row) == 24 for row in cli)


def test_tiny_janus_pixels_equal_the_cli_png(tiny_image, cli_out):
    pil = pytest.importorskip("PIL.Image")
    png = pil.open(cli_out / "0" / "0.png").convert("RGB")
    assert tiny_image.image.size == png.size == (96, 96)
    assert tiny_image.image.tobytes() == png.tobytes()


def test_seed_decides_the_image(ctx):
    a = ctx.generate(PROMPT, seed=1, image_format=None)[0].tokens
    b = ctx.generate(PROMPT, seed=1, image_format=None)[0].tokens
    c = ctx.generate(PROMPT, seed=2, image_format=None)[0].tokens
    assert as_lists(a) == as_lists(b)
    assert as_lists(a) != as_lists(c)


def test_grid_shape_and_codes(ctx):
    rs = ctx.generate(["a cat", "a dog"], images_per_prompt=2, seed=3)
    assert [r.index for r in rs] == [0, 1, 2, 3]
    for r in rs:
        g = as_lists(r.tokens)
        assert len(g) == 8 and all(len(row) == 8 for row in g)
        assert all(0 <= v < 256 for row in g for v in row)  # micro-janus: 256 image codes
        assert r.image.size == (32, 32)


def test_first_image_draws_the_same_image(ctx):
    whole = ctx.generate(PROMPT, images_per_prompt=3, seed=4, image_format=None)
    part = ctx.generate(PROMPT, images_per_prompt=1, first_image=1, seed=4, image_format=None)
    assert as_lists(part[0].tokens) == as_lists(whole[1].tokens)
    assert as_lists(whole[0].tokens) != as_lists(whole[1].tokens)


def test_prompt_ids_equal_the_text_prompt(ctx):
    text = ctx.generate(PROMPT, seed=5, image_format=None)[0].tokens
    ids = ctx.generate([byte_prompt(PROMPT)], seed=5, image_format=None)[0].tokens
    assert as_lists(ids) == as_lists(text)


def test_decode_gives_the_generated_image(ctx, micro):
    (r,) = ctx.generate(PROMPT, seed=6, image_format="raw")
    (again,) = micro.decode([r.tokens], image_format="raw")
    assert again.data == r.image.data and len(r.image.data) == 32 * 32 * 3


def test_context_counters_policy_and_homes(micro):
    with flexdiag.Context(micro, max_images=4, policy="diagonal", sparsity=0.5) as c:
        c.generate(PROMPT, images_per_prompt=4, seed=8, image_format=None)
        stats, policy, homes = c.stats(), c.policy(), c.offload()
    assert stats["tokens_generated"] == 4 * 64 * 2  # images x tokens x rows (CFG)
    assert stats["decode_s"] > 0 and stats["kv_bytes_per_seq"] > 0
    assert policy["name"] == "diagonal" and policy["l_dec"] == 64 and policy["n_att"] == 32
    assert homes["scheduler"] == "resident" and homes["kv_pct"] == [100, 0, 0]
