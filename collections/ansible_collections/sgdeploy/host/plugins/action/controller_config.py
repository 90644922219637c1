"""Action plugin sgdeploy.host.controller_config: what a play asks of the controller's Python, in-process.

Runs inside ansible-playbook on the controller (no connection to the host, no subprocess): loads and validates a
config with ``sgdeploy.spec``, and renders it for a host with ``sgdeploy.controller.describe`` when asked. Replaces
``command: python -m sgdeploy render|config ...`` + ``from_json`` (issue 35, "one crossing"). The documentation
is plugins/modules/controller_config.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.plugin_utils.controller_action import ControllerAction

RENDER_SPEC = {
    "release": {"type": "str", "required": True},
    "bind_address": {"type": "str", "default": ""},
    "launcher": {"type": "str", "default": ""},
    "release_root": {"type": "str"},
    "service_user": {"type": "str"},
    "env_dir": {"type": "str"},
    "models_root": {"type": "str"},
    "out": {"type": "path", "required": True},
    "replica": {"type": "int"},
    "verify": {"type": "bool", "default": False},
    "node_rank": {"type": "int"},
    "dist_init_address": {"type": "str"},
}

ARGUMENT_SPEC = {
    "config": {"type": "str", "required": True},
    "chdir": {"type": "path", "required": True},
    "render": {"type": "dict", "options": RENDER_SPEC},
}


class ActionModule(ControllerAction):
    NAME = "controller_config"
    MAKE_TARGET = "deploy"

    def run(self, tmp=None, task_vars=None):
        result, args = self.start(tmp, task_vars, ARGUMENT_SPEC)
        loaded = self.sgdeploy(result, "controller", "render", "spec")
        if loaded is None:
            return result
        controller, render, spec = loaded
        try:
            # A relative path is taken from chdir, as `sgdeploy` run there would take it; a name stays a name.
            name = args["config"]
            config = spec.load(str(Path(args["chdir"]) / name) if spec.is_path(name) else name)
            result["config"] = controller.merged(config)
            result["name"] = config.name
            wanted = args.get("render")
            if wanted:
                if wanted.get("models_root"):
                    wanted["models_root"] = controller.absolute_folder("models_root", wanted["models_root"])
                host = render.HostSettings(
                    release_label=wanted["release"], bind_address=wanted["bind_address"] or None,
                    launcher=wanted["launcher"] or render.DEFAULT_LAUNCHER,
                    node_rank=wanted.get("node_rank"), dist_init_address=wanted.get("dist_init_address") or None,
                    **{k: wanted[k] for k in ("release_root", "service_user", "env_dir", "models_root")
                       if wanted.get(k)})
                result["rendered"] = controller.describe(config, host, replica=wanted.get("replica"),
                                                         out_dir=Path(wanted["out"]), verify=wanted["verify"])
        except spec.ConfigError as err:
            result.update(failed=True, msg="\n".join(err.problems), problems=list(err.problems))
        except (ValueError, render.VerifyError, OSError) as err:  # ReplicaError and a bad folder are ValueErrors
            result.update(failed=True, msg=str(err))
        return result
