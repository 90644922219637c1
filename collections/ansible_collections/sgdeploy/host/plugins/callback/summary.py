# Copyright: sgdeploy contributors. Apache-2.0
"""The project's stdout callback: Ansible's default output, with waits shown as progress, failures
as one line, skipped tasks hidden (unless asked), and one closing summary after the last host."""

from __future__ import annotations

DOCUMENTATION = r"""
name: summary
type: stdout
short_description: Default output, waits as progress, one-line failures, one closing summary table
description:
  - "Prints what the default callback prints, except for the following."
  - "A task that retries (until/retries) prints one WAITING on HOST line per attempt with what it waits for
    and how long so far (the result's detail and elapsed_s when the module gives them), never
    FAILED - RETRYING; attempts closer than 20 s apart print only every 20 s."
  - "A failed task prints one line, fatal [HOST] FAILED! => {msg REASON} (the full result with -v); a failure
    that a rescue section handles prints HOST, TASK failed, handling it, without the reason (the rescue says it)."
  - "After the play recap, a SUMMARY table with one row per host that set the fact sglang_deploy__summary
    (host, config before -> after, outcome, each gate's verdict and number and the post-deploy watch, downtime,
    record path), then
    each failure once, with its reason (FAILURES)."
  - "Skipped tasks are hidden by the project's ansible.cfg (display_skipped_hosts = False);
    ANSIBLE_DISPLAY_SKIPPED_HOSTS=true (make ... VERBOSE=1) shows them."
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout_callback in ansible.cfg
"""

import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping  # noqa: E402

from ansible import constants as C  # noqa: E402
from ansible.playbook.block import Block  # noqa: E402
from ansible.plugins.callback.default import CallbackModule as DefaultCallback  # noqa: E402

SUMMARY_FACT = "sglang_deploy__summary"
PROGRESS_EVERY_S = 20.0


def _result(result) -> dict:
    """The result dict."""
    return result.result


def _one_line(text) -> str:
    return " ".join(str(text).split())


def reason_of(data: dict) -> str:
    """The one-line reason of a failed result: its msg, else stderr, else the first failed loop item's."""
    failed_items = [i for i in data.get("results") or [] if isinstance(i, Mapping) and i.get("failed")]
    if failed_items:  # a loop: the first failed item's reason, not "One or more items failed"
        return reason_of(failed_items[0])
    for key in ("msg", "stderr", "reason", "detail"):
        value = data.get(key)
        if value:
            text = _one_line(value)
            detail = data.get("detail")
            if key == "msg" and detail and _one_line(detail) not in text:
                text += ": " + _one_line(detail)
            return text
    return "failed (no message; rerun with -v for the full result)"


def _contains(items, uuid) -> bool:
    for item in items or []:
        if getattr(item, "_uuid", None) == uuid:
            return True
        sections = ("block", "rescue", "always")
        if isinstance(item, Block) and any(_contains(getattr(item, s, None), uuid) for s in sections):
            return True
    return False


def handled_by_rescue(task) -> bool:
    """Whether a failure of ``task`` runs a rescue section: an enclosing block with a rescue holds the
    task in its main section (not in its rescue or always)."""
    parent = getattr(task, "_parent", None)
    while parent is not None:
        if isinstance(parent, Block) and parent.rescue and _contains(parent.block, task._uuid):
            return True
        parent = getattr(parent, "_parent", None)
    return False


def _number(value) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return str(value)


def gates_cell(gates) -> str:
    """`smoke PASS; throughput PASS 153.2 tok/s; acceptance PASS 9.41` (each gate's verdict and number)."""
    parts = []
    for g in gates or []:
        if not isinstance(g, dict):
            continue
        text = "{} {}".format(g.get("gate", "?"), str(g.get("verdict", "?")).upper())
        number = _number(g.get("value"))
        if number and g.get("gate") != "smoke":
            unit = {"tokens_per_s": " tok/s"}.get(g.get("metric"), "")
            text += f" {number}{unit}"
        parts.append(text)
    return "; ".join(parts) or "-"


