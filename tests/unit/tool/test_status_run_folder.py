"""`make status` collects into a folder of its own run (playbooks/status.yml).

CI's three labs run from one checkout, each with a host named lab1; `make status` emptied and filled the one shared
build/status, so a run could read another lab's lab1 records: the CI check of 2026-12-05 showed lab A's `now` row
with the numbers of a deploy measured two minutes before its test began (tests/lab/test_cli.py's status test).
"""

from __future__ import annotations

from pathlib import Path

import yaml

PLAYBOOK = Path(__file__).resolve().parents[3] / "playbooks" / "status.yml"


def _tasks():
    for play in yaml.safe_load(PLAYBOOK.read_text()):
        for task in play.get("tasks", []):
            yield play, task


def test_no_run_removes_or_shares_the_whole_collection_folder():
    for _, task in _tasks():
        f = task.get("ansible.builtin.file") or {}
        if f.get("state") == "absent":
            assert "_status_run.path" in str(f.get("path")), task["name"]  # only its own folder
        role_vars = task.get("vars") or {}
        if "sglang_deploy_status_dir" in role_vars:
            assert "_status_run.path" in role_vars["sglang_deploy_status_dir"], task["name"]
        records = task.get("sgdeploy.host.controller_records") or {}
        for key in ("records_dir", "now_dir"):
            if key in records:
                assert records[key].startswith("{{ _status_run.path }}/"), task["name"]


def test_each_run_makes_a_folder_of_its_own():
    made = [t for _, t in _tasks() if "ansible.builtin.tempfile" in t]
    assert len(made) == 1 and made[0]["ansible.builtin.tempfile"]["state"] == "directory"
    assert made[0]["register"] == "_status_run"
