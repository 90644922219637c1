"""Action plugin sgdeploy.host.controller_fleet: the fleet router's plan, made in-process on the controller.

Runs inside ansible-playbook on the controller (no connection to the host, no subprocess): loads the config with
``sgdeploy.spec`` and asks ``sgdeploy.fleet.plan`` for each GPU host's engine URL, the fleet router's address and
ports and the batch size, or the one line that refuses the fleet. The documentation is
plugins/modules/controller_fleet.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_router_api import parse_router_unit
from ansible_collections.sgdeploy.host.plugins.plugin_utils.controller_action import ControllerAction

ARGUMENT_SPEC = {
    "config": {"type": "str", "required": True},
    "chdir": {"type": "path", "required": True},
    "engines": {"type": "list", "elements": "str", "required": True},
    "routers": {"type": "list", "elements": "str", "required": True},
    "max_unavailable": {"type": "str", "default": ""},
    "installed": {"type": "dict", "default": {}},
}


class ActionModule(ControllerAction):
    NAME = "controller_fleet"
    MAKE_TARGET = "deploy"

    def run(self, tmp=None, task_vars=None):
        result, args = self.start(tmp, task_vars, ARGUMENT_SPEC)
        loaded = self.sgdeploy(result, "fleet", "spec")
        if loaded is None:
            return result
        fleet, spec = loaded
        try:
            name = args["config"]
            config = spec.load(str(Path(args["chdir"]) / name) if spec.is_path(name) else name)
            hostvars = (task_vars or {}).get("hostvars", {})

            def host(name: str):  # where Ansible reaches it and the address its services bind
                known = hostvars[name] if name in hostvars else {}
                return fleet.Host(name=name, ansible_host=str(known.get("ansible_host") or name),
                                  bind_address=str(known.get("sglang_bind_address") or ""))

            result["fleet"] = fleet.plan(config, [host(n) for n in args["engines"]], [host(n) for n in args["routers"]],
                                         args["max_unavailable"])
            # The installed fleet routers' units (router host -> unit text): a change of the replica count is refused.
            workers = {name: parse_router_unit(text)["workers"] for name, text in (args["installed"] or {}).items()}
            refused = fleet.replica_count_change(result["fleet"], workers)
            if refused:
                result.pop("fleet")
                result.update(failed=True, msg=refused)
        except spec.ConfigError as err:
            result.update(failed=True, msg="\n".join(err.problems), problems=list(err.problems))
        except ValueError as err:  # FleetError
            result.update(failed=True, msg=str(err))
        return result
