"""Action plugin sgdeploy.host.controller_wheel: the patched SGLang wheel of a config, built in-process.

Runs inside ansible-playbook on the controller (no connection to the host, no subprocess of sgdeploy): builds
(or finds) the wheel of a config's patch set for one Python with ``sgdeploy.wheel.build_for`` and returns what
``sgdeploy wheel --config ... --json`` prints. Replaces ``command: python -m sgdeploy.wheel ... --json`` +
``from_json`` (issue 35, "one crossing"). The documentation is plugins/modules/controller_wheel.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible.utils.display import Display
from ansible_collections.sgdeploy.host.plugins.plugin_utils.controller_action import ControllerAction

display = Display()

ARGUMENT_SPEC = {
    "config": {"type": "str", "required": True},
    "chdir": {"type": "path", "required": True},
    "python": {"type": "str", "required": True},
    "index_url": {"type": "str", "default": ""},
}


class ActionModule(ControllerAction):
    NAME = "controller_wheel"
    MAKE_TARGET = "deploy"

    def run(self, tmp=None, task_vars=None):
        result, args = self.start(tmp, task_vars, ARGUMENT_SPEC)
        loaded = self.sgdeploy(result, "patchset", "spec", "wheel")
        if loaded is None:
            return result
        patchset, spec, wheel = loaded
        log: list[str] = []

        def say(line: str) -> None:
            log.append(line)
            display.vv(f"sgdeploy.host.controller_wheel: {line}")

        # A relative path is taken from chdir, as `sgdeploy wheel` run there would take it; a name stays a name.
        name = args["config"]
        config = str(Path(args["chdir"]) / name) if spec.is_path(name) else name
        try:
            # Check mode builds too: it writes only build/wheels/ and build/downloads/ on the controller, and a
            # plan needs the wheel's label and recorded digest (docs/build.md).
            built = wheel.build_for(config, args["python"], index_url=args["index_url"] or None, log=say)
        except (wheel.UsageError, wheel.BuildError, patchset.PatchSetError) as err:
            result.update(failed=True, msg=str(err), log=log)
            return result
        except OSError as err:
            result.update(failed=True, msg=f"building the wheel of {name}: {err}", log=log)
            return result
        result.update(built.as_json(), changed=built.built, log=log)
        return result
