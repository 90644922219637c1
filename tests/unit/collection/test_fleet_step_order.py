"""The fleet role runs its plan's steps in the plan's order, the canary first, whatever order the GPU hosts' results
of the step loop come back in (role sglang_fleet: main.yml and rollback.yml include step.yml for every step on every
host). Before: the step loop skipped the steps without the host's engine, and Ansible runs the included files of a
loop in the order the hosts' results come back, so lab2's step ran before the canary's whenever lab1's came back last
(the lab's failed-canary phase, 2026-12-05: "FLEET ROLLOUT STOPPED on lab2", the canary never deployed).

Here the role's own main.yml, rollback.yml and step.yml run over local hosts with the engine's tasks replaced by one
line naming the step and the host; with one fork the hosts' results come back in inventory order, and the inventory
lists the canary's host (lab1) last, so its results come back last every time."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from role_tasks import ROLES

BIN = Path(sys.executable).parent
TASKS = ROLES / "sglang_fleet" / "tasks"
STUB = ('- name: Name the step and the engine\n  ansible.builtin.debug:\n'
        '    msg: "ENGINE {{ sglang_fleet__step }} {{ inventory_hostname }}"\n')


def _engine(host: str) -> dict:
    return {"host": host, "url": f"http://{host}:31300", "replica": None}


PLAN = {   # lab-fleet-b15's plan with max_unavailable 2 (sgdeploy.fleet.plan), the engines' entries trimmed
    "steps": [{"batch": 0, "engines": {"lab1": _engine("lab1")}},
              {"batch": 1, "engines": {"lab2": _engine("lab2"), "lab3": _engine("lab3")}}],
    "rollback_steps": [{"batch": 0, "engines": {"lab1": _engine("lab1"), "lab2": _engine("lab2")}},
                       {"batch": 1, "engines": {"lab3": _engine("lab3")}}],
    "routers": [{"host": "lab4", "url": "http://lab4:31300"}], "router": {"host": "lab4", "url": "http://lab4:31300"},
    "routed": False,
}


def _ran(tmp_path: Path, entry: str) -> list[tuple[int, str]]:
    """(step, host) of each engine the role's entry point ran, in the order they ran."""
    tasks = tmp_path / "roles" / "fleet" / "tasks"
    tasks.mkdir(parents=True)
    for name in ("main.yml", "rollback.yml", "step.yml"):
        shutil.copy(TASKS / name, tasks / name)
    for name in ("engine.yml", "rollback_engine.yml"):
        (tasks / name).write_text(STUB)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_hosts": {"hosts": {h: dict(local) for h in ("lab3", "lab2", "lab1")}},
        "routers": {"hosts": {"lab4": dict(local, sglang_fleet_plan=PLAN)}}}}}, sort_keys=False))
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"name": "Roll", "hosts": "gpu_hosts", "gather_facts": False,
                                     "any_errors_fatal": True, "tasks": [{"ansible.builtin.include_role": {
                                         "name": "fleet", "tasks_from": entry}}]}]))
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(tmp_path / "roles"), ANSIBLE_FORKS="1", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(tmp_path / "none.cfg"))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(play)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return [(int(s), h) for s, h in re.findall(r'"msg": "ENGINE (\d+) (lab\d)"', proc.stdout)]


@pytest.mark.parametrize("entry, expected", [
    ("main", [(0, "lab1"), (1, "lab3"), (1, "lab2")]),       # the canary alone first, then lab2 and lab3 together
    ("rollback", [(0, "lab2"), (0, "lab1"), (1, "lab3")]),   # lab1 and lab2 together first, then lab3
])
def test_the_steps_run_in_the_plans_order_when_the_canarys_results_come_back_last(tmp_path, entry, expected):
    assert _ran(tmp_path, entry) == expected
