"""The make targets a user types first: help, config, and a bad deploy refused before any host."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (REPO / ".venv" / ".installed").exists(), reason="needs `make setup`")


def make(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=REPO, capture_output=True,
                          text=True, env=env, check=False, timeout=300)


def test_help_lists_every_target_with_a_line():
    out = make("help").stdout
    for target in ("setup", "config", "render", "wheel", "deploy", "rollback", "status", "provision", "verify",
                   "sweep", "lab-up", "lab-down", "lab-status", "lint", "test"):
        assert any(line.split()[0] == target and len(line.split()) > 1 for line in out.splitlines() if line.strip()), \
            target


def test_deploy_without_config_says_what_to_type():
    result = make("deploy")
    assert result.returncode != 0
    assert "CONFIG is required, e.g. make deploy CONFIG=ddtree-b15" in result.stderr


def test_deploy_of_a_bad_config_is_refused_before_any_host(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("extends: ddtree-b15\nspeculative: {budget: 0}\n")
    result = make("deploy", f"CONFIG={bad}", "INVENTORY=/nonexistent/inventory.yml")
    assert result.returncode != 0
    assert f"{bad}: speculative.budget: 0: must be between 1 and 256" in result.stderr
    assert "ansible-playbook" not in result.stdout and "PLAY" not in result.stdout


def test_config_prints_the_merged_config():
    result = make("config", "CONFIG=ddtree-b64")
    assert result.returncode == 0
    assert "budget: 64" in result.stdout and "algorithm: DDTREE" in result.stdout


def test_sweep_passes_its_tuning_variables_on():
    out = make("-n", "sweep", "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml", "BUDGETS=15 32",
               "CLIFF_DROP=0.2", "TIE_TOLERANCE=0.05").stdout
    line = next(x for x in out.replace("\\\n", " ").splitlines() if "sgdeploy.sweep" in x)
    assert '--budgets "15 32"' in line and "--cliff-drop 0.2" in line and "--tie-tolerance 0.05" in line
    plain = make("-n", "sweep", "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml").stdout
    line = next(x for x in plain.replace("\\\n", " ").splitlines() if "sgdeploy.sweep" in x)
    assert "--cliff-drop" not in line and "--tie-tolerance" not in line
