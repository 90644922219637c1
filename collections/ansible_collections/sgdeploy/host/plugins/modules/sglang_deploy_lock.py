#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_lock
short_description: Take, renew or release the host's deploy lock (owned by a run, held by a lease)
description:
  - The lock names the run (id, controller, operation, start time) and holds a lease the run renews
    at each step. A lock whose lease expired, or whose controller process the caller proved gone
    (O(take_over)), is taken over with a message in RV(recovered).
  - In check mode nothing is written; acquiring still fails when another live run holds the lock.
options:
  state:
    description: acquired takes (or re-takes) the lock, renewed extends the lease, released removes it.
    type: str
    choices: [acquired, renewed, released]
    default: acquired
  run_id: {description: The run's id., type: str, required: true}
  controller: {description: The controller host running the run., type: str, default: ""}
  controller_pid: {description: The run's ansible-playbook process on the controller., type: int}
  operation: {description: "What the run does (deploy or rollback).", type: str, default: deploy}
  lease_s: {description: Seconds the lease lasts from now., type: int, default: 300}
  step: {description: The step the run is in (shown to a refused run)., type: str}
  take_over: {description: Run id of a holder whose controller process is gone., type: str}
  path: {description: The lock file., type: path, default: /run/sglang-deploy.lock}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Writes nothing; O(state=acquired) still fails, as a real run would, while another live run holds the lock.
  diff_mode:
    support: none
    details:
      - The lock lives in /run for the length of one run; it is never reported as a change.
"""

EXAMPLES = r"""
- name: Take the host's deploy lock for this run (fails while another live run holds it)
  sgdeploy.host.sglang_deploy_lock:
    run_id: 20261203T141000Z-k3v9x2ab
    controller: ctl1
    controller_pid: 48211
    operation: deploy
    lease_s: 300
  register: lock_try
  failed_when: false

- name: Take over the lock of a run whose ansible-playbook is gone
  sgdeploy.host.sglang_deploy_lock:
    run_id: 20261203T141000Z-k3v9x2ab
    controller: ctl1
    controller_pid: 48211
    take_over: "{{ lock_try.held.run_id }}"
  when: lock_try.held is defined

- name: Extend the lease over the gates (one long step)
  sgdeploy.host.sglang_deploy_lock:
    state: renewed
    run_id: 20261203T141000Z-k3v9x2ab
    lease_s: 1800
    step: gates

- name: Release the lock at the end of the run
  sgdeploy.host.sglang_deploy_lock:
    state: released
    run_id: 20261203T141000Z-k3v9x2ab
"""

RETURN = r"""
lock: {description: "The lock as written (or as held, in check mode).", returned: success, type: dict}
recovered: {description: Why a stale lock was taken over (empty when it was not)., returned: success, type: str}
released: {description: Whether the lock was removed (state=released)., returned: success, type: bool}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_lock as lock  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["acquired", "renewed", "released"], default="acquired"),
            run_id=dict(type="str", required=True),
            controller=dict(type="str", default=""),
            controller_pid=dict(type="int"),
            operation=dict(type="str", default="deploy"),
            lease_s=dict(type="int", default=300),
            step=dict(type="str"),
            take_over=dict(type="str"),
            path=dict(type="path", default=lock.LOCK),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        if module.check_mode:
            held = lock.read(p["path"]) or {}
            if p["state"] == "acquired" and held and held.get("run_id") not in (p["run_id"], p["take_over"]):
                import time
                if float(held.get("expires", 0)) > time.time():
                    what = held.get("operation", "deploy")
                    module.fail_json(msg=f"another {what} holds the lock {p['path']} on this host: "
                                         f"{lock.describe(held)}", held=held)
            module.exit_json(changed=False, lock=held, recovered="", released=False)
        if p["state"] == "acquired":
            out = lock.acquire(p["run_id"], p["controller"], p["operation"], p["lease_s"], lock=p["path"],
                               take_over=p["take_over"], controller_pid=p["controller_pid"])
            module.exit_json(changed=False, lock=out["lock"], recovered=out["recovered"], released=False)
        if p["state"] == "renewed":
            module.exit_json(changed=False, lock=lock.renew(p["run_id"], p["lease_s"], p["step"], lock=p["path"]),
                             recovered="", released=False)
        module.exit_json(changed=False, lock={}, recovered="", released=lock.release(p["run_id"], lock=p["path"]))
    except lock.LockError as exc:
        module.fail_json(msg=str(exc), held=lock.read(p["path"]) or {})


if __name__ == "__main__":
    main()
