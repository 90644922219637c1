"""Test helpers for the unit tests that read a role's task files as data: the tasks in order (blocks and rescues
flattened) and a Jinja expression rendered as Ansible renders it (test_fleet_watch.py, test_rollback_shape.py)."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLES = Path(__file__).resolve().parents[3] / "collections/ansible_collections/sgdeploy/host/roles"


def load(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())


def flat(tasks: list[dict]) -> list[dict]:
    """Every task in order, block, then rescue (a block's own entry first)."""
    out = []
    for t in tasks:
        out.append(t)
        out += flat(t.get("block", [])) + flat(t.get("rescue", []))
    return out


def render(expr: str, **variables) -> object:
    """``expr`` templated with ``variables`` by Ansible's own Templar (a trusted template, as a task's is)."""
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expr))
