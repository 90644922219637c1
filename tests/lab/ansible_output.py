"""Reading ansible-playbook's default output in lab tests: the task banners and the result words under them."""

from __future__ import annotations

import re

BANNER = re.compile(r"TASK \[(.*?)\] \*+$")
RESULT = re.compile(r"(ok|changed|skipping|fatal|failed): \[")


def task_statuses(out: str, role: str | None = None) -> dict[str, list[str]]:
    """Task banner name (``sgdeploy.host.<role> : <task>``) -> the result words printed under it (ok, changed,
    skipping, fatal, failed), one per host and loop item; with ``role``, only that role's tasks."""
    statuses: dict[str, list[str]] = {}
    name = None
    for line in out.splitlines():
        m = BANNER.match(line)
        if m:
            name = m.group(1)
            if role is not None and not name.startswith(f"sgdeploy.host.{role} : "):
                name = None
            continue
        m = RESULT.match(line)
        if m and name:
            statuses.setdefault(name, []).append(m.group(1))
    return statuses
