# SPDX-License-Identifier: MIT
"""`pip install ./python` offline with the command python/README.md gives: a venv that sees
the system's site-packages (Debian's python3-setuptools and python3-wheel), then pip with
--no-index --no-build-isolation. The installed package imports from the venv (PYTHONPATH
unset, another working folder) and loads the built library (about 5 s)."""
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import flexdiag

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "python"


def test_offline_install_imports(tmp_path):
    missing = [m for m in ("setuptools", "wheel") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{sys.executable} lacks {', '.join(missing)} "
                    "(apt-get install python3-setuptools python3-wheel)")
    src = tmp_path / "python"  # a copy: the build writes build/ and *.egg-info next to it
    shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                               "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_CACHE_DIR"] = str(tmp_path / "pip-cache")
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          env=env, capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"{sys.executable} -m venv failed (apt-get install python3-venv): "
                    f"{made.stdout.strip()} {made.stderr.strip()}")
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index",
                          "--no-build-isolation", str(src)], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe = "import flexdiag; print(flexdiag.__file__); print(flexdiag.api_version())"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], check=True, env=env,
                         cwd=tmp_path, capture_output=True, text=True).stdout.split()
    assert out[0].startswith(str(venv)) and out[0].endswith("flexdiag/__init__.py")
    assert int(out[1]) >= flexdiag.MIN_API_VERSION
