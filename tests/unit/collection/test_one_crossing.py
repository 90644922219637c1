"""One crossing between Ansible and the controller's Python (issue 35, deliver 2): what a play asks of sgdeploy
(render, validate, the wheel, packing a model folder, ...) is done in-process by the collection's controller-side
action plugins (sgdeploy.host.controller_*), never by a task that runs ``python -m sgdeploy...`` or the
``sgdeploy`` command and parses its output.

Scans every YAML file under playbooks/ and collections/ for a task whose command (ansible.builtin.command,
shell, raw, script, expect; a string, ``cmd`` or ``argv``, Jinja-built lists too) runs ``-m sgdeploy``,
``-m sgdeploy.<module>`` or the ``sgdeploy`` command, and for a ``pipe`` lookup that does; each finding is
named file:line.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
SCANNED = ("playbooks", "collections")

# No file may cross: the last two (deploy.yml's validation, status.yml's records summary) use the
# controller_config and controller_records plugins since issue 35.
ALLOWED: set[str] = set()

COMMAND_MODULES = {f"{prefix}{name}" for prefix in ("", "ansible.builtin.", "ansible.legacy.")
                   for name in ("command", "shell", "raw", "script", "expect")}
# `sgdeploy` or `sgdeploy.<module>` as a word of a command line or an element of an argv (quoted, in a list, or
# the end of a path such as .venv/bin/sgdeploy); a folder named sgdeploy (`/srv/sgdeploy/`) is not one.
RUNS_SGDEPLOY = re.compile(r"(?:^|[\s/\[,'\"])sgdeploy(?:\.[A-Za-z_][A-Za-z0-9_.]*)?(?=$|[\s,'\"\]])")
PIPE_LOOKUP = re.compile(r"""(?:lookup|query)\(\s*['"](?:ansible\.(?:builtin|legacy)\.)?pipe['"]""")


def _text(node: yaml.Node) -> str:
    """The scalars of a node, joined by spaces (an argv list reads as its command line)."""
    if isinstance(node, yaml.ScalarNode):
        return str(node.value)
    if isinstance(node, yaml.SequenceNode):
        return " ".join(_text(item) for item in node.value)
    if isinstance(node, yaml.MappingNode):
        return " ".join(f"{_text(k)} {_text(v)}" for k, v in node.value)
    return ""


def _walk(node: yaml.Node):
    yield node
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _walk(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _walk(key)
            yield from _walk(value)


def crossings(text: str) -> list[int]:
    """The lines (from 1) of the tasks in a YAML text that run sgdeploy as a subprocess."""
    lines = set()
    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if document is None:
            continue
        for node in _walk(document):
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if (isinstance(key, yaml.ScalarNode) and key.value in COMMAND_MODULES
                            and RUNS_SGDEPLOY.search(_text(value))):
                        lines.add(key.start_mark.line + 1)
            elif isinstance(node, yaml.ScalarNode) and PIPE_LOOKUP.search(str(node.value)) and re.search(
                    r"-m\s+sgdeploy\b|" + RUNS_SGDEPLOY.pattern, str(node.value)):
                lines.add(node.start_mark.line + 1)
    return sorted(lines)


def yaml_files() -> list[Path]:
    return sorted(p for folder in SCANNED for pattern in ("*.yml", "*.yaml") for p in (REPO / folder).rglob(pattern))


def test_no_task_runs_sgdeploy_as_a_subprocess():
    found = []
    for path in yaml_files():
        name = path.relative_to(REPO).as_posix()
        if name not in ALLOWED:
            found += [f"{name}:{line}" for line in crossings(path.read_text(encoding="utf-8"))]
    assert found == [], ("these tasks run the controller's sgdeploy as a subprocess; call the collection's "
                         "controller-side action plugins (sgdeploy.host.controller_*) instead: " + ", ".join(found))


def test_the_scan_covers_the_playbooks_and_the_collection():
    names = {p.relative_to(REPO).as_posix() for p in yaml_files()}
    assert "collections/ansible_collections/sgdeploy/host/roles/sglang_deploy/tasks/plan.yml" in names
    assert "collections/ansible_collections/sgdeploy/host/roles/sglang_release/tasks/build_wheel.yml" in names
    assert "playbooks/build.yml" in names
    assert ALLOWED <= names  # an allowlist entry whose file is gone must go too


# What the scan must find: the forms the plays used before the action plugins (argv lists, a Jinja-built argv, a
# free-form command, the CLI's entry point, a pipe lookup), each at its line.
CROSSINGS = """\
- name: Build the wheel
  ansible.builtin.command:
    argv: ["{{ python }}", -m, sgdeploy.wheel, --config, "{{ config }}", --json]
  register: w
- name: Pack
  ansible.builtin.command:
    argv:
      - "{{ python }}"
      - -m
      - sgdeploy.models
      - pack
- name: Built argv
  ansible.builtin.command:
    argv: >-
      {{ [build_python, '-m', 'sgdeploy.wheel', '--config', config, '--json'] }}
- block:
    - name: Validate
      command: "{{ ansible_playbook_python }} -m sgdeploy validate {{ config }}"
    - name: The entry point
      ansible.builtin.shell:
        cmd: .venv/bin/sgdeploy render {{ config }} --json | tee out.json
- name: Through a lookup
  ansible.builtin.set_fact:
    x: "{{ lookup('ansible.builtin.pipe', ansible_playbook_python ~ ' -m sgdeploy.records status') }}"
"""

NOT_CROSSINGS = """\
- name: The in-process plugin
  sgdeploy.host.controller_wheel:
    config: ddtree-b15
    chdir: /srv/sgdeploy
    python: "3.11"
- name: A folder named sgdeploy, pip on the controller, a hint in a message
  ansible.builtin.command:
    argv: [/srv/sgdeploy/.venv/bin/python, -m, pip, download, sglang-router]
- name: Fail
  ansible.builtin.fail:
    msg: run `python -m sgdeploy.wheel` first
- name: Date
  ansible.builtin.set_fact:
    t: "{{ lookup('ansible.builtin.pipe', 'date -u') }}"
"""


def test_the_scan_finds_each_form_of_a_crossing_at_its_line():
    assert crossings(CROSSINGS) == [2, 6, 13, 18, 20, 24]


def test_the_scan_leaves_plugins_other_commands_and_messages_alone():
    assert crossings(NOT_CROSSINGS) == []
