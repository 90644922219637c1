#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_replica_retire
short_description: Retire a surplus replica after a scale down (stop, disable, remove its unit and env file)
description:
  - For a replica the rollout's plan (sgdeploy.host.sglang_replicas_plan) found surplus, once the router no
    longer lists it (O(sgdeploy.host.sglang_router_workers#module:absent), which lets its requests in flight
    finish),
    stops its unit (SIGTERM, so the engine drains), disables it, removes the unit file and the env file, reloads
    systemd, and moves its C(current.json) to C(retired.json) (its records stay), so that no status, rollback
    or plan counts it as deployed any more.
  - Refuses a name that is not a deployed config of the host. In check mode it says what it would do.
options:
  name: {description: The replica's deploy name (C(<config>-r<i>))., type: str, required: true}
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
  env_dir: {description: The folder of the env files., type: path, default: /etc/sglang}
  unit_dir: {description: Folder of the units., type: path, default: /etc/systemd/system}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports the unit and the files it would remove; changes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take the surplus replica out of the router first (its requests in flight finish)
  sgdeploy.host.sglang_router_workers:
    router_url: http://127.0.0.1:31200
    absent: [http://127.0.0.1:31204]

- name: Retire it (stop, disable, remove its unit and env file)
  sgdeploy.host.sglang_replica_retire:
    name: ddtree-b15-r2
    state_dir: /var/lib/sglang-deploy
"""

RETURN = r"""
unit_name: {description: The unit retired., returned: success, type: str}
removed: {description: Files removed or moved., returned: success, type: list}
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={"name": {"type": "str", "required": True},
                       "state_dir": {"type": "path", "default": "/var/lib/sglang-deploy"},
                       "env_dir": {"type": "path", "default": "/etc/sglang"},
                       "unit_dir": {"type": "path", "default": "/etc/systemd/system"}},
        supports_check_mode=True,
    )
    p = module.params
    current_path = os.path.join(p["state_dir"], p["name"], "current.json")
    current = read_json(current_path)
    if not current or "unit_name" not in current or os.path.basename(p["name"]) != p["name"]:
        module.fail_json(msg=f"sglang_replica_retire: name {p['name']!r} is not a deployed config of this host "
                             f"(allowed: a name with {p['state_dir']}/<name>/current.json)")
    unit = current["unit_name"]
    unit_path = os.path.join(p["unit_dir"], unit)
    env_path = units.env_file(p["env_dir"], p["name"])
    files = [f for f in (unit_path, env_path) if os.path.exists(f)] + [current_path]
    if module.check_mode:
        module.exit_json(changed=True, unit_name=unit, removed=files)
    for args in (("stop", unit), ("disable", unit)):
        proc = units.systemctl(*args)
        if proc.returncode != 0 and args[0] == "stop":
            module.fail_json(msg=f"systemctl stop {unit} failed: {(proc.stderr or proc.stdout).strip()}")
    for f in (unit_path, env_path):
        if os.path.exists(f):
            os.remove(f)
    os.replace(current_path, os.path.join(p["state_dir"], p["name"], "retired.json"))
    units.systemctl("daemon-reload")
    units.systemctl("reset-failed", unit)
    module.exit_json(changed=True, unit_name=unit, removed=files)


if __name__ == "__main__":
    main()
