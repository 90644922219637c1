"""Action plugin sgdeploy.host.controller_model_pack: pack a controller model folder once, in-process.

Runs inside ansible-playbook on the controller (no connection to the host, no subprocess of sgdeploy): tars a
folder of a ``source: controller`` model with ``sgdeploy.models.pack`` (its files, relative, owned by root) into
the controller's cache, once. Replaces ``command: python -m sgdeploy.models pack ...`` (issue 35, "one
crossing"). The documentation is plugins/modules/controller_model_pack.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = {
    "src": {"type": "path", "required": True},
    "out": {"type": "path", "required": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        # A cache on the controller, not a change of the host: never reported as changed.
        result["changed"] = False
        src, out = Path(args["src"]), Path(args["out"])
        result["tar"] = str(out)
        try:
            from sgdeploy import models
        except ImportError as err:
            result.update(failed=True, msg=f"sgdeploy.host.controller_model_pack: the project's Python package "
                                           f"sgdeploy does not import in ansible-playbook's interpreter ({err}); run "
                                           "Ansible from the project's virtualenv (make setup, then make deploy)")
            return result
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
