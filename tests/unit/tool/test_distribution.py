"""`pip install .` of the project gives a working `sgdeploy` command (issue 35): the wheel carries `sgdeploy`
and the sgdeploy.host collection's module_utils (`ansible_collections.sgdeploy.host.plugins.module_utils`,
pyproject.toml), and its dependencies are declared, so the command runs from a fresh virtualenv, outside
the checkout, with no path hook. Slow (~30-60 s): builds the wheel and installs it with its dependencies
from the configured package index (this machine's local mirror; nothing is fetched from outside)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow

# What a source tree of the project leaves out: git, generated and local folders (.gitignore's).
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "reports", "*.egg-info", "__pycache__", ".pytest_cache",
                                ".ruff_cache", ".whl", "docs", "tests")


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the project's wheel installed (built from a copy of the source tree, so the
    build leaves nothing in the checkout); returns its bin folder."""
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    wheels = sorted((tmp / "dist").glob("sgdeploy-*.whl"))
    assert len(wheels) == 1, wheels
    # The venv gets no pip of its own and nothing byte-compiled: this pip installs into it (--python), which
    # halves the time; what is installed is the same.
    run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], cwd=tmp)
    run([sys.executable, "-m", "pip", "--python", str(tmp / "venv" / "bin" / "python"), "install", "-q", "--no-compile",
         str(wheels[0])], cwd=tmp)
    return tmp / "venv" / "bin"


def test_the_wheel_carries_the_collections_module_utils_and_no_path_hook(installed, tmp_path):
    code = ("import sys, sgdeploy, sgdeploy.serving as s, sgdeploy.gate, sgdeploy.records, sgdeploy.models\n"
            "from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http\n"
            "print(sgdeploy.__file__); print(sglang_http.__file__); print(s.generate is sglang_http.generate)\n"
            "print(any('collections' in p for p in sys.path))")
    out = run([str(installed / "python"), "-c", code], cwd=tmp_path).stdout.splitlines()
    venv = str(installed.parent)
    assert out[0].startswith(venv) and out[1].startswith(venv), out  # the installed files, not the checkout's
    assert out[1].endswith("ansible_collections/sgdeploy/host/plugins/module_utils/sglang_http.py")
    assert out[2:] == ["True", "False"], out


def test_sgdeploy_help_and_validate_run_outside_the_checkout(installed, tmp_path):
    sgdeploy = str(installed / "sgdeploy")
    usage = run([sgdeploy, "--help"], cwd=tmp_path).stdout
    assert usage.startswith("usage: sgdeploy") and "validate" in usage
    config = ROOT / "configs" / "ddtree-b15.yml"
    assert run([sgdeploy, "validate", str(config)], cwd=tmp_path).stdout == f"1 config(s) valid: {config}\n"
    # A subcommand over the module_utils and prometheus_client (sgdeploy.bench imports sgdeploy.serving).
    assert run([sgdeploy, "bench", "--help"], cwd=tmp_path).stdout.startswith("usage:")
    bad = subprocess.run([sgdeploy, "validate", str(tmp_path / "nope.yml")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("nope.yml: no such config file"), bad.stderr
