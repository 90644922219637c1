"""Action plugin sgdeploy.host.controller_rules: the Prometheus alert rules of the configs, made in-process.

Runs inside ansible-playbook on the controller (no connection to the host, no subprocess): loads the configs with
``sgdeploy.spec`` and renders their recording and alert rules with ``sgdeploy.monitoring_rules.render_rules``, the
text ``sgdeploy rules`` writes. The documentation is plugins/modules/controller_rules.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.plugin_utils.controller_action import ControllerAction

ARGUMENT_SPEC = {
    "configs": {"type": "list", "elements": "str", "default": []},
    "deployed": {"type": "list", "elements": "str", "default": []},
    "chdir": {"type": "path", "required": True},
    "time_scale": {"type": "int", "default": 1},
}


class ActionModule(ControllerAction):
    NAME = "controller_rules"
    MAKE_TARGET = "monitoring"

    def run(self, tmp=None, task_vars=None):
        result, args = self.start(tmp, task_vars, ARGUMENT_SPEC)
        loaded = self.sgdeploy(result, "monitoring_rules", "spec")
        if loaded is None:
            return result
        monitoring_rules, spec = loaded

        def resolve(name: str) -> str:  # a relative path is taken from chdir, as `sgdeploy` run there takes it
            return str(Path(args["chdir"]) / name) if spec.is_path(name) else name

        try:
            configs = monitoring_rules.load_configs(resolve(n) for n in (args["configs"] or spec.available()))
            skipped = []
            for name in dict.fromkeys(args["deployed"]):
                if name in configs:
                    continue
                try:
                    configs.update(monitoring_rules.load_configs([name]))
                except spec.ConfigError:
                    skipped.append(name)
            result["rules"] = monitoring_rules.render_rules(configs, args["time_scale"])
        except spec.ConfigError as err:
            result.update(failed=True, msg="\n".join(err.problems), problems=list(err.problems))
            return result
        except ValueError as err:
            result.update(failed=True, msg=str(err))
            return result
        result["configs"] = sorted(configs)
        result["not_found"] = skipped  # not "skipped": Ansible reads that key as a skipped task
        if skipped:
            result["warnings"] = [
                f"no alert rules for the deployed config(s) {', '.join(skipped)}: not found under configs/ by "
                "name; name their files in sglang_monitoring_alert_configs"]
        return result
