#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_router_replicas
short_description: Find what a manual rollback of a config name rolls back, and the router in front of each
description:
  - O(config) is the name a rollback was given. When the host has a current deploy of that name, it is that
    one deploy (a config with one engine, or one replica C(<config>-r<i>)). Otherwise the current deploys
    C(<config>-r0), C(<config>-r1), ... (the replicas of a config behind the router, docs/router.md), in order.
  - For each, the router whose unit (C(sglang-router-*.service)) lists the deploy's URL among its
    C(--worker-urls); none for a deploy that no router fronts.
  - Reads only; the same in check mode.
options:
  config:
    description: The name given to the rollback.
    required: true
    type: str
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
  unit_dir: {description: Where the router units are., type: path, default: /etc/systemd/system}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Find the replicas behind a router that the name stands for (reads only)
  sgdeploy.host.sglang_router_replicas:
    config: ddtree-b15
    state_dir: /var/lib/sglang-deploy
  register: layout

- name: List what to roll back, one deploy at a time
  ansible.builtin.debug:
    msg: "{{ item.name }} at {{ item.url }}, router {{ item.router_url or 'none' }}"
  loop: "{{ layout.deploys }}"
"""

RETURN = r"""
deploys: {description: "[{name, url, router_url, router_unit}] in rollback order (router_url null: no router).",
          returned: always, type: list}
replicas: {description: "The name stands for the replicas <config>-r<i> of a config, not one deploy of that name.",
           returned: always, type: bool}
"""

import glob  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json  # noqa: E402


def find(state_dir, config, unit_dir=api.UNIT_DIR):
    """The deploys a rollback of ``config`` rolls back, with the router in front of each (see DOCUMENTATION)."""
    names = []
    if os.path.isfile(os.path.join(state_dir, config, "current.json")):
        names = [config]
    else:
        pattern = re.compile(re.escape(config) + r"-r([0-9]+)$")
        found = []
        for path in glob.glob(os.path.join(glob.escape(state_dir), glob.escape(config) + "-r*", "current.json")):
            m = pattern.match(os.path.basename(os.path.dirname(path)))
            if m:
                found.append((int(m.group(1)), m.group(0)))
        names = [name for _, name in sorted(found)]
    routers = api.router_units(unit_dir)
    out = []
    for name in names:
        current = read_json(os.path.join(state_dir, name, "current.json")) or {}
        ports = current.get("ports") or []
        url = f"http://{current.get('bind_address')}:{ports[0]}" if ports and current.get("bind_address") else None
        router = next((r for r in routers if url and url in [w.rstrip("/") for w in r["workers"]]), None)
        out.append({"name": name, "url": url, "router_unit": router["unit"] if router else None,
                    "router_url": f"http://{router['address']}:{router['port']}" if router else None})
    return out


def main():
    module = AnsibleModule(
        argument_spec={"state_dir": {"type": "path", "default": "/var/lib/sglang-deploy"},
                       "config": {"type": "str", "required": True},
                       "unit_dir": {"type": "path", "default": api.UNIT_DIR}},
        supports_check_mode=True,
    )
    p = module.params
    deploys = find(p["state_dir"], p["config"], p["unit_dir"])
    module.exit_json(changed=False, deploys=deploys,
                     replicas=len(deploys) > 1 or any(d["name"] != p["config"] for d in deploys))


if __name__ == "__main__":
    main()
