"""What the collection's controller-side action plugins share (controller_config, controller_wheel,
controller_model_pack, controller_records): they run inside ansible-playbook on the controller, never connect to a
host, and call the project's ``sgdeploy`` package in-process (docs/design.md, "One crossing")."""

from __future__ import annotations

import importlib

from ansible.plugins.action import ActionBase


class ControllerAction(ActionBase):
    """An action that needs no connection; ``start`` checks the arguments, ``sgdeploy`` imports the package's modules
    or says in one line why they do not import."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    NAME = ""  # sgdeploy.host.<NAME>, as the failure line names it
    MAKE_TARGET = "deploy"  # the make target the failure line tells the user to run from the project's virtualenv

    def start(self, tmp, task_vars, argument_spec):
        """(result with changed False, the validated arguments)."""
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=argument_spec)
        result["changed"] = False
        return result, args

    def sgdeploy(self, result, *names):
        """The modules ``sgdeploy.<name>``, or None with ``result`` failed and the reason in its msg."""
        try:
            return [importlib.import_module(f"sgdeploy.{name}") for name in names]
        except ImportError as err:
            result.update(failed=True, msg=f"sgdeploy.host.{self.NAME}: the project's Python package sgdeploy "
                                           f"does not import in ansible-playbook's interpreter ({err}); run Ansible "
                                           f"from the project's virtualenv (make setup, then make {self.MAKE_TARGET})")
            return None
