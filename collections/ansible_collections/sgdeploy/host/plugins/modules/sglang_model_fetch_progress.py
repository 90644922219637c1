#!/usr/bin/python
"""Wait a bounded time on a background model fetch and report how far it is."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: sglang_model_fetch_progress
short_description: Wait up to O(wait) seconds on a background (async) model fetch and report its progress
description:
  - Returns as soon as the async job's results file says it finished, or after O(wait) seconds,
    with the bytes and files done and the time elapsed, read from C(<dest>.progress.json).
  - Also ends the wait when the fetch's process is gone without a result (killed, host rebooted).
  - Read-only; removes the progress file once the job has finished.
options:
  dest:
    description: The model folder the fetch fills (its O(dest)).
    type: path
    required: true
  results_file:
    description: The async job's results file (C(results_file) of the task started with C(poll=0)).
    type: path
    required: true
  wait:
    description: Seconds to wait at most before reporting.
    type: float
    default: 30
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Waits and reports the same way; leaves the progress file in place.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Wait on the fetch, at most 28 s, and say how far it is
  sgdeploy.host.sglang_model_fetch_progress:
    dest: /var/lib/sglang/models/Qwen--Qwen3.6-27B/main
    results_file: "{{ fetch_job.results_file }}"  # the sglang_model_fetch task started with poll=0
    wait: 28
  register: progress
  until: progress.finished
  retries: 720
  delay: 0

- name: Show the fetch's progress
  ansible.builtin.debug:
    msg: "fetch {{ progress.msg }}"
"""

RETURN = r"""
finished:
  description: Whether the fetch job has ended (successfully or not).
  returned: always
  type: bool
msg:
  description: One line, e.g. C(org/name@rev 1.2 GB of 54.1 GB, 3 of 20 files, 90 s elapsed).
  returned: always
  type: str
progress:
  description: The progress file's contents (bytes_done, bytes_total, files_done, files_total, started, state).
  returned: always
  type: dict
"""


import json
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.hf_fetch import (
    pid_alive,
    progress_line,
    progress_path,
    read_progress,
)


def job_finished(results_file: Path) -> bool:
    try:
        data = json.loads(results_file.read_text())
    except (OSError, ValueError):
        return False  # not written yet, or being written
    return not (isinstance(data, dict) and data.get("finished") is False)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "results_file": {"type": "path", "required": True},
            "wait": {"type": "float", "default": 30},
        },
        supports_check_mode=True,
    )
    p = module.params
    ppath, results = progress_path(Path(p["dest"])), Path(p["results_file"])
    deadline = time.monotonic() + max(0.0, p["wait"])
    while True:
        finished = job_finished(results)
        progress = read_progress(ppath) or {}
        if not finished and progress.get("state") == "running" and not pid_alive(int(progress.get("pid") or 0)):
            finished = True  # the job died without a result (killed, host rebooted): stop waiting
        if finished or time.monotonic() >= deadline:
            break
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    msg = progress_line(progress) if progress else f"{p['dest']}: waiting for the fetch to start"
    if finished and not module.check_mode:
        try:
            ppath.unlink()
        except OSError:
            pass
    module.exit_json(changed=False, finished=finished, msg=msg, progress=progress)


if __name__ == "__main__":
    main()
