#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_wait
short_description: Wait a bounded slice for a service to be healthy, or for units to stop and ports to be free
description:
  - Returns after at most O(poll_s) seconds with RV(done) and RV(elapsed_s), so that a task with
    C(until) and C(retries) prints progress while it waits; it renews the run's lock lease each call.
  - C(healthy) judges restarts against the baseline journaled at this start (O(baseline) overrides it),
    and stops early when the unit failed, stopped or restarted.
  - Read-only apart from the lease; runs in check mode (then it does not wait).
  - O(url) is required with O(what=healthy).
  - When O(unit) names an engine API key (serving.api_key_secret), the warm-up requests send it as
    C(Authorization) bearer token, read on the host from the unit's environment file, to O(url) only; it is
    never a module argument or a return value.
options:
  what:
    description:
      - What to wait for.
      - V(running) is for a rank above 0 of an engine over several hosts (docs/multinode.md), which serves no HTTP
        (rank 0 does); O(unit) must stay active, without a restart, for O(settle_s) seconds.
    type: str
    required: true
    choices: [healthy, stopped, running]
  settle_s: {description: "How long O(unit) must stay up (running).", type: int, default: 5}
  url: {description: The service's base URL (healthy)., type: str}
  unit: {description: The unit started by this switch (healthy)., type: str}
  answers:
    description: Once healthy, send this many short /generate requests; each must answer with text (warm-up).
    type: int
    default: 0
  units: {description: Units that must be inactive (stopped)., type: list, elements: str, default: []}
  ports: {description: "[address, port] pairs that must be free (stopped).", type: list, elements: list, default: []}
  since: {description: Epoch the wait started (default the journaled start of the switch)., type: float}
  baseline: {description: NRestarts at this start (default the journaled baseline)., type: int}
  timeout_s: {description: Seconds from O(since) before giving up., type: int, required: true}
  poll_s: {description: Longest time one call waits., type: int, default: 25}
  state_dir: {description: The deploy state folder (for the journal)., type: path, default: /var/lib/sglang-deploy}
  run_id: {description: Renew this run's lock lease., type: str}
  lease_s: {description: Lease to renew., type: int, default: 300}
  lock_path: {description: The lock file., type: path, default: /run/sglang-deploy.lock}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.actiongroup_deploy
attributes:
  check_mode:
    support: partial
    details:
      - Neither waits nor renews the lease; returns at once with RV(done) and RV(ok) true and RV(state=check).
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Wait until the replaced services have stopped and every port is free
  sgdeploy.host.sglang_deploy_wait:
    what: stopped
    units: [sglang-ar.service]
    ports: [[127.0.0.1, 30000]]
    timeout_s: 180
    state_dir: /var/lib/sglang-deploy
    run_id: 20261203T141000Z-k3v9x2ab
    lease_s: 300
  register: stopped
  until: stopped.done
  retries: 9
  delay: 0

- name: Wait for health and warm up (model load can take minutes; progress every 25 s)
  sgdeploy.host.sglang_deploy_wait:
    what: healthy
    url: http://127.0.0.1:30000
    unit: sglang-ddtree-b15.service
    answers: 3
    timeout_s: 1800
    state_dir: /var/lib/sglang-deploy
    run_id: 20261203T141000Z-k3v9x2ab
    lease_s: 300
  register: health
  until: health.done
  retries: 74
  delay: 0
"""

RETURN = r"""
done: {description: Whether waiting is over (RV(ok) says how it ended)., returned: always, type: bool}
ok: {description: Whether it ended as wanted., returned: always, type: bool}
state:
  description:
    - healthy, running, exited, stopped, held (a port kept by something this deploy does not stop), timeout or waiting
      (check in check mode).
  returned: always
  type: str
elapsed_s: {description: Seconds since O(since)., returned: always, type: float}
detail: {description: One line for people., returned: always, type: str}
"""

import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_lock as lock  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_txn as txn  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http  # noqa: E402

# How long a port may stay held by a process outside the units being stopped before the wait gives up:
# waiting will not free it (a unit this deploy does not stop, a stray process).
FOREIGN_GRACE_S = 10.0


def _foreign_holders(ports, stopping):
    """Listeners on the given busy [address, port] pairs that belong to none of the units being stopped."""
    held = []
    for sock in units.listeners():
        for address, port in ports:
            if sock["port"] == int(port) and units.overlaps(sock["address"], address) and sock["unit"] not in stopping:
                who = "{} (pid {}".format(sock["process"] or "a process", ", ".join(map(str, sock["pids"])) or "?")
                who += ", unit {})".format(sock["unit"]) if sock["unit"] else ")"
                held.append(f"{sock['address']}:{sock['port']} is held by {who}")
    return held


def _stopped(p, deadline, call_end):
    foreign_since = None
    while True:
        running = [u for u in p["units"] if units.active_state(u) in units.RUNNING_STATES]
        busy = [(a, int(port)) for a, port in p["ports"] if not units.port_free(a, int(port))]
        if not running and not busy:
            return "stopped", "units stopped and ports free"
        detail = "still running: {}; ports in use: {}".format(
            ", ".join(running) or "-", ", ".join(f"{a}:{port}" for a, port in busy) or "-")
        foreign = _foreign_holders(busy, set(p["units"])) if busy and not running else []
        if foreign:
            foreign_since = foreign_since or time.time()
            if time.time() - foreign_since >= FOREIGN_GRACE_S:
                return "held", "port " + "; port ".join(foreign) + ", which this deploy does not stop"
        else:
            foreign_since = None
        if time.time() >= deadline:
            return "timeout", detail
        if time.time() >= call_end:
            return "waiting", detail
        time.sleep(0.5)


def _running(unit, baseline, settle_s, deadline, call_end):
    """A rank above 0 (no HTTP): its unit active and not restarted for settle_s seconds in a row."""
    up_since = None
    while True:
        problem = sglang_http.unit_problem(unit, baseline)
        active = units.active_state(unit) == "active"
        if problem:
            return "exited", f"{problem} (see journalctl -u {unit})"
        up_since = (up_since or time.time()) if active else None
        if up_since is not None and time.time() - up_since >= settle_s:
            return "running", f"{unit} active for {settle_s} s without a restart (a rank above 0: rank 0 serves)"
        if time.time() >= deadline:
            return "timeout", f"{unit} did not stay active"
        if time.time() >= call_end:
            return "waiting", f"{unit} not settled yet"
        time.sleep(0.5)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            what=dict(type="str", required=True, choices=["healthy", "stopped", "running"]),
            settle_s=dict(type="int", default=5),
            url=dict(type="str"), unit=dict(type="str"), answers=dict(type="int", default=0),
            units=dict(type="list", elements="str", default=[]),
            ports=dict(type="list", elements="list", default=[]),
            since=dict(type="float"), baseline=dict(type="int"),
            timeout_s=dict(type="int", required=True), poll_s=dict(type="int", default=25),
            state_dir=dict(type="path", default="/var/lib/sglang-deploy"),
            run_id=dict(type="str"), lease_s=dict(type="int", default=300),
            lock_path=dict(type="path", default=lock.LOCK),
        ),
        required_if=[("what", "healthy", ["url"]), ("what", "running", ["unit"])],
        supports_check_mode=True,
    )
    p = module.params
    journal = txn.read_json(txn.Paths(p["state_dir"]).journal) or {}
    step_epoch = journal.get("started_epoch" if p["what"] == "healthy" else "stopping_epoch")
    since = p["since"] if p["since"] is not None else step_epoch or time.time()
    baseline = p["baseline"] if p["baseline"] is not None else journal.get("nrestarts_baseline", 0)
    if module.check_mode:
        module.exit_json(changed=False, done=True, ok=True, state="check", elapsed_s=0.0, detail="check mode")
    if p["run_id"]:
        try:
            lock.renew(p["run_id"], p["lease_s"], "wait {}".format(p["what"]), lock=p["lock_path"])
        except lock.LockError as exc:
            module.fail_json(msg=str(exc), done=True, ok=False, state="lost-lock", elapsed_s=0.0)
    deadline, call_end = since + p["timeout_s"], time.time() + p["poll_s"]
    if p["what"] == "healthy":
        if p["unit"] and p["answers"]:
            try:
                key = units.engine_key(p["unit"])
                sglang_http.authorize(p["url"], key)
            except (units.EngineKeyError, sglang_http.UsageError) as exc:
                module.fail_json(msg=f"wait healthy: {exc}", done=True, ok=False, state="exited", elapsed_s=0.0)
            if key:
                module.no_log_values.add(key)
        state, detail = sglang_http.wait_healthy(p["url"], p["unit"], baseline, deadline, p["poll_s"])
        for _ in range(p["answers"] if state == "healthy" else 0):
            problem = sglang_http.answer(p["url"])
            if problem:
                state, detail = "exited", "healthy, but " + problem
                break
    elif p["what"] == "running":
        state, detail = _running(p["unit"], baseline, p["settle_s"], deadline, call_end)
    else:
        state, detail = _stopped(p, deadline, call_end)
    elapsed = round(time.time() - since, 1)
    done = state != "waiting"
    module.exit_json(changed=False, done=done, ok=state in ("healthy", "stopped", "running"), state=state,
                     elapsed_s=elapsed, detail=f"{detail} ({elapsed:.0f} s of {p['timeout_s']} s)")


if __name__ == "__main__":
    main()
