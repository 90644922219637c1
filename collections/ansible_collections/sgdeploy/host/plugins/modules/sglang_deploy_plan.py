#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_plan
short_description: Plan a switch to a deploy on this host without changing anything
description:
  - GPU indices against gpu_count; configs that run on the same name, GPUs or port (replaced);
    enabled but inactive configs on the same port or GPUs (disabled by the switch); ports held by
    anything else (refused here, before any change); whether the same unit, release and env file
    already run (the env file rendered on the host for this run, secrets included, is compared by
    digest with the installed one on the host; only the verdict is returned).
  - "Drift (RV(plan.drift)) - the installed unit and env file of the config that runs are compared with what
    this deploy renders and with the digests its commit recorded, and their modes and owners with 0644
    root:root and 0640 root:<env_group>; a drifted file is a change (the switch installs the rendered
    files again and the gates run). Each entry is C(<file>: <what>), naming settings and variables,
    never a value."
  - Also reports a switch journal left behind by an interrupted run (RV(interrupted)).
  - "Read-only. In check mode (C(make plan)) it is the one task that says what a real run would change:
    C(changed) exactly when the deploy is not already running unchanged, with the diff of the new unit
    against the installed one it replaces, and of the env file with every secret value redacted (names
    only; C(NAME=<secret, changed>) when a value differs)."
options:
  deploy: {description: The deploy description (render output plus the release)., type: dict, required: true}
  gpu_count: {description: GPUs the host has (inventory gpu_count)., type: int, required: true}
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
  env_dir: {description: The folder of the installed env files., type: path, default: /etc/sglang}
  env_src:
    description: The env file rendered on the host for this run; absent (check mode) means not compared.
    type: path
  env_text:
    description: Check mode only; the env file rendered in memory (secrets included; never logged or returned).
    type: str
  unit_text:
    description:
      - The new unit's text, compared with the installed unit (drift) and, in check mode, for the diff.
    type: str
  env_group:
    description:
      - "The service group, the env file's group (drift: the unit must be 0644 root:root, the env file 0640
        root:<env_group>). Unset, the installed files are not checked for drift."
    type: str
  secret_keys:
    description: Names of the secret variables (their values are redacted in the diff).
    type: list
    elements: str
    default: []
  unit_dir: {description: Folder of the units., type: path, default: /etc/systemd/system}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Changes nothing in either mode. In check mode it reports C(changed) exactly when the deploy is not already
        running unchanged, which is what a real run would change.
  diff_mode:
    support: partial
    details:
      - In check mode only, the diff of the new unit and of the env file (secret values redacted) against the
        installed ones; a real run returns no diff.
"""

EXAMPLES = r"""
- name: Plan the switch (read-only; in check mode, the diff of what a real run would change)
  sgdeploy.host.sglang_deploy_plan:
    deploy: "{{ deploy }}"  # sgdeploy render --json, plus the release
    gpu_count: 1
    state_dir: /var/lib/sglang-deploy
    env_dir: /etc/sglang
    env_src: /var/lib/sglang-deploy/runs/20261203T141000Z-k3v9x2ab/ddtree-b15.env
    env_text: "{{ lookup('ansible.builtin.template', 'sglang.env.j2') if ansible_check_mode else omit }}"
    unit_text: "{{ lookup('ansible.builtin.file', deploy.unit) ~ '\n' }}"
    env_group: sglang
    secret_keys: [SGLANG_API_KEY]
  register: plan

- name: Say what the switch stops and whether anything changes
  ansible.builtin.debug:
    msg: "stops {{ plan.plan.stop_units }}; unchanged: {{ plan.plan.unchanged }}; drift: {{ plan.plan.drift }}"
"""

RETURN = r"""
plan:
  description: What the switch would do.
  returned: success
  type: dict
  contains:
    predecessors:
      description: The running deploys sharing the config name, a GPU or a port (the switch replaces them).
      type: list
    replaces: {description: Their configs., type: list}
    stop_units: {description: Units the switch stops., type: list}
    disable_units: {description: Enabled but inactive conflicting units it disables., type: list}
    wait_ports: {description: "[address, port] pairs that must be free before the new unit starts.", type: list}
    unchanged: {description: "The same unit, release and env file already run, with no drift.", type: bool}
    env_changed: {description: The env file differs from the installed one (only the verdict)., type: bool}
    drift:
      description: "C(<file>: <what>) per hand-edited file of the config that runs (names, never values)."
      type: list
interrupted: {description: What an interrupted switch left (empty when none)., returned: success, type: str}
"""

import grp  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_txn as txn  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_plan import PlanError, plan, plan_diff  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(deploy=dict(type="dict", required=True), gpu_count=dict(type="int", required=True),
                           state_dir=dict(type="path", default="/var/lib/sglang-deploy"),
                           env_dir=dict(type="path", default="/etc/sglang"), env_src=dict(type="path"),
                           env_text=dict(type="str", no_log=True), unit_text=dict(type="str"),
                           secret_keys=dict(type="list", elements="str", default=[], no_log=False),
                           unit_dir=dict(type="path", default="/etc/systemd/system"),
                           env_group=dict(type="str")),
        supports_check_mode=True,
    )
    p = module.params
    pending = txn.pending(txn.Paths(p["state_dir"]))
    env_gid = None
    if p["env_group"]:
        try:
            env_gid = grp.getgrnam(p["env_group"]).gr_gid
        except KeyError:
            env_gid = None  # no service group yet: nothing of this deploy is installed
    try:
        result = plan(p["deploy"], p["gpu_count"], p["state_dir"], env_src=p["env_src"], env_dir=p["env_dir"],
                      env_text=p["env_text"] if module.check_mode else None, unit_dir=p["unit_dir"],
                      unit_text=p["unit_text"], env_gid=env_gid)
    except PlanError as exc:
        module.fail_json(msg=str(exc))
    interrupted = txn.describe(pending) if pending else ""
    if not module.check_mode:
        module.exit_json(changed=False, plan=result, interrupted=interrupted)
    diff = [] if result["unchanged"] else plan_diff(p["deploy"], result, p["unit_dir"], p["env_dir"], p["unit_text"],
                                                    p["env_text"], p["secret_keys"])
    module.exit_json(changed=not result["unchanged"], plan=result, interrupted=interrupted, diff=diff)


if __name__ == "__main__":
    main()
