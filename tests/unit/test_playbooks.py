"""Every playbook passes `ansible-playbook --syntax-check`; a broken one is caught."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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


OWN_HOST_STEPS = [REPO / "playbooks" / f"{name}.yml" for name in ("deploy", "rollback", "status")] + [
    p for p in sorted((REPO / "roles" / "sglang_deploy" / "tasks").glob("*.yml")) if p.name != "gate.yml"]


@pytest.mark.parametrize("path", OWN_HOST_STEPS, ids=[p.name for p in OWN_HOST_STEPS])
def test_host_steps_are_modules_not_copied_python(path):
    """Issue 19: the deploy's host steps are sgdeploy.host modules; no `python3 -m sgdeploy.X` with
    PYTHONPATH (only tasks/gate.yml still runs the copied gate), no secrets in any argv."""
    text = path.read_text()
    assert "PYTHONPATH" not in text
    assert "sgdeploy.hoststate" not in text and "sgdeploy.serving" not in text and "sgdeploy.records, write" not in text
    assert "--secret-env-json" not in text
