"""Plays call roles through their declared entry points and never touch a role's private variables (issue 35).

The deploy role has three entry points, each declared with its options in meta/argument_specs.yml: ``main``
(make deploy), ``rollback`` (make rollback) and ``status`` (make status); playbooks/rollback.yml and
playbooks/status.yml call them with ``tasks_from``. A role's private variables (``<role>__*``, e.g.
``sglang_deploy__run_id``) are its own: no play or task file outside the roles sets or reads one (before,
playbooks/tasks/rollback_one.yml set the deploy role's run id, lock and switch state itself).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = REPO / "collections" / "ansible_collections" / "sgdeploy" / "host" / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir())
PLAYBOOK_FILES = sorted((REPO / "playbooks").rglob("*.yml"))
ROLE_FILES = sorted((ROLES).rglob("tasks/*.yml"))
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")


def private_names(node, roles: list[str]) -> set[str]:
    """Every ``<role>__<name>`` a parsed YAML document sets or reads: in a key (vars, set_fact, module_defaults)
    or anywhere in a value (a register, a template, a when, a loop_var). Comments are not YAML: they do not count."""
    names = "|".join(map(re.escape, roles))
    pattern = re.compile(rf"\b(?:{names})__\w+")
    found: set[str] = set()
    pending = [node]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += list(item.keys()) + list(item.values())
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str):
            found.update(pattern.findall(item))
    return found


def argument_specs(role: str) -> dict:
    path = ROLES / role / "meta" / "argument_specs.yml"
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("argument_specs") or {}


def role_calls(node):
    """(role, tasks_from) of every include_role/import_role in a parsed tasks or playbook file."""
    pending = [node]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending += item
        elif isinstance(item, dict):
            for key in INCLUDES:
                if isinstance(item.get(key), dict):
                    yield item[key]["name"], item[key].get("tasks_from", "main")
            pending += [v for v in item.values() if isinstance(v, (list, dict))]


@pytest.mark.parametrize("path", PLAYBOOK_FILES, ids=[str(p.relative_to(REPO)) for p in PLAYBOOK_FILES])
def test_no_play_sets_or_reads_a_role_private_variable(path):
    found = private_names(yaml.safe_load(path.read_text(encoding="utf-8")), ROLE_NAMES)
    assert not found, (f"{path.relative_to(REPO)} sets or reads the private variables {sorted(found)}: call the role's "
                       "entry point (tasks_from) with its options from meta/argument_specs.yml instead")


def test_the_scan_finds_a_private_variable_set_or_read_and_ignores_comments():
    play = yaml.safe_load("""
# sglang_deploy__in_a_comment is not code
- hosts: all
  vars:
    sglang_deploy_config: x
  tasks:
    - name: Set one
      ansible.builtin.set_fact:
        sglang_deploy__run_id: "1"
    - name: Read one
      ansible.builtin.debug:
        msg: "{{ hostvars[item].sglang_models__plan }}"
      register: nvidia_driver__x
""")
    assert private_names(play, ROLE_NAMES) == {"sglang_deploy__run_id", "sglang_models__plan", "nvidia_driver__x"}
    assert private_names(yaml.safe_load("- {hosts: all, vars: {deploy__layout: 1, sglang_deploy_config: x}}"),
                         ROLE_NAMES) == set()


def test_no_task_file_lives_outside_the_roles():
    """What a play runs lives in a role of the collection: playbooks/ holds plays only (no tasks/ of its own)."""
    for path in PLAYBOOK_FILES:
        for play in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
            assert "hosts" in play or "ansible.builtin.import_playbook" in play, f"{path.name}: not a play: {play}"


def test_the_deploy_role_declares_deploy_rollback_and_status():
    specs = argument_specs("sglang_deploy")
    # rollback_nodes: playbooks/rollback.yml's read-only first play (an engine over several hosts: one batch).
    assert set(specs) == {"main", "rollback", "rollback_nodes", "status"}
    for name, spec in specs.items():
        assert spec.get("short_description") and spec.get("options"), name
        assert (ROLES / "sglang_deploy" / "tasks" / f"{name}.yml").is_file(), name
    assert specs["rollback"]["options"]["sglang_deploy_config"]["required"] is True
    # The automatic rollback of a failed deploy is not the by-hand entry point.
    main = (ROLES / "sglang_deploy" / "tasks" / "main.yml").read_text(encoding="utf-8")
    assert "import_tasks: auto_rollback.yml" in main and "import_tasks: rollback.yml" not in main


def test_rollback_and_status_plays_call_the_entry_points():
    calls = {path.stem: set(role_calls(yaml.safe_load(path.read_text(encoding="utf-8"))))
             for path in PLAYBOOK_FILES}
    assert calls["rollback"] == {("sgdeploy.host.sglang_deploy", "rollback"),
                                 ("sgdeploy.host.sglang_deploy", "rollback_nodes")}
    assert calls["status"] == {("sgdeploy.host.sglang_deploy", "status")}


@pytest.mark.parametrize("path", PLAYBOOK_FILES + ROLE_FILES,
                         ids=[str(p.relative_to(REPO)) for p in PLAYBOOK_FILES + ROLE_FILES])
def test_every_role_call_names_a_declared_entry_point(path):
    for name, tasks_from in role_calls(yaml.safe_load(path.read_text(encoding="utf-8"))):
        role = name.removeprefix("sgdeploy.host.")
        entry = Path(tasks_from).stem if tasks_from.endswith((".yml", ".yaml")) else tasks_from
        assert entry in argument_specs(role), (f"{path.relative_to(REPO)} calls {name} tasks_from {tasks_from}, "
                                               f"not an entry point of its meta/argument_specs.yml")
