"""Test equipment for tests/lab/scale_probe.py (not part of the product): an aggregate callback that
writes, per task name, how often the task started (once per serial batch), its wall time on the
controller (from its start to the next task's start) and the controller's CPU time over the same
stretch (ansible-playbook itself plus the workers it has reaped), to the JSON file named by
SCALE_TIMER_OUT. Enabled only by the probe (ANSIBLE_CALLBACK_PLUGINS, ANSIBLE_CALLBACKS_ENABLED)."""

from __future__ import annotations

import json
import os
import resource
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: scale_timer
type: aggregate
short_description: per-task wall and controller CPU time, to a JSON file (tests/lab/scale_probe.py)
description:
  - "Writes SCALE_TIMER_OUT: {task name: {starts, hosts, wall_s, cpu_s}}."
requirements:
  - enabled by tests/lab/scale_probe.py
"""


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "scale_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._tasks: dict[str, dict] = {}
        self._current: str | None = None
        self._since = (time.monotonic(), _cpu())

    def _close(self) -> None:
        now = (time.monotonic(), _cpu())
        if self._current is not None:
            entry = self._tasks[self._current]
            entry["wall_s"] += now[0] - self._since[0]
            entry["cpu_s"] += now[1] - self._since[1]
        self._since = now

    def _start(self, name: str) -> None:
        self._close()
        self._current = name
        entry = self._tasks.setdefault(name, {"starts": 0, "hosts": 0, "wall_s": 0.0, "cpu_s": 0.0})
        entry["starts"] += 1

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start(task.get_name().strip())

    def v2_playbook_on_play_start(self, play):
        # A play, and each serial batch of it: what runs before its first task is counted apart.
        self._start("(play or batch start)")

    def v2_playbook_on_handler_task_start(self, task):
        self._start("handler: " + task.get_name().strip())

    def _count(self, result) -> None:
        name = result.task.get_name().strip()
        if name in self._tasks:
            self._tasks[name]["hosts"] += 1

    def v2_runner_on_ok(self, result):
        self._count(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result)

    def v2_runner_on_skipped(self, result):
        self._count(result)

    def v2_runner_on_unreachable(self, result):
        self._count(result)

    def v2_playbook_on_stats(self, stats):
        self._close()
        self._current = None
        out = os.environ.get("SCALE_TIMER_OUT")
        if out:
            with open(out, "w", encoding="utf-8") as fh:
                json.dump(self._tasks, fh, indent=1, sort_keys=True)
