"""`make status` collects into a folder of its own run (playbooks/status.yml).

CI's three labs run from one checkout, each with a host named lab1; `make status` emptied and filled the one shared
build/status, so a run could read another lab's lab1 records: the CI check of 2026-12-05 showed lab A's `now` row
with the numbers of a deploy measured two minutes before its test began (tests/lab/test_cli.py's status test).

The first fix made the folder in a localhost-only play, which does not run under `--limit lab1` (no localhost): the
hosts then failed with "object of type 'HostVarsVars' has no attribute '_status_run'" (the CI run of 2026-12-06,
eight lab tests). So the playbook itself runs here, over local hosts, with and without localhost in the limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = REPO / "playbooks" / "status.yml"
BIN = Path(sys.executable).parent
# The deploy role's status entry point, replaced: it checks that its folder exists on the controller and names it.
STUB = [
    {"name": "Find the collection folder", "ansible.builtin.stat": {"path": "{{ sglang_deploy_status_dir }}/records"},
     "delegate_to": "localhost", "register": "_stub"},
    {"name": "Name it", "ansible.builtin.assert": {"that": ["_stub.stat.isdir | default(false)"]}},
    {"name": "Say it", "ansible.builtin.debug": {"msg": "STATUS DIR {{ sglang_deploy_status_dir }}"}},
]


def _tasks():
    for play in yaml.safe_load(PLAYBOOK.read_text()):
        for task in play.get("tasks", []):
            yield play, task


def _run(tmp_path: Path, limit: str) -> subprocess.CompletedProcess:
    plays = yaml.safe_load(PLAYBOOK.read_text())
    for play in plays:
        for i, task in enumerate(play.get("tasks", [])):
            if "ansible.builtin.import_role" in task:
                play["tasks"][i:i + 1] = [dict(t, vars=task.get("vars", {})) for t in STUB]
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "status.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"hosts": {h: dict(local) for h in
                                                                                ("lab1", "lab2")}}}}}))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(tmp_path / "none.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "--limit", limit,
                           str(tmp_path / "playbooks" / "status.yml")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("limit", ["lab1", "lab1,localhost", "all"])
def test_status_runs_under_any_limit_and_leaves_no_folder(tmp_path, limit):
    proc = _run(tmp_path, limit)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "STATUS DIR " + str(tmp_path / "build" / "status" / "run-") in proc.stdout, proc.stdout[-3000:]
    assert list((tmp_path / "build" / "status").iterdir()) == []  # this run's folder is removed at the end


def test_no_run_removes_or_shares_the_whole_collection_folder():
    for _, task in _tasks():
        f = task.get("ansible.builtin.file") or {}
        if f.get("state") == "absent":
            assert "_status_run" in str(f.get("path")), task["name"]  # only its own folder
        role_vars = task.get("vars") or {}
        if "sglang_deploy_status_dir" in role_vars:
            assert "_status_run.path" in role_vars["sglang_deploy_status_dir"], task["name"]
        records = task.get("sgdeploy.host.controller_records") or {}
        for key in ("records_dir", "now_dir"):
            if key in records:
                assert records[key].startswith("{{ _status_run_dir }}/"), task["name"]


def test_each_run_makes_a_folder_of_its_own():
    made = [t for _, t in _tasks() if "ansible.builtin.tempfile" in t]
    assert len(made) == 1 and made[0]["ansible.builtin.tempfile"]["state"] == "directory"
    assert made[0]["register"] == "_status_run"
