#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_conflicts
short_description: Refuse a deploy or rollback that would stop or displace another config unless it is named
description:
  - Compares the deploy (or, with O(rollback_of), the previous deploy of that config, which a rollback brings
    back) with every other config of the host that is active or enabled (its C(current.json)) and finds
    what they share, in words - the unit name, a port (serving or NCCL, either way round), GPUs.
  - Fails with one line naming each other config and what collides unless O(replaces) names it. A deploy that
    takes another config over whole (all its GPUs; a shared port only port for port or NCCL port for NCCL port)
    needs no name; a rollback, which stops only the config it rolls back, always does.
  - With O(batch) (a deploy), a rank of an engine over several hosts (its C(current.json) has C(nnodes) above 1)
    that the deploy would stop - a displaced config, named or taken over, or the deploy's own config - is refused
    in one line when another host of that engine is not in O(batch) (not in O(run) at all, or in another batch).
    Its ranks stop only together, rank 0 first. RV(engines) lists the engines it stops, for the check across hosts.
  - Read-only; the same in check mode.
  - Exactly one of O(deploy) and O(rollback_of).
options:
  deploy: {description: The deploy description (render output)., type: dict}
  rollback_of:
    description: A config name; its C(previous.json) is what is compared (a manual rollback).
    type: str
  replaces:
    description: Config names the operator allows to be replaced (a list or a comma-separated string).
    type: raw
  host:
    description: This host's inventory name (an engine's C(engine_hosts) are inventory names). With O(batch).
    type: str
  batch:
    description: The hosts deploying in this batch (C(ansible_play_batch)); a deploy only.
    type: list
    elements: str
  run:
    description: Every host of the run (C(ansible_play_hosts_all)); default O(batch).
    type: list
    elements: str
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Find what the deploy would stop or displace (refused unless replaces names it)
  sgdeploy.host.sglang_deploy_conflicts:
    deploy: "{{ deploy }}"  # sgdeploy render --json, plus the release
    replaces: "{{ replaces | default('') }}"
    host: "{{ inventory_hostname }}"
    batch: "{{ ansible_play_batch }}"
    run: "{{ ansible_play_hosts_all }}"
    state_dir: /var/lib/sglang-deploy
  register: conflicts
  failed_when: false

- name: Refuse the deploy, before any change, when a config nobody named would be displaced
  ansible.builtin.fail:
    msg: "DEPLOY REFUSED on {{ inventory_hostname }} before any change: {{ conflicts.msg }}"
  when: conflicts.displaced is not defined

- name: Check what a manual rollback of ddtree-b15 would bring back onto (ar may be stopped)
  sgdeploy.host.sglang_deploy_conflicts:
    rollback_of: ddtree-b15
    replaces: ar
    state_dir: /var/lib/sglang-deploy
"""

RETURN = r"""
displaced: {description: "[{config, unit_name, active, collides, takeover, what}] the configs it collides with.",
            returned: success, type: list}
named: {description: The displaced configs named by O(replaces)., returned: success, type: list}
line: {description: "One line naming what is replaced by name, empty when nothing.", returned: success, type: str}
engines:
  description: "[{config, unit_name, node_rank, engine_hosts}] the engines over several hosts whose rank here the
    deploy would stop (empty without O(batch))."
  returned: success
  type: list
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_conflicts import (  # noqa: E402
    ConflictError,
    conflicts,
    parse_replaces,
)
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_plan import deployed  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(deploy=dict(type="dict"), rollback_of=dict(type="str"), replaces=dict(type="raw"),
                           host=dict(type="str"), batch=dict(type="list", elements="str"),
                           run=dict(type="list", elements="str"),
                           state_dir=dict(type="path", default="/var/lib/sglang-deploy")),
        required_one_of=[("deploy", "rollback_of")], mutually_exclusive=[("deploy", "rollback_of")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        replaces = parse_replaces(p["replaces"])
        deploy = p["deploy"]
        if p["rollback_of"]:
            deploy = read_json(os.path.join(p["state_dir"], p["rollback_of"], "previous.json"))
            if not deploy or "unit_name" not in deploy:
                module.exit_json(changed=False, displaced=[], named=[], line="", engines=[])
        result = conflicts(deploy, deployed(p["state_dir"]), replaces, rollback=p["rollback_of"], host=p["host"],
                           batch=p["batch"], run=p["run"])
    except ConflictError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
