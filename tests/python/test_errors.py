# SPDX-License-Identifier: MIT
"""Errors: a failing C call raises flexdiag.Error with the status (code and name) and the
library's message naming the problem; unknown keyword arguments are TypeErrors listing the
fields; a missing or too old library is refused with what to do."""
import os
import subprocess
import sys

import pytest

import flexdiag


def test_bad_sampling_names_the_field(ctx):
    with pytest.raises(flexdiag.Error) as e:
        ctx.generate("a cat", temperature=0.0)
    err = e.value
    assert err.status == flexdiag.Status.INVALID_ARG == -1
    assert err.status_name == "INVALID_ARG"
    assert "temperature" in err.message and "> 0" in err.message
    assert err.message in str(err) and "INVALID_ARG" in str(err)


def test_unknown_arch_lists_the_valid_ones(runtime):
    with pytest.raises(flexdiag.Error) as e:
        flexdiag.Model(runtime, arch="no-such-model")
    assert e.value.status == flexdiag.Status.INVALID_ARG
    assert "no-such-model" in e.value.message and "micro-janus" in e.value.message


def test_unknown_policy_lists_the_valid_ones(micro):
    with pytest.raises(flexdiag.Error) as e:
        flexdiag.Context(micro, policy="sideways")
    assert "diagonal" in e.value.message


def test_unknown_parameter_is_a_type_error(micro):
    with pytest.raises(TypeError, match="unknown parameter 'max_imgs'.*max_images"):
        flexdiag.Context(micro, max_imgs=2)
    with pytest.raises(TypeError, match="unknown parameter 'progress_user'"):
        flexdiag.Context(micro, progress_user=1)
    with pytest.raises(ValueError, match="'continuous' or 'blocks'"):
        flexdiag.Context(micro, batching="sometimes")


def test_context_over_the_budget_names_the_batch_that_fits():
    with flexdiag.Runtime(device=-1, threads=1, gpu_mem=32 << 20) as rt, \
            flexdiag.Model(rt, arch="micro-janus") as m:
        fit = m.max_images(max_prompt_len=32)
        assert fit >= 1
        with pytest.raises(flexdiag.Error) as e:
            flexdiag.Context(m, max_images=fit + 1, max_prompt_len=32)
    assert e.value.status == flexdiag.Status.OOM_DEVICE
    assert f"the largest batch that fits is {fit}" in e.value.message


def test_tokens_of_a_running_request_is_busy(ctx):
    h = ctx.submit("a cat", images_per_prompt=4, seed=1)
    with pytest.raises(flexdiag.Error) as e:
        h.tokens()
    h.wait()
    assert e.value.status == flexdiag.Status.BUSY and "wait first" in e.value.message
    assert len(h.tokens()) == 4
    h.close()


def load_in_a_new_process(library):
    """stderr of a fresh interpreter that loads the binding with FLEXDIAG_LIBRARY=library."""
    env = dict(os.environ, FLEXDIAG_LIBRARY=library)
    p = subprocess.run([sys.executable, "-c", "import flexdiag; flexdiag.api_version()"],
                       env=env, capture_output=True, text=True)
    assert p.returncode != 0
    return p.stderr


def test_missing_library_says_what_to_do(tmp_path):
    err = load_in_a_new_process(str(tmp_path / "libflexdiag.so"))
    assert "LibraryError" in err and "point it at a built libflexdiag.so" in err


def test_library_without_the_api_is_refused():
    err = load_in_a_new_process("libc.so.6")
    assert f"needs {flexdiag.MIN_API_VERSION} or newer" in err
