"""The make targets a user types first: help, config, a bad deploy refused before any host, and
values typed on the make command line that never run anything (issue 20); no target that touches
hosts succeeds without hosts to run on, and SERIAL is checked before anything runs (issue 33)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not (REPO / ".venv" / ".installed").exists(), reason="needs `make setup`")
# What the user sets on the make command line (the Makefile's USER_VARS, and INV made from them).
USER_VARS = ("CONFIG", "INVENTORY", "LIMIT", "SERIAL", "LAB_HOSTS", "LAB_INVENTORY", "BUDGETS", "TOPK_CAPS",
             "CLIFF_DROP", "TIE_TOLERANCE", "BATCHES", "HOST", "PATCHES", "REPLACES", "INV")
# What `make help` must explain, one line each: the user variables and the lab's settings (tests/lab/README.md).
HELP_VARS = ("CONFIG", "INVENTORY", "LIMIT", "SERIAL", "HOST", "BUDGETS", "TOPK_CAPS", "CLIFF_DROP", "TIE_TOLERANCE",
             "BATCHES",
             "PATCHES", "PATCH", "REPLACES", "LAB_HOSTS", "LAB_NET", "LAB_DIR", "LAB_INVENTORY", "LAB_GPU_COUNTS",
             "LAB_CACHE")
# Every target that runs plays (or testinfra, or the controller's gate/sweep) on the hosts.
HOST_TARGETS = ("deploy", "rollback", "provision", "status", "build", "verify", "plan", "gate", "sweep", "reference")


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
    """`make` with the programs its recipes run (sgdeploy, ansible-playbook, pytest) replaced by
    recorders of their argv. Returns run(*make_args, real_sgdeploy=False) -> (CompletedProcess,
    [argv, ...]); real_sgdeploy keeps the real sgdeploy command (its checks run)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sgdeploy", "ansible-playbook", "pytest"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "argv.jsonl"

    def run(*args: str, real_sgdeploy: bool = False) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
        record.unlink(missing_ok=True)
        programs = [f"ANSIBLE_PLAYBOOK={bin_dir / 'ansible-playbook'}", f"PYTEST={bin_dir / 'pytest'}"]
        if not real_sgdeploy:
            programs.append(f"SGDEPLOY={bin_dir / 'sgdeploy'}")
        proc = make(*programs, *args, env_extra={"RECORD_FILE": str(record)})
        calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
        return proc, calls

    return run


def test_help_lists_every_target_with_a_line():
    out = make("help").stdout
    for target in ("setup", "config", "render", "wheel", "deploy", "rollback", "status", "provision", "verify",
                   "sweep", "lab-up", "lab-down", "lab-status", "lint", "test-unit", "test-slow", "test"):
        assert any(line.split()[0] == target and len(line.split()) > 1 for line in out.splitlines() if line.strip()), \
            target


def test_help_lists_every_variable_a_user_sets_with_a_line():
    out = make("help").stdout.splitlines()
    for var in HELP_VARS:
        lines = [line for line in out if line.split() and line.split()[0].split("=")[0] == var]
        assert len(lines) == 1 and len(lines[0].split()) > 2, (var, out)


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


HOSTS = ["sgdeploy", "hosts", "-q"]  # the check that the plays have hosts, first


