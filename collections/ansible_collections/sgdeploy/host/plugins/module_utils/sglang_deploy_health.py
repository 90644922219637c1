# Copyright: sgdeploy contributors. Apache-2.0
"""Health of a unit started by this switch: /health answers 200, judged against the restart
baseline taken at this start (systemd's NRestarts is cumulative until reset-failed)."""

from __future__ import annotations

import json
import time

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_http as serving


def http(method, url, body=None, timeout=5.0):
    """(status, body bytes); raises OSError when nothing answers. The gates' one HTTP helper: it sends the
    engine's API key to the origins ``serving.authorize`` was given."""
    return serving._request(method, url, body, timeout)


def healthy(url, timeout=5.0):
    try:
        return http("GET", url.rstrip("/") + "/health", timeout=timeout)[0] == 200
    except OSError:
        return False


def unit_problem(unit, baseline):
    """Why ``unit`` cannot become healthy any more (failed, stopped, restarted since the baseline), or ''."""
    props = units.show(unit, "ActiveState", "NRestarts")
    restarts = int(props.get("NRestarts") or 0)
    if restarts > baseline:
        return f"{unit} restarted {restarts - baseline} time(s) since this start"
    if props.get("ActiveState") in ("failed", "inactive"):
        return f"{unit} is {props.get('ActiveState')}"
    return ""


def wait_healthy(url, unit, baseline, deadline, poll_s, interval=1.0, clock=time.time, sleep=time.sleep):
    """Poll until healthy, a unit problem, the deadline (epoch), or ``poll_s`` seconds of this call.

    Returns (state, detail) with state healthy | exited | timeout | waiting.
    """
    call_end = clock() + poll_s
    while True:
        if healthy(url):
            return "healthy", f"{url}/health answers 200"
        if unit:
            problem = unit_problem(unit, baseline)
            if problem:
                return "exited", f"{problem} before {url}/health answered 200 (see journalctl -u {unit})"
        now = clock()
        if now >= deadline:
            return "timeout", f"{url}/health did not answer 200 in time"
        if now >= call_end:
            return "waiting", f"{url}/health does not answer 200 yet"
        sleep(min(interval, max(deadline - now, 0.01)))


def answer(url, timeout=60.0):
    """One short greedy /generate request; '' when it answered with text, else why not."""
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    try:
        status, raw = http("POST", url.rstrip("/") + "/generate", body, timeout=timeout)
    except OSError as err:
        return f"/generate failed: {err}"
    if status != 200:
        return f"/generate answered HTTP {status}"
    try:
        data = json.loads(raw)
    except ValueError:
        return "/generate answered something that is not JSON"
    data = data[0] if isinstance(data, list) and data else data
    return "" if isinstance(data, dict) and data.get("text") else "/generate answered no text"
