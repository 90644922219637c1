"""Action plugin sgdeploy.host.controller_records: the table of ``make status``, made in-process on the controller.

Runs inside ansible-playbook (no connection to the host, no subprocess): reads the records and the hosts' state
that playbooks/status.yml collected on the controller with ``sgdeploy.records.collect`` and makes the table with
``sgdeploy.records.status_report``, the text ``python -m sgdeploy.records status`` prints. Replaces
``command: python -m sgdeploy.records status ...`` (issue 35, "one crossing"). The documentation is
plugins/modules/controller_records.py.
"""

from __future__ import annotations

from ansible_collections.sgdeploy.host.plugins.plugin_utils.controller_action import ControllerAction

ARGUMENT_SPEC = {
    "records_dir": {"type": "path", "required": True},
    "now_dir": {"type": "path"},
    "hosts": {"type": "list", "elements": "str"},
    "all": {"type": "bool", "default": False},
}


class ActionModule(ControllerAction):
    NAME = "controller_records"
    MAKE_TARGET = "status"

    def run(self, tmp=None, task_vars=None):
        result, args = self.start(tmp, task_vars, ARGUMENT_SPEC)
        loaded = self.sgdeploy(result, "records")
        if loaded is None:
            return result
        (records,) = loaded
        try:
            found, now, unreadable = records.collect(args["records_dir"], args["now_dir"], args["hosts"])
        except records.RecordError as err:
            result.update(failed=True, msg=str(err))
            return result
        result["lines"] = records.status_report(found, now, args["all"]).splitlines()
        result["unanswered"] = [host for host, state in (now or {}).items() if state is None]
        if unreadable:
            result["warnings"] = [f"left out of the status table: {line}" for line in unreadable]
        return result
