#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_replicas_plan
short_description: Plan a rollout of a config's replicas behind the router whole, before any replica changes
description:
  - Checks every replica of the layout at once (module_utils/sglang_replica_plan.py) - its GPUs against
    O(gpu_count), the other configs it would stop or displace (named by O(replaces) or taken over whole),
    every port of the layout (each replica's port and NCCL port, the router's port and metrics port) - and
    finds the surplus replicas a scale down retires. Fails with one line naming the thing, the value and
    what is allowed; nothing is changed.
  - When the router's unit is installed, waits up to O(router_wait_s) for it to be active and to answer
    C(/health) (e.g. during systemd's restart delay after a crash), and fails when it does not; a rollout
    never takes replicas out of, or puts them into, a router it cannot reach.
  - Fails when the running router lists a worker that neither its unit nor the layout names (a stranger,
    added through its API by someone else), naming it and how to take it out; a rollout never runs beside it.
  - Read-only; the same in check mode.
options:
  layout: {description: "The renderer's layout (sgdeploy render --json): config, bind_address, replicas, router.",
           type: dict, required: true}
  gpu_count: {description: GPUs the host has (inventory gpu_count)., type: int, required: true}
  replaces:
    description: Config names the operator allows to be replaced (a list or a comma-separated string).
    type: raw
  router_wait_s: {description: Longest wait for an installed router to be active and answer /health., type: int,
                  default: 60}
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
  unit_dir: {description: Folder of the units., type: path, default: /etc/systemd/system}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Plan the rollout of every replica before any of them changes (refused in one line when it does not fit)
  sgdeploy.host.sglang_replicas_plan:
    layout: "{{ layout }}"  # sgdeploy render --json of the config (replicas and router)
    gpu_count: 8
    replaces: ""
    router_wait_s: 60
  register: replicas_plan

- name: Say what the rollout will stop and retire
  ansible.builtin.debug:
    msg: "{{ replicas_plan.plan.line }}"
"""

RETURN = r"""
plan:
  description:
    - replicas ([{index, name, url, gpus, ports, replaces, serving}]; serving - the running router lists it
      healthy), surplus ([{name, unit_name, url, active,
      enabled}] retired after the replicas roll), router_moves (the router's metrics port changes, so it is
      restarted before a new replica takes its old one), router_workers_first, stops, line.
  returned: success
  type: dict
router:
  description: "{unit, installed, active, state, waited_s}: the router's unit as found (after the wait)."
  returned: success, and with a refusal because of the router (then without plan)
  type: dict
"""

import os  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_conflicts import (  # noqa: E402
    ConflictError,
    parse_replaces,
)
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_plan import deployed  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_replica_plan import (  # noqa: E402
    ReplicaPlanError,
    plan,
    refuse_strangers,
    with_live,
)


def wait_router(router, wait_s, poll_s=1.0):
    """{unit, installed, active, state, waited_s} of the layout's router unit; waits while it is installed but
    not active and answering /health."""
    unit = router["unit_name"]
    start = time.monotonic()
    while True:
        state = units.show(unit, "ActiveState").get("ActiveState", "unknown")
        healthy = state == "active" and sglang_http.is_healthy(router["url"], timeout=3.0)
        waited = round(time.monotonic() - start, 1)
        if healthy or time.monotonic() - start >= wait_s:
            return {"unit": unit, "active": healthy, "state": state, "waited_s": waited}
        time.sleep(poll_s)


def main():
    module = AnsibleModule(
        argument_spec={"layout": {"type": "dict", "required": True}, "gpu_count": {"type": "int", "required": True},
                       "replaces": {"type": "raw"}, "router_wait_s": {"type": "int", "default": 60},
                       "state_dir": {"type": "path", "default": "/var/lib/sglang-deploy"},
                       "unit_dir": {"type": "path", "default": api.UNIT_DIR}},
        supports_check_mode=True,
    )
    p = module.params
    layout = p["layout"]
    router = layout.get("router") or None
    router_unit = None
    if router:
        path = os.path.join(p["unit_dir"], router["unit_name"])
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                router_unit = api.parse_router_unit(fh.read())
    try:
        replaces = parse_replaces(p["replaces"])
        result = plan(layout, p["gpu_count"], deployed(p["state_dir"]), units.listeners(), router_unit, replaces)
    except (ReplicaPlanError, ConflictError) as exc:
        module.fail_json(msg=str(exc))
    # A refusal returns no plan: the role registers this module with failed_when: false (which sets failed to
    # false) and refuses the rollout when the result has no plan.
    state = {"unit": router["unit_name"] if router else None, "installed": router_unit is not None,
             "active": False, "state": "none", "waited_s": 0}
    if router_unit is not None:
        state.update(wait_router(router, p["router_wait_s"]))
        if not state["active"]:
            module.fail_json(
                msg=f"router {router['unit_name']} is {state['state']}, not active and answering "
                    f"{router['url']}/health after {state['waited_s']} s (allowed: a running router, or none "
                    f"installed yet); a rollout never skips taking replicas out of it: start it (systemctl "
                    f"reset-failed {router['unit_name']}; systemctl start {router['unit_name']}) and deploy again",
                router=state)
        try:
            listing = api.workers(router["url"])
        except api.RouterError as exc:
            module.fail_json(msg=f"router {router['unit_name']}: {exc}; a rollout never skips taking replicas out of "
                                 "it", router=state)
        try:
            refuse_strangers(layout, router_unit, listing, api.env_file(router["port"]))
        except ReplicaPlanError as exc:
            module.fail_json(msg=str(exc), router=state)
        result = with_live(result, listing)
    module.exit_json(changed=False, plan=result, router=state)


if __name__ == "__main__":
    main()
