#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_switch
short_description: One step of the switch transaction on the host (journaled before it acts)
description:
  - C(recover) undoes a switch journal left by a run that is gone (the caller holds the lock), and
    says what it found; it also removes the staging folders (C(runs/<id>/), with their env files) of
    runs that are gone (RV(removed_runs)); C(begin) backs up every unit the switch touches and writes the journal;
    C(stop) stops the replaced units (systemd sends SIGTERM; SGLang stops admitting requests and
    drains, bounded by TimeoutStopSec) and disables enabled-but-inactive conflicting units; O(ranks) splits
    it in two for an engine over several hosts (see there);
    C(install) puts the new unit and env file in place; C(start) resets the failed state, starts
    the new unit and journals the restart baseline; C(gating) marks the gates; C(undo) rolls back;
    C(commit) records current and previous and enables the new unit; C(retire) ends a manual rollback on a
    rank above 0 of an engine over several hosts with no previous deploy on this host (the engine grew), whose
    stopped unit is disabled and removed with its env file; what ran becomes previous.json.
  - Every step writes the journal (write, fsync, rename) before it acts. Undo restarts the old
    units first and writes the state after.
  - O(deploy) is required with O(action=begin).
options:
  action:
    description: The step.
    type: str
    required: true
    choices: [recover, begin, stop, install, start, gating, undo, commit, retire]
  run_id: {description: The run's id (the lock holder)., type: str, required: true}
  state_dir: {description: The deploy state folder., type: path, default: /var/lib/sglang-deploy}
  env_dir: {description: Folder of the env files., type: path, default: /etc/sglang}
  unit_dir: {description: Folder of the units., type: path, default: /etc/systemd/system}
  deploy: {description: "The deploy description (begin; install in check mode, for the diff).", type: dict}
  unit_text: {description: "The new unit's text (install in check mode, for the diff).", type: str}
  stop_units: {description: Units the switch replaces (begin)., type: list, elements: str, default: []}
  disable_units: {description: Enabled but inactive conflicting units (begin)., type: list, elements: str, default: []}
  unit_src: {description: The staged unit file on the host (install)., type: path}
  env_src: {description: The staged env file on the host (install; may hold secrets)., type: path}
  from_previous:
    description:
      - Install the unit text kept in this config's previous.json (rollback), with the env file rendered
        again from its non-secret part and the inventory's secrets (O(env_src)); previous.json never holds a
        secret value. A previous.json of an older commit that kept the env text is installed as it is.
    type: str
  env_group: {description: Group that may read the env file (the service group)., type: str, default: sglang}
  swap_previous: {description: commit of a manual rollback., type: bool, default: false}
  ranks:
    description:
      - Which replaced units C(stop) stops. C(all) every one. C(first) every one but the ranks above 0 of an engine
        over several hosts (their current.json's C(node_rank) above 0), and disables the idle conflicting units.
        C(above0) only those ranks, to be called once their rank 0 has stopped on its host.
      - SGLang 0.5.23 ignores SIGTERM on a rank above 0 (it only logs it; rank 0's ShutdownReq broadcast at the
        end of its drain stops that rank's schedulers), so such a rank is stopped after rank 0, never before
        it (the caller orders it), and whatever of it still runs O(kill_after_s) seconds later is killed with
        SIGKILL (RV(killed)); with its rank 0 stopped no request needs it, and TimeoutStopSec is not waited for.
    type: str
    choices: [all, first, above0]
    default: all
  kill_after_s:
    description: With O(ranks=above0), seconds a rank above 0 has to exit after the stop before SIGKILL.
    type: int
    default: 30
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.actiongroup_deploy
attributes:
  check_mode:
    support: partial
    details:
      - C(recover) reports what it would undo; C(install) with O(deploy) reports whether the unit would change.
      - The other steps change nothing in check mode and report C(changed).
  diff_mode:
    support: partial
    details:
      - C(install) returns the diff of the unit file; never of the env file, which holds secrets.
"""

EXAMPLES = r"""
# The steps of one switch, in the order the role sglang_deploy runs them (docs/crash-safety.md). The
# action group sets state_dir and run_id once (meta/runtime.yml).
- name: Switch to the deploy (journaled)
  module_defaults:
    group/sgdeploy.host.deploy:
      state_dir: /var/lib/sglang-deploy
      run_id: 20261203T141000Z-k3v9x2ab
  block:
    - name: Undo what an interrupted run left (under the lock)
      sgdeploy.host.sglang_deploy_switch:
        action: recover
      register: recovered

    - name: Back up every unit the switch touches and write the journal
      sgdeploy.host.sglang_deploy_switch:
        action: begin
        deploy: "{{ deploy }}"  # sgdeploy render --json, plus the release
        stop_units: "{{ plan.plan.stop_units }}"
        disable_units: "{{ plan.plan.disable_units }}"

    - name: Stop the services the new one replaces (they drain)
      sgdeploy.host.sglang_deploy_switch:
        action: stop

    - name: Install the new unit and env file
      sgdeploy.host.sglang_deploy_switch:
        action: install
        env_dir: /etc/sglang
        unit_src: /var/lib/sglang-deploy/runs/20261203T141000Z-k3v9x2ab/sglang-ddtree-b15.service
        env_src: /var/lib/sglang-deploy/runs/20261203T141000Z-k3v9x2ab/ddtree-b15.env
        env_group: sglang

    - name: Start the new service (enabled only by the commit)
      sgdeploy.host.sglang_deploy_switch:
        action: start

    - name: Record current and previous, enable the new unit
      sgdeploy.host.sglang_deploy_switch:
        action: commit

- name: Roll the switch back (the old units are restarted first)
  sgdeploy.host.sglang_deploy_switch:
    action: undo
    run_id: 20261203T141000Z-k3v9x2ab
    state_dir: /var/lib/sglang-deploy
    env_dir: /etc/sglang
  register: undo
"""

RETURN = r"""
journal:
  description: The journal after the step (secrets are never in it).
  returned: begin, stop, install, start, gating
  type: dict
found: {description: What recover or undo found., returned: "recover, undo", type: str}
restarted: {description: "Units restarted by an undo, with their current.json.", returned: "recover, undo",
            type: list}
step: {description: The step the undone switch had reached (null when nothing was undone).,
       returned: "recover, undo", type: str}
run_id: {description: The run whose switch was undone., returned: recover or undo of a switch, type: str}
config: {description: The config of the undone switch., returned: recover or undo of a switch, type: str}
notes:
  description: Problems met while undoing (the old service was restarted first).
  returned: recover, undo
  type: list
current: {description: What runs now (commit; empty after retire)., returned: "commit, retire", type: dict}
removed_runs: {description: Run ids whose leftover staging folders were removed., returned: recover, type: list}
stopping: {description: The units this call stopped., returned: stop, type: list}
killed: {description: "Ranks above 0 still running O(kill_after_s) after their stop, killed with SIGKILL.",
         returned: stop, type: list}
"""

import grp  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_txn as txn  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json  # noqa: E402


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _recover(module, paths, run_id):
    """Undo another run's unfinished switch (its journal) and remove the staging folders of runs that are gone."""
    journal = txn.pending(paths)
    if module.check_mode:
        found = "" if journal is None or journal.get("run_id") == run_id else txn.describe(journal)
        module.exit_json(changed=bool(found), found=found, restarted=[], notes=[], removed_runs=[])
    out = {"found": "", "restarted": [], "notes": []}
    if journal is not None and journal.get("run_id") != run_id:
        out = txn.undo(paths)
    # Under the lock: every other run's staging folder belongs to a run that is gone.
    out["removed_runs"] = txn.remove_stale_runs(module.params["state_dir"], run_id)
    module.exit_json(changed=bool(out["found"] or out["removed_runs"]), **out)


def _check_mode(module, paths):
    """Check mode changes nothing; an install shows the unit's diff."""
    p = module.params
    if p["action"] == "install" and p["deploy"]:
        unit_path = paths.unit(p["deploy"]["unit_name"])
        before = _read(unit_path) if os.path.exists(unit_path) else ""
        after = p["unit_text"] if p["unit_text"] is not None else _read(p["unit_src"])
        module.exit_json(changed=before != after, journal={},
                         diff={"before": before, "after": after, "before_header": unit_path,
                               "after_header": unit_path})
    module.exit_json(changed=True, journal={}, found="", restarted=[], notes=[], current={}, stopping=[], killed=[])


def _begin(module, paths, run_id):
    p = module.params
    journal = txn.begin(paths, run_id, p["deploy"], p["stop_units"], p["disable_units"])
    module.exit_json(changed=True, journal=journal)


def _stop(module, paths, run_id):
    journal, stopping, killed = txn.stop(paths, run_id, module.params["ranks"], module.params["kill_after_s"])
    module.exit_json(changed=True, journal=journal, stopping=stopping, killed=killed)


def _install_texts(module, paths):
    """The unit and env file to install: the rendered ones, or those of a previous deploy (from_previous)."""
    p = module.params
    if not p["from_previous"]:
        return _read(p["unit_src"]), _read(p["env_src"])
    previous = read_json(paths.previous(p["from_previous"])) or {}
    unit_text = previous.get("unit_text")
    if unit_text is None:
        module.fail_json(msg=f"config {p['from_previous']}: {paths.previous(p['from_previous'])} has no "
                             "unit text to roll back to")
    # Rendered again on the host from env_public and the inventory's secrets (rollback_one.yml).
    env_text = _read(p["env_src"]) if p["env_src"] and "env_public" in previous \
        else previous.get("env_text", "")
    return unit_text, env_text


def _install(module, paths, run_id):
    unit_text, env_text = _install_texts(module, paths)
    journal = txn.read_json(paths.journal) or {}
    unit_path = paths.unit(journal.get("new_unit", ""))
    before = _read(unit_path) if os.path.exists(unit_path) else ""
    journal = txn.install(paths, run_id, unit_text, env_text, grp.getgrnam(module.params["env_group"]).gr_gid)
    module.exit_json(changed=True, journal=journal,
                     diff={"before": before, "after": unit_text, "before_header": unit_path,
                           "after_header": unit_path})


def _start(module, paths, run_id):
    module.exit_json(changed=True, journal=txn.start(paths, run_id))


def _gating(module, paths, run_id):
    module.exit_json(changed=False, journal=txn.set_step(paths, run_id, "gating"))


def _undo(module, paths, run_id):
    if txn.pending(paths) is None:
        module.exit_json(changed=False, found="nothing to undo: no switch had begun", restarted=[],
                         notes=[])
    module.exit_json(changed=True, **txn.undo(paths))


def _retire(module, paths, run_id):
    module.exit_json(changed=True, **txn.retire(paths, run_id))


def _commit(module, paths, run_id):
    out = txn.commit(paths, run_id, swap_previous=module.params["swap_previous"])
    module.exit_json(changed=True, **out)


# The steps after recover, by action (check mode never reaches them).
ACTIONS = {"begin": _begin, "stop": _stop, "install": _install, "start": _start, "gating": _gating,
           "undo": _undo, "commit": _commit, "retire": _retire}

def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True,
                        choices=["recover", "begin", "stop", "install", "start", "gating", "undo", "commit",
                                 "retire"]),
            run_id=dict(type="str", required=True),
            state_dir=dict(type="path", default="/var/lib/sglang-deploy"),
            env_dir=dict(type="path", default="/etc/sglang"),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            deploy=dict(type="dict"),
            stop_units=dict(type="list", elements="str", default=[]),
            disable_units=dict(type="list", elements="str", default=[]),
            unit_src=dict(type="path"),
            unit_text=dict(type="str"),
            env_src=dict(type="path"),
            from_previous=dict(type="str"),
            env_group=dict(type="str", default="sglang"),
            swap_previous=dict(type="bool", default=False),
            ranks=dict(type="str", default="all", choices=["all", "first", "above0"]),
            kill_after_s=dict(type="int", default=30),
        ),
        required_if=[("action", "begin", ["deploy"])],
        supports_check_mode=True,
    )
    p = module.params
    paths = txn.Paths(p["state_dir"], p["unit_dir"], p["env_dir"])
    action, run_id = p["action"], p["run_id"]
    try:
        if action == "recover":
            _recover(module, paths, run_id)
        if module.check_mode:
            _check_mode(module, paths)
        ACTIONS[action](module, paths, run_id)
    except (txn.TxnError, OSError, KeyError) as exc:
        module.fail_json(msg=f"switch step {action}: {exc}")

if __name__ == "__main__":
    main()
