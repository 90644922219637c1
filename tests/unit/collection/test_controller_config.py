"""The collection's controller-side action plugins (issue 35, "one crossing"): with sgdeploy.host.controller_config
plays ask the controller's Python in-process for a config's description, and get exactly what
``sgdeploy render --json`` prints; a bad config fails the task with its one-line problem, no traceback. With
sgdeploy.host.controller_records make status gets the table ``python -m sgdeploy.records status`` prints. No play
or role runs ``python -m sgdeploy render|config|validate`` or ``python -m sgdeploy.records status`` any more."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES_DIR = "collections/ansible_collections/sgdeploy/host/roles"
ROLES = REPO / ROLES_DIR
BIN = Path(sys.executable).parent
LAB_X2 = REPO / "tests" / "lab" / "configs" / "lab-scale-x2.yml"


def play(tmp_path: Path, tasks: list[dict]) -> subprocess.CompletedProcess:
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_in_process_description_is_what_render_json_prints(tmp_path):
    out = tmp_path / "plugin"
    dump = tmp_path / "rendered.json"
    proc = play(tmp_path, [
        {"name": "Describe", "sgdeploy.host.controller_config": {
            "config": str(LAB_X2.relative_to(REPO)), "chdir": str(REPO),
            "render": {"release": "stock", "bind_address": "127.0.9.1", "out": str(out), "replica": 1}},
         "register": "d"},
        {"name": "Keep it", "ansible.builtin.copy": {"content": "{{ d | to_json }}", "dest": str(dump)}},
    ])
    assert proc.returncode == 0, proc.stdout[-3000:]
    got = json.loads(dump.read_text())
    cli = json.loads(subprocess.run(
        [sys.executable, "-m", "sgdeploy", "render", str(LAB_X2), "--release", "stock", "--bind-address", "127.0.9.1",
         "--no-verify", "--json", "--replica", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, check=True).stdout)
    assert got["rendered"] == cli
    assert got["rendered"]["config"] == "lab-scale-x2-r1" and got["rendered"]["url"] == "http://127.0.9.1:31503"
    assert got["name"] == "lab-scale-x2" and got["config"]["serving"]["replicas"] == 2
    assert got["changed"] is False


def test_a_bad_config_fails_the_task_with_its_one_line(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("extends: ddtree-b15\nserving: {replicas: 0}\n")
    proc = play(tmp_path, [{"name": "Describe", "sgdeploy.host.controller_config": {
        "config": str(bad), "chdir": str(REPO), "render": {"release": "stock", "out": str(tmp_path / "o")}}}])
    assert proc.returncode != 0
    assert "serving.replicas: 0: must be between 1 and 64" in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_bad_replica_index_and_models_root_fail_with_one_line(tmp_path):
    proc = play(tmp_path, [{"name": "Describe", "sgdeploy.host.controller_config": {
        "config": str(LAB_X2), "chdir": str(REPO),
        "render": {"release": "stock", "out": str(tmp_path / "o"), "replica": 5}}}])
    assert proc.returncode != 0 and "--replica 5: config lab-scale-x2 has replicas 0 to 1 behind the router" in \
        proc.stdout, proc.stdout[-3000:]
    proc = play(tmp_path, [{"name": "Describe", "sgdeploy.host.controller_config": {
        "config": str(LAB_X2), "chdir": str(REPO),
        "render": {"release": "stock", "out": str(tmp_path / "o"), "models_root": "/srv/../etc"}}}])
    assert proc.returncode != 0 and "models_root '/srv/../etc': give an absolute folder without '..'" in \
        proc.stdout, proc.stdout[-3000:]


def test_no_play_or_role_runs_sgdeploy_render_config_validate_or_status_in_a_subprocess():
    """controller_config (render, config, validate) and controller_records (the status table) do it in-process."""
    pattern = re.compile(r"-m['\"]?,?\s*['\"]?sgdeploy(\.records)?['\"]?,?\s*['\"]?(render|config|validate|status)\b")
    hits = [f"{p.relative_to(REPO)}:{n}" for folder in ("playbooks", ROLES_DIR) for p in (REPO / folder).rglob("*.yml")
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def status_folders(tmp_path: Path) -> tuple[Path, Path]:
    """What playbooks/status.yml collects: two records of lab1, its state (now/lab1.json), nothing of lab2."""
    from sgdeploy import records

    recs, now = tmp_path / "status" / "records", tmp_path / "status" / "now"
    for finished, outcome in (("2026-01-01T10:05:00Z", "deployed"), ("2026-01-02T10:05:00Z", "rolled_back")):
        records.write_record(recs / "lab1", records.build_record(
            config="ddtree-b15", host="lab1", release="stock", outcome=outcome, started=finished, finished=finished))
    now.mkdir(parents=True)
    (now / "lab1.json").write_text(json.dumps({"deployed": [], "uncommitted": None, "interrupted": "", "lock": ""}))
    return recs, now


def test_the_in_process_status_table_is_what_records_status_prints(tmp_path):
    recs, now = status_folders(tmp_path)
    (recs / "lab1" / "broken.json").write_text("{")
    dump = tmp_path / "table.json"
    proc = play(tmp_path, [
        {"name": "Table", "sgdeploy.host.controller_records": {
            "records_dir": str(recs), "now_dir": str(now), "hosts": ["lab1", "lab2"]}, "register": "t"},
        {"name": "Keep it", "ansible.builtin.copy": {"content": "{{ t | to_json }}", "dest": str(dump)}},
    ])
    assert proc.returncode == 0, proc.stdout[-3000:]
    got = json.loads(dump.read_text())
    cli = subprocess.run([sys.executable, "-m", "sgdeploy.records", "status", str(recs), "--now", str(now),
                          "--hosts", "lab1,lab2"], cwd=REPO, capture_output=True, text=True, check=True)
    assert got["lines"] == cli.stdout.splitlines() and got["changed"] is False
    assert got["lines"][0].startswith("now (what serves on each host") and any(
        line.startswith("lab2 ") and "UNREACHABLE" in line for line in got["lines"]), got["lines"]
    assert got["unanswered"] == ["lab2"]
    # A file that is not a record is left out of the table, and said (the command line says it on stderr).
    assert "broken.json" in cli.stderr and "left out of the status table" in proc.stdout + proc.stderr, proc.stdout


def test_the_status_table_of_a_missing_records_folder_fails_with_one_line(tmp_path):
    proc = play(tmp_path, [{"name": "Table", "sgdeploy.host.controller_records": {
        "records_dir": str(tmp_path / "nowhere")}}])
    assert proc.returncode != 0 and f"records folder {tmp_path / 'nowhere'}: does not exist" in proc.stdout, \
        proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_the_in_process_alert_rules_are_what_sgdeploy_rules_writes(tmp_path):
    """controller_rules (the monitoring role's alert rules) gives the text `sgdeploy rules` writes for the same
    configs, adds a deployed config found under configs/ and names one that is not there."""
    dump = tmp_path / "rules.json"
    proc = play(tmp_path, [
        {"name": "Rules", "sgdeploy.host.controller_rules": {
            "configs": ["ddtree-b15", str(LAB_X2.relative_to(REPO))], "chdir": str(REPO),
            "deployed": ["ddtree-b32", "ddtree-b15", "not-a-config-here"]}, "register": "r"},
        {"name": "Keep it", "ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(dump)}},
    ])
    assert proc.returncode == 0, proc.stdout[-3000:]
    got = json.loads(dump.read_text())
    cli = subprocess.run([sys.executable, "-m", "sgdeploy", "rules", "ddtree-b15", str(LAB_X2), "ddtree-b32"],
                         cwd=REPO, capture_output=True, text=True, check=True)
    assert got["rules"] == cli.stdout and got["changed"] is False
    assert got["configs"] == sorted(["ddtree-b15", "ddtree-b32", LAB_X2.stem])
    assert got["not_found"] == ["not-a-config-here"]
    assert "no alert rules for the deployed config(s) not-a-config-here" in proc.stdout + proc.stderr


def test_alert_rules_of_a_config_that_does_not_load_fail_with_its_line(tmp_path):
    proc = play(tmp_path, [{"name": "Rules", "sgdeploy.host.controller_rules": {
        "configs": ["no-such-config"], "chdir": str(REPO)}}])
    assert proc.returncode != 0 and "no-such-config" in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
