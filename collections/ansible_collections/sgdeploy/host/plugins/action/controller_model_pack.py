"""Action plugin sgdeploy.host.controller_model_pack: pack a controller model folder once, in-process.

Runs inside ansible-playbook on the controller (no connection to the host, no subprocess of sgdeploy): tars a
folder of a ``source: controller`` model with ``sgdeploy.models.pack`` (its files, relative, owned by root) into
the controller's cache, once. Replaces ``command: python -m sgdeploy.models pack ...`` (issue 35, "one
crossing"). The documentation is plugins/modules/controller_model_pack.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.plugin_utils.controller_action import ControllerAction

ARGUMENT_SPEC = {
    "src": {"type": "path", "required": True},
    "out": {"type": "path", "required": True},
}


class ActionModule(ControllerAction):
    NAME = "controller_model_pack"
    MAKE_TARGET = "deploy"

    def run(self, tmp=None, task_vars=None):
        # A cache on the controller, not a change of the host: never reported as changed (start sets False).
        result, args = self.start(tmp, task_vars, ARGUMENT_SPEC)
        src, out = Path(args["src"]), Path(args["out"])
        result["tar"] = str(out)
        loaded = self.sgdeploy(result, "models")
        if loaded is None:
            return result
        (models,) = loaded
        if not src.is_dir():
            result.update(failed=True, msg=f"src: {src}: no such folder")
            return result
        if self._task.check_mode:
            result["packed"] = False
            return result
        try:
            result["packed"] = models.pack(src, out)
        except OSError as err:
            result.update(failed=True, msg=f"pack: {err.strerror or err}: {err.filename or ''}".rstrip(": "))
        return result