def test_sweep_passes_its_tuning_variables_on(recorded):
    proc, calls = recorded("sweep", "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml", "BUDGETS=15 32",
                           "CLIFF_DROP=0.2", "TIE_TOLERANCE=0.05", "BATCHES=1 4 8")
    assert proc.returncode == 0, proc.stderr
    assert calls == [HOSTS + ["--inventory", "inventory/example.yml"],
                     ["sgdeploy", "sweep", "--config", "ddtree-b15", "--inventory", "inventory/example.yml",
                      "--budgets", "15 32", "--cliff-drop", "0.2", "--tie-tolerance", "0.05", "--batches", "1 4 8"]]
    proc, calls = recorded("sweep", "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml")
    assert calls[1:] == [["sgdeploy", "sweep", "--config", "ddtree-b15", "--inventory", "inventory/example.yml",
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
                           "SERIAL=25%")
    assert proc.returncode == 0, proc.stderr
    assert calls == [["sgdeploy", "validate", "ddtree-b15"],
                     HOSTS + ["--inventory", f"inv.yml{evil}", "--limit", f"gpu-01{evil}", "--limit-name", "LIMIT"],
                     ["ansible-playbook", "-i", f"inv.yml{evil}", "--limit", f"gpu-01{evil},localhost",
                      "playbooks/deploy.yml", "-e", "config=ddtree-b15", "-e", "deploy_serial=25%"]]
    proc, calls = recorded("sweep", "CONFIG=ddtree-b15", "INVENTORY=inv.yml", f"HOST=lab1`touch {marker}`",
                           f"BUDGETS=8 15{evil}", f"TOPK_CAPS=4{evil}", f"CLIFF_DROP=0.2{evil}",
                           f"TIE_TOLERANCE=$(shell touch {marker})")
    assert calls == [HOSTS + ["--inventory", "inv.yml", "--limit", f"lab1`touch {marker}`", "--limit-name", "HOST"],
                     ["sgdeploy", "sweep", "--config", "ddtree-b15", "--inventory", "inv.yml", "--budgets",
                      f"8 15{evil}", "--topk-caps", f"4{evil}", "--host", f"lab1`touch {marker}`", "--cliff-drop",
                      f"0.2{evil}", "--tie-tolerance", f"$(shell touch {marker})"]]
    proc, calls = recorded("wheel", f"PATCHES=ddtree{evil}")
    assert calls == [["sgdeploy", "wheel", "--features", f"ddtree{evil}"]]
    proc, calls = recorded("gate", "CONFIG=ddtree-b15", "INVENTORY=inv.yml", f"HOST=lab1{evil}")
    assert calls == [HOSTS + ["--inventory", "inv.yml", "--limit", f"lab1{evil}", "--limit-name", "HOST"],
                     ["sgdeploy", "gate", "ddtree-b15", "--inventory", "inv.yml", "--host", f"lab1{evil}"]]
    for target in ("status", "provision"):
        proc, calls = recorded(target, f"INVENTORY=inv.yml{evil}", f"LIMIT=a{evil}")
        # localhost too: the controller's plays (config check, status table) still run under LIMIT=
        assert calls == [HOSTS + ["--inventory", f"inv.yml{evil}", "--limit", f"a{evil}", "--limit-name", "LIMIT"],
                         ["ansible-playbook", "-i", f"inv.yml{evil}", "--limit", f"a{evil},localhost",
                          f"playbooks/{target}.yml",
                          *(["-e", "provision_allow_drain=0"] if target == "provision" else [])]]
    proc, calls = recorded("provision", "INVENTORY=inv.yml", f"DRAIN=1{evil}")
    assert calls[-1][-2:] == ["-e", f"provision_allow_drain=1{evil}"]  # one argument; the role reads it | bool
    # SERIAL is checked before anything runs: a value with shell syntax is refused, never run.
    proc, calls = recorded("deploy", "CONFIG=ddtree-b15", "INVENTORY=inv.yml", f"SERIAL=1$(touch {marker})")
    assert proc.returncode == 2 and calls == [] and f"SERIAL='1$(touch {marker})' is not allowed" in proc.stderr
    assert not marker.exists()


# --- No target that touches hosts succeeds without hosts (issue 33) -------------------------------------

def one_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints (make's own `make: *** ... Error 2` aside); no traceback."""
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


HOST_TARGET_ARGS = {"deploy": ["CONFIG=ddtree-b15"], "rollback": ["CONFIG=ddtree-b15"], "build": ["CONFIG=ddtree-b15"],
                    "plan": ["CONFIG=ddtree-b15"], "gate": ["CONFIG=ddtree-b15"], "sweep": ["CONFIG=ddtree-b15"],
                    "reference": ["CONFIG=ddtree-b15"]}


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_a_missing_inventory_stops_every_host_target_with_one_line(recorded, tmp_path, target):
    """Before: warnings, `skipping: no hosts matched`, exit 0 (deploy, rollback, provision, status, build,
    plan, reference; verify ran testinfra on no host)."""
    missing = tmp_path / "prod.yml"
    proc, calls = recorded(target, *HOST_TARGET_ARGS.get(target, []), f"INVENTORY={missing}", real_sgdeploy=True)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert one_line(proc) == (f"sgdeploy hosts: inventory {missing}: no such file or folder; give an Ansible "
                              "inventory that lists the hosts in group gpu_hosts, as inventory/example.yml does")
    assert calls == [] and "PLAY" not in proc.stdout


BAD_INVENTORIES = {
    "broken-yaml": ("inv.yml", "all:\n  children:\n    gpu_hosts:\n      hosts:\n        a: {ansible_host: 1\n",
                    "Ansible cannot parse it: YAML parsing failed: "),
    "not-a-mapping": ("inv.yml", "- gpu-01\n- gpu-02\n",
                      "Ansible cannot parse it: YAML inventory has invalid structure, it should be a dictionary, "
                      "got: a list"),
    "broken-ini": ("inv.ini", "[gpu_hosts\nfoo bar = =\n", "Ansible cannot parse it: Failed to parse inventory"),
    "no-gpu_hosts": ("inv.yml", "all:\n  hosts:\n    gpu-01: {}\n",
                     "group gpu_hosts has no host; give an Ansible inventory that lists the hosts in group gpu_hosts"),
    "empty": ("inv.yml", "", "group gpu_hosts has no host"),
}


@pytest.mark.parametrize("case", BAD_INVENTORIES)
@pytest.mark.parametrize("target", ("deploy", "status", "verify"))
def test_an_inventory_without_hosts_to_run_on_stops_with_one_line(recorded, tmp_path, target, case):
    name, text, message = BAD_INVENTORIES[case]
    inventory = tmp_path / name
    inventory.write_text(text)
    proc, calls = recorded(target, *HOST_TARGET_ARGS.get(target, []), f"INVENTORY={inventory}", real_sgdeploy=True)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert one_line(proc).startswith(f"sgdeploy hosts: inventory {inventory}: {message}"), proc.stderr
    assert calls == []


INVENTORY = "all:\n  children:\n    gpu_hosts:\n      hosts:\n        gpu-01: {}\n        gpu-02: {}\n" \
            "    other:\n      hosts:\n        bastion: {}\n"


@pytest.mark.parametrize("target, variable, value, message", [
    ("deploy", "LIMIT", "gpu-09", "LIMIT 'gpu-09' matches no host in {inv} (hosts of gpu_hosts there: gpu-01, gpu-02)"),
    ("status", "LIMIT", "gpu-01,gpu-09", "LIMIT 'gpu-01,gpu-09': 'gpu-09' matches no host in {inv}"),
    ("rollback", "LIMIT", "bastion", "LIMIT 'bastion' matches no host of group gpu_hosts in {inv}"),
    ("provision", "LIMIT", "~gpu-1.*", "LIMIT '~gpu-1.*' matches no host in {inv}"),
    ("reference", "HOST", "gpu-9", "HOST 'gpu-9' matches no host in {inv}"),
    ("sweep", "HOST", "bastion", "HOST 'bastion' matches no host of group gpu_hosts in {inv}"),
])
def test_a_limit_that_matches_no_host_stops_with_one_line(recorded, tmp_path, target, variable, value, message):
    inventory = tmp_path / "inv.yml"
    inventory.write_text(INVENTORY)
    proc, calls = recorded(target, *HOST_TARGET_ARGS.get(target, []), f"INVENTORY={inventory}", f"{variable}={value}",
                           real_sgdeploy=True)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert one_line(proc).startswith("sgdeploy hosts: " + message.format(inv=inventory)), proc.stderr
    assert calls == []


def test_a_limit_that_matches_runs_the_play(recorded, tmp_path):
    inventory = tmp_path / "inv.yml"
    inventory.write_text(INVENTORY)
    proc, calls = recorded("deploy", "CONFIG=ddtree-b15", f"INVENTORY={inventory}", "LIMIT=gpu-0*", real_sgdeploy=True)
    assert proc.returncode == 0, proc.stderr
    assert calls == [["ansible-playbook", "-i", str(inventory), "--limit", "gpu-0*,localhost", "playbooks/deploy.yml",
                      "-e", "config=ddtree-b15", "-e", "deploy_serial=1"]]
    proc, calls = recorded("verify", f"INVENTORY={inventory}", real_sgdeploy=True)
    assert proc.returncode == 0 and calls[0][:3] == ["pytest", "-p", "no:cacheprovider"], (proc.stderr, calls)


def test_verify_checks_the_fleet_routers_host_too(recorded, tmp_path):
    """Before: `make verify` ran testinfra on gpu_hosts only; a fleet router's host (group routers) was never
    checked. Now the same run takes both groups (testinfra runs only the router checks on a router host)."""
    inventory = tmp_path / "inv.yml"
    inventory.write_text(INVENTORY)
    proc, calls = recorded("verify", f"INVENTORY={inventory}", real_sgdeploy=True)
    assert proc.returncode == 0, proc.stderr
    assert "--hosts=ansible://gpu_hosts,ansible://routers" in calls[0], calls


# --- SERIAL (issue 34) ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", "0%", "101%", "", "1 2", "01"])
@pytest.mark.parametrize("target", ("deploy", "rollback"))
def test_a_bad_serial_is_refused_before_anything_runs(recorded, target, value):
    """Before: Ansible's 'probably a bug' traceback for abc; 0 meant 1."""
    proc, calls = recorded(target, "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml", f"SERIAL={value}")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert one_line(proc) == (f"SERIAL='{value}' is not allowed: use a whole number of hosts at a time from 1 "
                              "(e.g. SERIAL=2) or a percentage from 1% to 100% (e.g. SERIAL=25%)")
    assert calls == []


@pytest.mark.parametrize("value", ["1", "3", "100", "1%", "25%", "100%"])
def test_a_good_serial_reaches_the_play(recorded, value):
    proc, calls = recorded("rollback", "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml", f"SERIAL={value}")
    assert proc.returncode == 0, proc.stderr
    assert calls[-1][-2:] == ["-e", f"rollback_serial={value}"]


@pytest.mark.parametrize("target, playbook", [("deploy", "playbooks/deploy.yml"),
                                              ("rollback", "playbooks/rollback.yml")])
def test_max_unavailable_reaches_the_fleet_play_as_one_argument(recorded, target, playbook):
    proc, calls = recorded(target, "CONFIG=ddtree-b15", "INVENTORY=inventory/example.yml", "MAX_UNAVAILABLE=25% x")
    assert proc.returncode == 0, proc.stderr
    assert playbook in calls[-1] and calls[-1][-2:] == ["-e", "fleet_max_unavailable=25% x"]


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


# --- REPLACES (issue 34 item 4: nothing is replaced silently) --------------------------------------------

@pytest.mark.parametrize("target, playbook", [("deploy", ["playbooks/deploy.yml", "-e", "config=ddtree-b15", "-e",
                                                          "deploy_serial=1"]),
                                              ("plan", ["playbooks/deploy.yml", "--check", "--diff", "-e",
                                                        "config=ddtree-b15"]),
                                              ("rollback", ["playbooks/rollback.yml", "-e", "config=ddtree-b15", "-e",
                                                            "rollback_serial=1"])])
def test_replaces_reaches_the_play_as_one_argument(recorded, tmp_path, target, playbook):
    """Before: REPLACES was no variable of the Makefile; the play never heard of it."""
    marker = tmp_path / "pwned"
    value = f"ddtree-b15,ar;touch {marker} $(touch {marker})"
    proc, calls = recorded(target, "CONFIG=ddtree-b15", "INVENTORY=inv.yml", f"REPLACES={value}")
    assert proc.returncode == 0, proc.stderr
    assert calls[-1] == ["ansible-playbook", "-i", "inv.yml", *playbook, "-e", f"replaces={value}"]
    assert not marker.exists()
    # Unset: no replaces at all (the play's default, nothing named).
    proc, calls = recorded(target, "CONFIG=ddtree-b15", "INVENTORY=inv.yml")
    assert calls[-1] == ["ansible-playbook", "-i", "inv.yml", *playbook]
