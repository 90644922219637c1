#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_status
short_description: What sgdeploy runs on this host, the lock holder and any interrupted switch (read-only)
description:
  - Reads the deploy state folder, the lock file and the switch journal; with O(probe), also asks each
    running deploy's C(/health).
  - Compares each deployed config's installed unit and env file with the digests, modes and owners its deploy
    recorded (drift); names only files and setting names, never a value.
options:
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
  lock_path: {description: The lock file., type: path, default: /run/sglang-deploy.lock}
  config: {description: Also return this config's current and previous deploy (without unit or env text)., type: str}
  probe:
    description:
      - Also ask each running deploy's C(/health) (on its bind address and first port, a few seconds at most)
        whether it serves; each entry of RV(deployed) then has C(healthy).
    type: bool
    default: false
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Read what runs on the host, with a health probe of each deploy
  sgdeploy.host.sglang_deploy_status:
    state_dir: /var/lib/sglang-deploy
    probe: true
  register: status

- name: Read the current and previous deploy of one config (before a manual rollback)
  sgdeploy.host.sglang_deploy_status:
    state_dir: /var/lib/sglang-deploy
    config: ddtree-b15
  register: rollback_state

- name: Refuse when there is nothing to roll back to
  ansible.builtin.assert:
    that: rollback_state.previous is not none and rollback_state.previous_has_unit
    fail_msg: "config ddtree-b15: no previous deploy recorded; nothing to roll back to"
"""

RETURN = r"""
deployed:
  description:
    - current.json of each config with active and enabled.
    - drift lists the config's unit and env file edited by hand since its deploy (their digests, modes and owners
      against what its commit recorded), one entry per file as "FILE - what differs"; empty when none.
    - With O(probe), also healthy (true when /health answers 200, false when not, null when the unit is not active).
  returned: always
  type: list
lock: {description: "The lock holder, described (empty when free).", returned: always, type: str}
interrupted: {description: What an interrupted switch left (empty when none)., returned: always, type: str}
uncommitted:
  description:
    - The unit an interrupted switch installed (never enabled, no current.json yet) and whether it runs.
    - Null when no switch is pending.
  returned: always
  type: dict
records: {description: Paths of the record files., returned: always, type: list}
current: {description: current.json of O(config) (null when none)., returned: with config, type: dict}
previous:
  description: previous.json of O(config) without its texts (null when none).
  returned: with config
  type: dict
previous_has_unit:
  description: previous.json of O(config) keeps a unit text to roll back to.
  returned: with config
  type: bool
"""

import glob  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_lock as lock  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_txn as txn  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_plan import (  # noqa: E402
    deployed,
    installed_drift,
)

PROBE_TIMEOUT_S = 3.0


def probe(entry):
    """Whether a deploy serves: its /health answers 200 (None when its unit is not active)."""
    if not entry.get("active") or not entry.get("ports"):
        return None
    address = entry.get("bind_address") or "127.0.0.1"
    address = "127.0.0.1" if address == "0.0.0.0" else f"[{address}]" if ":" in address else address
    return sglang_http.is_healthy(f"http://{address}:{entry['ports'][0]}", timeout=PROBE_TIMEOUT_S)


def main():
    module = AnsibleModule(
        argument_spec=dict(state_dir=dict(type="path", default="/var/lib/sglang-deploy"),
                           lock_path=dict(type="path", default=lock.LOCK), config=dict(type="str"),
                           probe=dict(type="bool", default=False)),
        supports_check_mode=True,
    )
    p = module.params
    held = lock.read(p["lock_path"])
    pending = txn.pending(txn.Paths(p["state_dir"]))
    # What an interrupted switch started runs too, though no current.json names it yet.
    new_unit = (pending or {}).get("new_unit")
    extra = {"uncommitted": {"unit": new_unit, "config": pending.get("config"), "active": units.is_active(new_unit)}
             if new_unit else None}
    if p["config"]:
        paths = txn.Paths(p["state_dir"])
        previous = read_json(paths.previous(p["config"]))
        extra |= {"current": read_json(paths.current(p["config"])),
                 "previous": {k: v for k, v in previous.items() if not k.endswith("_text")} if previous else None,
                 "previous_has_unit": bool(previous and previous.get("unit_text"))}
    running = deployed(p["state_dir"])
    for entry in running:
        entry["drift"] = installed_drift(entry)
    # A rank above 0 of an engine over several hosts serves no API of its own (SGLang 0.5.23 answers /health there
    # with a stub that says nothing of the engine; docs/multinode.md): rank 0's probe speaks for the engine.
    for entry in running if p["probe"] else ():
        entry["healthy"] = probe(entry) if not entry.get("node_rank") else None
    module.exit_json(changed=False, **extra, deployed=running,
                     lock=lock.describe(held) if held else "",
                     interrupted=txn.describe(pending) if pending else "",
                     records=sorted(glob.glob(os.path.join(p["state_dir"], "*", "records", "*.json"))))


if __name__ == "__main__":
    main()