def summary_rows(summaries: dict, failures: dict) -> list[list[str]]:
    rows = []
    for host in sorted(set(summaries) | set(failures)):
        s = summaries.get(host)
        if s is None:
            rows.append([host, "-", "failed", "-", "-", "-"])
            continue
        before = ", ".join(s.get("before") or []) or "none"
        downtime = s.get("downtime_s")
        rows.append([host, "{} -> {}".format(before, s.get("after") or "?"), str(s.get("outcome") or "?"),
                     gates_cell(s.get("gates")) + (f"; watch {s['watch']}" if s.get("watch") else ""),
                     "-" if downtime in (None, "") else f"{_number(float(downtime))} s",
                     s.get("record") or "-"])
    return rows


def table(rows: list[list[str]]) -> list[str]:
    header = ["host", "config before -> after", "outcome", "gates", "downtime", "record"]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    return ["  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in [header] + rows]


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "sgdeploy.host.summary"

    def __init__(self):
        super().__init__()
        self._summaries: dict[str, dict] = {}
        self._failures: dict[str, str] = {}
        self._waits: dict[tuple[str, str], list[float]] = {}
        self._task_started = time.monotonic()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_started = time.monotonic()
        super().v2_playbook_on_task_start(task, is_conditional)

    # --- results ---------------------------------------------------------------------------------

    def v2_runner_on_ok(self, result):
        facts = _result(result).get("ansible_facts") or {}
        if isinstance(facts.get(SUMMARY_FACT), Mapping):
            self._summaries[result.host.get_name()] = facts[SUMMARY_FACT]
            self._failures.pop(result.host.get_name(), None)
        super().v2_runner_on_ok(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if ignore_errors or self._display.verbosity > 0:
            super().v2_runner_on_failed(result, ignore_errors=ignore_errors)
            return
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        host = result.host.get_name()
        name = result.task.get_name().strip()
        if handled_by_rescue(result.task):
            self._display.display(f"{host}: {name} failed; handling it", color=C.COLOR_WARN)
            return
        reason = reason_of(_result(result))
        self._failures[host] = reason
        # One line, in the default callback's shape (`fatal: [host]: FAILED! => {"msg": ...}`), the
        # reason only: no stdout, rc or invocation (-v prints them).
        body = json.dumps({"msg": reason}, ensure_ascii=False)
        self._display.display(f"fatal: [{self.host_label(result)}]: FAILED! => {body}", color=C.COLOR_ERROR,
                              stderr=self.get_option("display_failed_stderr"))

    def v2_runner_on_unreachable(self, result):
        self._failures[result.host.get_name()] = "unreachable: " + reason_of(_result(result))
        super().v2_runner_on_unreachable(result)

    def v2_playbook_on_no_hosts_matched(self):
        if self.get_option("display_skipped_hosts"):
            super().v2_playbook_on_no_hosts_matched()

    def v2_runner_retry(self, result):
        data = _result(result)
        host = result.host.get_name()
        key = (host, result.task._uuid)
        now = time.monotonic()
        first, last = self._waits.setdefault(key, [self._task_started, 0.0])
        if last and now - last < PROGRESS_EVERY_S and self._display.verbosity < 2:
            return
        self._waits[key][1] = now
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        elapsed = data.get("elapsed_s")
        so_far = float(elapsed) if isinstance(elapsed, (int, float)) else now - first
        what = _one_line(result.task.name or result.task.get_name())
        detail = _one_line(data.get("detail") or "")
        # The wait module's detail ends with "(N s of M s)"; say it once.
        if detail.endswith(" s)") and " s of " in detail:
            detail = detail[:detail.rfind(" (")]
        line = f"WAITING on {host}: {what}" + (f": {detail}" if detail else "") + f" ({so_far:.0f} s so far)"
        self._display.display(line, color=C.COLOR_DEBUG)

    # --- the end ---------------------------------------------------------------------------------

    def v2_playbook_on_stats(self, stats):
        super().v2_playbook_on_stats(stats)
        rows = summary_rows(self._summaries, self._failures)
        if not rows:
            return
        self._display.banner("SUMMARY")
        for line in table(rows):
            self._display.display(line)
        if self._failures:
            self._display.display("FAILURES")
            for host in sorted(self._failures):
                self._display.display(f"  {host}: {self._failures[host]}", color=C.COLOR_ERROR)
