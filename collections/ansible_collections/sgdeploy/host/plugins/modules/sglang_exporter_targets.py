#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_exporter_targets
short_description: The scrape targets of this host's metrics exporter (read-only)
description:
  - Lists what the host's C(sglang-exporter) relays, from the deploys on the host (each C(current.json) of the
    state folder) and its router units, each with the path Prometheus scrapes on the exporter and the labels
    host, config, release and replica (docs/monitoring.md).
  - The monitoring role generates its scrape config from this list, and the exporter serves from the same code
    (module_utils C(sglang_exporter)), so the two agree.
options:
  host: {description: The host label (the inventory hostname)., type: str, required: true}
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
  unit_dir: {description: Folder of the router unit files., type: path, default: /etc/systemd/system}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the host's scrape targets
  sgdeploy.host.sglang_exporter_targets:
    host: "{{ inventory_hostname }}"
  register: targets

- name: Show them
  ansible.builtin.debug:
    msg: "{{ item.job }} {{ item.path }} {{ item.labels }}"
  loop: "{{ targets.targets }}"
"""

RETURN = r"""
targets:
  description:
    - One entry per target, each with job (sgdeploy-host, sglang-engine or sglang-router), path (on the exporter)
      and labels (host; config, release and replica for engines and routers; replica is "" for a single engine
      and for a router).
  returned: always
  type: list
  elements: dict
  sample:
    - {job: sglang-engine, path: /metrics/engine/ddtree-b15-r0, labels: {host: gpu-01, config: ddtree-b15,
       release: 0.5.23-ddtree-1a2b3c, replica: "0"}}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_exporter  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(host=dict(type="str", required=True),
                           state_dir=dict(type="path", default=sglang_exporter.STATE_DIR),
                           unit_dir=dict(type="path", default=sglang_exporter.UNIT_DIR)),
        supports_check_mode=True,
    )
    p = module.params
    module.exit_json(changed=False, targets=sglang_exporter.scrape_targets(p["host"], p["state_dir"], p["unit_dir"]))


if __name__ == "__main__":
    main()
