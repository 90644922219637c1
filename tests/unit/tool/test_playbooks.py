"""Every playbook passes `ansible-playbook --syntax-check`; a broken one is caught."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROLES_DIR = "collections/ansible_collections/sgdeploy/host/roles"
ROLES = REPO / ROLES_DIR
PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yml"))
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def syntax_check(playbook: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "--syntax-check", "-i", str(REPO / "inventory" / "example.yml"),
                           "-e", "config=ddtree-b15", str(playbook)], capture_output=True, text=True, cwd=REPO,
                          env=env, check=False)


def test_the_expected_playbooks_exist():
    names = {p.stem for p in PLAYBOOKS}
    assert {"site", "deploy", "provision", "build", "rollback", "status"} <= names


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=[p.name for p in PLAYBOOKS])
def test_playbook_syntax(playbook):
    result = syntax_check(playbook)
    assert result.returncode == 0, result.stdout + result.stderr


def test_syntax_check_catches_a_broken_playbook(tmp_path):
    broken = REPO / "playbooks" / f".broken-{os.getpid()}.yml"
    broken.write_text("- name: Broken\n  hosts: all\n  tasks:\n    - name: No such module\n      no.such.module: {}\n")
    try:
        assert syntax_check(broken).returncode != 0
    finally:
        broken.unlink()


ANSIBLE_FILES = sorted(p for top in ("playbooks", ROLES_DIR) for p in (REPO / top).rglob("*.yml"))


@pytest.mark.parametrize("path", ANSIBLE_FILES, ids=[str(p.relative_to(REPO)) for p in ANSIBLE_FILES])
def test_host_steps_are_modules_not_copied_python(path):
    """Issue 19: every host step is an sgdeploy.host module; nothing runs `python3 -m sgdeploy.X` on a host
    with a PYTHONPATH, no secrets in any argv."""
    text = path.read_text()
    assert "PYTHONPATH" not in text
    assert "sgdeploy.hoststate" not in text and "sgdeploy.serving" not in text and "sgdeploy.records, write" not in text
    assert "sgdeploy.gate" not in text and "sgdeploy.bench" not in text and "tools_dir" not in text
    assert "--secret-env-json" not in text


def _tasks(node):
    """Every task mapping in a parsed tasks or playbook file, blocks and plays included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            yield from _tasks(node.get(key) or [])


# The sgdeploy package (sgdeploy/...), not the collection's own folders (ansible_collections/sgdeploy/host/...).
PACKAGE = re.compile(r"(^|[^_/\w]|(?<!ansible_collections)/)sgdeploy(?!/host\b)")


def test_no_task_copies_the_sgdeploy_package_to_a_host():
    """Issue 19: nothing of the `sgdeploy` package (its modules, its prompts) is copied to hosts; the gates
    run as the sgdeploy.host.sglang_gate module, whose code Ansible ships itself."""
    import yaml

    copies = []
    for path in ANSIBLE_FILES:
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            for action in ("ansible.builtin.copy", "ansible.builtin.template", "ansible.posix.synchronize",
                           "ansible.builtin.unarchive"):
                args = task.get(action)
                if isinstance(args, dict) and task.get("delegate_to") != "localhost" and (
                        PACKAGE.search(str(args.get("src", ""))) or PACKAGE.search(str(task.get("loop", "")))
                        or "/sgdeploy" in str(args.get("dest", ""))):
                    copies.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert copies == []
    gate = yaml.safe_load((ROLES / "sglang_deploy" / "tasks" / "gate.yml").read_text())
    assert any("sgdeploy.host.sglang_gate" in t for t in _tasks(gate))


def test_the_gate_wait_answers_within_5_s_of_the_gates_ending():
    """Issue 33 item 5: a fixed 25 s poll made a 1 s smoke gate cost 25 s per host."""
    import yaml as _yaml

    tasks = _yaml.safe_load((ROLES / "sglang_deploy/tasks/gate.yml").read_text())
    wait = next(t for t in tasks if t["name"].startswith("Wait for the gates"))
    assert int(wait["delay"]) <= 5
    assert "// 5)" in str(wait["retries"])  # the retries still cover the whole lease
