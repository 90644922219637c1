"""The make targets a user types first: help, config, a bad deploy refused before any host, and
values typed on the make command line that never run anything (issue 20)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (REPO / ".venv" / ".installed").exists(), reason="needs `make setup`")
# What the user sets on the make command line (the Makefile's USER_VARS, and INV made from them).
USER_VARS = ("CONFIG", "INVENTORY", "LIMIT", "SERIAL", "LAB_HOSTS", "LAB_INVENTORY", "BUDGETS", "TOPK_CAPS",
             "CLIFF_DROP", "TIE_TOLERANCE", "HOST", "PATCHES", "INV")


def make(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS")) and k not in USER_VARS}
    env.update(env_extra or {})
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=REPO, capture_output=True,
                          text=True, env=env, check=False, timeout=300)


RECORDER = """#!{python}
import json, os, sys
with open(os.environ["RECORD_FILE"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


@pytest.fixture
def recorded(tmp_path):
    """`make` with the programs its recipes run (sgdeploy, ansible-playbook) replaced by recorders
    of their argv. Returns run(*make_args) -> (CompletedProcess, [argv, ...])."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sgdeploy", "ansible-playbook"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "argv.jsonl"

    def run(*args: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
        record.unlink(missing_ok=True)
        proc = make(f"SGDEPLOY={bin_dir / 'sgdeploy'}", f"ANSIBLE_PLAYBOOK={bin_dir / 'ansible-playbook'}", *args,
                    env_extra={"RECORD_FILE": str(record)})
        calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
        return proc, calls

    return run


def test_help_lists_every_target_with_a_line():
    out = make("help").stdout
    for target in ("setup", "config", "render", "wheel", "deploy", "rollback", "status", "provision", "verify",
                   "sweep", "lab-up", "lab-down", "lab-status", "lint", "test-unit", "test-slow", "test"):
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


def test_sweep_passes_its_tuning_variables_on(recorded):
    proc, calls = recorded("sweep", "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml", "BUDGETS=15 32",
                           "CLIFF_DROP=0.2", "TIE_TOLERANCE=0.05")
    assert proc.returncode == 0, proc.stderr
    assert calls == [["sgdeploy", "sweep", "--config", "ddtree-b15", "--inventory", "inventory/example.yml",
                      "--budgets", "15 32", "--cliff-drop", "0.2", "--tie-tolerance", "0.05"]]
    proc, calls = recorded("sweep", "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml")
    assert calls == [["sgdeploy", "sweep", "--config", "ddtree-b15", "--inventory", "inventory/example.yml",
                      "--budgets", "8 15 16 32 64"]]


# --- Values on the make command line never run anything (issue 20) ---------------------------------

CONFIG_TARGETS = ("config", "validate", "render", "wheel", "deploy", "gate", "rollback", "build", "sweep", "verify")
PAYLOADS = ("ddtree-b15;touch {m}", "ddtree-b15`touch {m}`", "ddtree-b15$(touch {m})", "$(shell touch {m})",
            "ddtree-b15 && touch {m}", "ddtree-b15\ntouch {m}")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_config_value_with_shell_syntax_runs_nothing_and_is_refused(payload, tmp_path):
    """Each target that takes CONFIG, run for real with `make`: exit 2, a line naming CONFIG, the
    value and what is allowed, and the marker file the payload would create does not exist."""
    marker = tmp_path / "pwned"
    value = payload.format(m=marker)
    for target in CONFIG_TARGETS:
        proc = make(target, f"CONFIG={value}", "INVENTORY=/nonexistent/inventory.yml")
        assert not marker.exists(), f"make {target} CONFIG={value!r} ran the payload"
        assert proc.returncode == 2, (target, proc.stdout, proc.stderr)
        assert f"CONFIG='{value}' is not allowed: use a config name from configs/" in proc.stderr, (target, proc.stderr)
        assert "or the path of a .yml/.yaml file" in proc.stderr


def test_every_other_variable_reaches_its_program_as_one_argument(recorded, tmp_path):
    marker = tmp_path / "pwned"
    evil = f";touch {marker}"
    proc, calls = recorded("deploy", "CONFIG=ddtree-b15", f"INVENTORY=inv.yml{evil}", f"LIMIT=gpu-01{evil}",
                           f"SERIAL=1$(touch {marker})")
    assert proc.returncode == 0, proc.stderr
    assert calls == [["sgdeploy", "validate", "ddtree-b15"],
                     ["ansible-playbook", "-i", f"inv.yml{evil}", "--limit", f"gpu-01{evil},localhost",
                      "playbooks/deploy.yml", "-e", "config=ddtree-b15", "-e", f"deploy_serial=1$(touch {marker})"]]
    proc, calls = recorded("sweep", "CONFIG=ddtree-b15", "INVENTORY=inv.yml", f"HOST=lab1`touch {marker}`",
                           f"BUDGETS=8 15{evil}", f"TOPK_CAPS=4{evil}", f"CLIFF_DROP=0.2{evil}",
                           f"TIE_TOLERANCE=$(shell touch {marker})")
    assert calls == [["sgdeploy", "sweep", "--config", "ddtree-b15", "--inventory", "inv.yml", "--budgets",
                      f"8 15{evil}", "--topk-caps", f"4{evil}", "--host", f"lab1`touch {marker}`", "--cliff-drop",
                      f"0.2{evil}", "--tie-tolerance", f"$(shell touch {marker})"]]
    proc, calls = recorded("wheel", f"PATCHES=ddtree{evil}")
    assert calls == [["sgdeploy", "wheel", "--features", f"ddtree{evil}"]]
    proc, calls = recorded("gate", "CONFIG=ddtree-b15", "INVENTORY=inv.yml", f"HOST=lab1{evil}")
    assert calls == [["sgdeploy", "gate", "ddtree-b15", "--inventory", "inv.yml", "--host", f"lab1{evil}"]]
    for target in ("status", "provision"):
        proc, calls = recorded(target, f"INVENTORY=inv.yml{evil}", f"LIMIT=a{evil}")
        # localhost too: the controller's plays (config check, status table) still run under LIMIT=
        assert calls == [["ansible-playbook", "-i", f"inv.yml{evil}", "--limit", f"a{evil},localhost",
                          f"playbooks/{target}.yml"]]
    assert not marker.exists()


def test_targets_call_the_one_sgdeploy_command(recorded):
    for target, args in (("config", ["CONFIG=ar"]), ("validate", []), ("render", ["CONFIG=ar"]),
                         ("wheel", ["CONFIG=ar"])):
        proc, calls = recorded(target, *args)
        assert proc.returncode == 0, proc.stderr
        assert calls and calls[0][:2] == ["sgdeploy", target], calls
    text = (REPO / "Makefile").read_text()
    assert "-m sgdeploy" not in text, "a recipe calls `python -m sgdeploy...` instead of the sgdeploy command"


def test_no_recipe_puts_a_user_variable_into_shell_text():
    """Recipes read user variables from the environment ("$$CONFIG"), never as make text ($(CONFIG)),
    which the shell would parse. Targets added later are held to the same rule."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    pattern = re.compile(r"(?<!\$)\$[({](" + "|".join(USER_VARS) + r")\b")
    recipe_lines, in_define = [], False
    for line in text.splitlines():
        if line.startswith("define "):
            in_define = True
        elif line.startswith("endef"):
            in_define = False
        elif line.startswith("\t") or in_define:
            recipe_lines.append(line)
    offenders = [line.strip() for line in recipe_lines if pattern.search(line)]
    assert recipe_lines and not offenders, "\n".join(offenders)
