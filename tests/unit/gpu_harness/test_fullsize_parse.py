"""Every command line of the full-size plan (tests/gpu/fullsize/full_plan.py) parses with the patched SGLang
0.5.23's own argument parser and speculative resolution, on the CPU, against the Qwen3.6-27B-shaped configs
models.py writes (the resolution reads them): the flags exist, and DDTree resolves budget + 1 verify tokens.
Slow (builds the wheels, as test_patched_cli.py does, whose fixtures it uses)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "gpu" / "fullsize"))
sys.path.insert(0, str(HERE.parents[1] / "gpu" / "e2e"))
sys.path.insert(0, str(HERE.parent / "series"))  # test_patched_cli

import full_plan  # noqa: E402
import models  # noqa: E402
from test_patched_cli import cpu_python, downloads, parse, site_dirs  # noqa: E402, F401  (fixtures)

pytestmark = pytest.mark.slow


def test_every_fullsize_command_line_parses_with_the_patched_server(cpu_python, site_dirs, tmp_path):  # noqa: F811
    models.make(tmp_path)
    site = site_dirs["patched"][1]
    for e in full_plan.build()["servers"]:
        argv = [a.replace(full_plan.MODELS, str(tmp_path)) for a in e["args"]] + ["--device", "cuda"]
        got, err = parse(cpu_python, site, argv)
        assert "rejected" not in got, (e["name"], got, err[-1500:])
        if e["algorithm"] == "DDTREE":
            assert got["speculative_ddtree_budget"] == e["budget"]
            assert got["speculative_num_draft_tokens"] == e["budget"] + 1
            assert got["speculative_ddtree_state_forking"] == ("on" if e["state_forking"] else "off")
            assert got["speculative_ddtree_topk"] == ("fused" if e["fused_topk"] else "torch")
        else:
            assert got["speculative_algorithm"] == (None if e["algorithm"] == "NONE" else e["algorithm"])
