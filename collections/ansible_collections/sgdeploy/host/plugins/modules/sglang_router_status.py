#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_router_status
short_description: Read every sglang-router of the host, its state and the engines it routes to
description:
  - For each C(sglang-router-<port>.service) the role sglang_router installed, reports whether it is
    active, where it listens, the replicas its unit lists, and what the router's C(GET /workers) says
    of each (healthy, unhealthy, or not in the router, e.g. while a rollout has taken it out), and
    every worker the router lists that its unit does not (a stranger, which someone added through the API).
  - Calls the worker API with the router's admin key from its environment file (docs/router.md).
  - Read-only; runs in check mode.
options:
  unit_dir: {description: Folder of the unit files., type: path, default: /etc/systemd/system}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the routers in front of replicas
  sgdeploy.host.sglang_router_status:
  register: routers

- name: Show the routers and their replicas
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }} router: {{ item.summary }}"
  loop: "{{ routers.routers }}"
"""

RETURN = r"""
routers:
  description: "One entry per router: unit, active, address, port, workers ({url: healthy|unhealthy|out}), strangers
    (listed by the router, not by its unit), ok (active, every worker healthy, no stranger), summary."
  returned: always
  type: list
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402


def main():
    module = AnsibleModule(argument_spec={"unit_dir": {"type": "path", "default": api.UNIT_DIR}},
                           supports_check_mode=True)
    routers = []
    for r in api.router_units(module.params["unit_dir"]):
        r["active"] = units.is_active(r["unit"])
        states = {}
        strangers = []
        error = ""
        if r["active"]:
            try:
                listing = api.workers(f"http://{r['address']}:{r['port']}")
                states = {w: ("healthy" if listing[w]["healthy"] else "unhealthy") if w in listing else "out"
                          for w in r["workers"]}
                strangers = api.compare(listing, r["workers"])[0]
            except api.RouterError as exc:
                error = str(exc)
        r["workers"] = states or {w: "unknown" for w in r["workers"]}
        r["strangers"] = strangers
        healthy = sum(1 for s in r["workers"].values() if s == "healthy")
        r["ok"] = bool(r["active"] and not error and not strangers and healthy == len(r["workers"]))
        r["summary"] = (f"{r['unit']} {'active' if r['active'] else 'NOT ACTIVE'} on {r['address']}:{r['port']}: "
                        f"{healthy} of {len(r['workers'])} replica(s) healthy in the router"
                        + (f" ({', '.join(f'{u} {s}' for u, s in r['workers'].items() if s != 'healthy')})"
                           if healthy < len(r["workers"]) else "")
                        + (f"; NOT AS DEPLOYED: {len(strangers)} stranger worker(s) the unit does not list: "
                           f"{', '.join(strangers)}" if strangers else "") + (f"; {error}" if error else ""))
        routers.append(r)
    module.exit_json(changed=False, routers=routers)


if __name__ == "__main__":
    main()
