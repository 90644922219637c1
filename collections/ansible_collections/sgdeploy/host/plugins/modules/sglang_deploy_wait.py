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
  - When O(unit) names an engine API key (serving.api_key_secret), the warm-up requests send it as
    C(Authorization: Bearer), read on the host from the unit's environment file, to O(url) only; it is
    never a module argument or a return value.
options:
  what: {description: What to wait for., type: str, required: true, choices: [healthy, stopped]}
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
"""

RETURN = r"""
done: {description: Whether waiting is over (RV(ok) says how it ended)., returned: always, type: bool}
ok: {description: Whether it ended as wanted., returned: always, type: bool}
state: {description: healthy, exited, stopped, timeout or waiting., returned: always, type: str}
elapsed_s: {description: Seconds since O(since)., returned: always, type: float}
detail: {description: One line for people., returned: always, type: str}
"""

import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_health as health  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_lock as lock  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_txn as txn  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_http as serving  # noqa: E402


def _stopped(p, deadline, call_end):
    while True:
        running = [u for u in p["units"] if units.is_active(u)]
        busy = [f"{a}:{port}" for a, port in p["ports"] if not units.port_free(a, int(port))]
        if not running and not busy:
            return "stopped", "units stopped and ports free"
        detail = "still running: {}; ports in use: {}".format(", ".join(running) or "-", ", ".join(busy) or "-")
        if time.time() >= deadline:
            return "timeout", detail
        if time.time() >= call_end:
            return "waiting", detail
        time.sleep(0.5)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            what=dict(type="str", required=True, choices=["healthy", "stopped"]),
            url=dict(type="str"), unit=dict(type="str"), answers=dict(type="int", default=0),
            units=dict(type="list", elements="str", default=[]),
            ports=dict(type="list", elements="list", default=[]),
            since=dict(type="float"), baseline=dict(type="int"),
            timeout_s=dict(type="int", required=True), poll_s=dict(type="int", default=25),
            state_dir=dict(type="path", default="/var/lib/sglang-deploy"),
            run_id=dict(type="str"), lease_s=dict(type="int", default=300),
            lock_path=dict(type="path", default=lock.LOCK),
        ),
        required_if=[("what", "healthy", ["url"])],
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
                serving.authorize(p["url"], key)
            except (units.EngineKeyError, serving.UsageError) as exc:
                module.fail_json(msg=f"wait healthy: {exc}", done=True, ok=False, state="exited", elapsed_s=0.0)
            if key:
                module.no_log_values.add(key)
        state, detail = health.wait_healthy(p["url"], p["unit"], baseline, deadline, p["poll_s"])
        for _ in range(p["answers"] if state == "healthy" else 0):
            problem = health.answer(p["url"])
            if problem:
                state, detail = "exited", "healthy, but " + problem
                break
    else:
        state, detail = _stopped(p, deadline, call_end)
    elapsed = round(time.time() - since, 1)
    done = state != "waiting"
    module.exit_json(changed=False, done=done, ok=state in ("healthy", "stopped"), state=state,
                     elapsed_s=elapsed, detail=f"{detail} ({elapsed:.0f} s of {p['timeout_s']} s)")


if __name__ == "__main__":
    main()
