"""Every file a play or role task takes from the controller (template/copy `src:`) exists where Ansible looks.

The role move into the collection (0ff3a46) left `playbooks/tasks/rollback_one.yml` rendering
`{{ sglang_deploy_repo }}/roles/sglang_deploy/templates/sglang.env.j2`, a path that no longer existed: `make
rollback` failed at its last step on every host, and only the lab tests saw it. This test resolves each static
`src:` the way Ansible does (a role's own templates/ or files/, a play's folder, or the repository root for the
paths built from the repository variables) and names the task whose file is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = REPO / "collections/ansible_collections/sgdeploy/host/roles"
# Variables whose value is the repository root on the controller (their defaults: `{{ playbook_dir | dirname }}`).
REPO_PREFIX = re.compile(r"^\{\{\s*(?:playbook_dir\s*\|\s*dirname|sglang_\w+_repo|sglang_release_project_dir)\s*\}\}/")
MODULES = {"template": "templates", "copy": "files"}


def _tasks(node):
    """Every task mapping in a task list, blocks (block/rescue/always) included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            if key in node:
                yield from _tasks(node[key])
        yield node


def _sources():
    files = sorted(REPO.glob("playbooks/**/*.yml")) + sorted(ROLES.glob("*/tasks/*.yml")) + \
        sorted(ROLES.glob("*/handlers/*.yml"))
    for path in files:
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            for name, folder in MODULES.items():
                args = task.get(f"ansible.builtin.{name}")
                if not isinstance(args, dict) or "src" not in args or args.get("remote_src"):
                    continue
                yield path, task.get("name", "?"), folder, str(args["src"])


def _candidates(path: Path, folder: str, src: str) -> list[Path] | None:
    if REPO_PREFIX.match(src):
        rest = REPO_PREFIX.sub("", src)
        return None if "{{" in rest else [REPO / rest]
    if "{{" in src:
        return None  # chosen at run time: not a static file
    if ROLES in path.parents:
        role = ROLES / path.relative_to(ROLES).parts[0]
        return [role / folder / src, role / src, path.parent / folder / src, path.parent / src]
    return [path.parent / folder / src, path.parent / src, REPO / "playbooks" / folder / src]


SOURCES = list(_sources())


def test_the_scan_finds_the_templates_it_is_meant_to_check():
    """The test can fail: it sees the deploy role's env template and the by-hand rollback's render of it."""
    srcs = [src for _, _, _, src in SOURCES]
    assert any(src.endswith("sglang.env.j2") for src in srcs), srcs
    assert len(SOURCES) >= 5, SOURCES


@pytest.mark.parametrize(("path", "task", "folder", "src"), SOURCES,
                         ids=[f"{p.relative_to(REPO)}:{t}" for p, t, _, _ in SOURCES])
def test_every_static_task_source_exists(path, task, folder, src):
    candidates = _candidates(path, folder, src)
    if candidates is None:
        pytest.skip(f"{src} is chosen at run time")
    assert any(c.is_file() for c in candidates), (
        f"{path.relative_to(REPO)}: task {task!r}: src {src} is not at any of "
        f"{[str(c.relative_to(REPO)) for c in candidates]}")


def test_the_old_broken_path_would_fail():
    """The path the role move broke resolves to nothing; the fixed one resolves to the template."""
    play = REPO / "playbooks/tasks/rollback_one.yml"
    broken = _candidates(play, "templates", "{{ sglang_deploy_repo }}/roles/sglang_deploy/templates/sglang.env.j2")
    assert broken is not None and not any(c.is_file() for c in broken)
