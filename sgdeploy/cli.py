"""The `sgdeploy` command: every controller-side entry point of the project, one subcommand each.

    sgdeploy config|validate|render CONFIG ...   the config and its unit (sgdeploy.spec, sgdeploy.render)
    sgdeploy schema [--out FILE]                 write the config's JSON Schema (docs/config.schema.json)
    sgdeploy gate CONFIG --inventory INV         a config's gates, through an SSH tunnel to one host
    sgdeploy tunnel CONFIG --inventory INV       forward a local port to a host's service, until Ctrl-C
    sgdeploy hosts --inventory INV [--limit P]   the hosts of gpu_hosts a play would target (none: exit 2)
    sgdeploy wheel|sweep|bench|records|patchwork  the modules' own command lines (sgdeploy.wheel, ...)
    sgdeploy report DIR                          rewrite a sweep report's results.md and sweep.png
    sgdeploy rules [CONFIG ...] [-o FILE]        Prometheus recording and alert rules from the configs' gates

A thin layer over the modules (tests call their functions directly). Exit codes: 0 success, 1 a
check failed, 2 bad input (a config problem, a wrong argument), with one line naming the problem.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from sgdeploy import __version__, controller, models, render, spec

PROG = "sgdeploy"
HOST_GROUP = "gpu_hosts"  # the group every play that touches hosts targets


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line `sgdeploy SUB: message`, exit 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _module_main(module: str) -> Callable[[list[str]], int]:
    """A module's own command line, run as `sgdeploy <name> ...` (imported when called)."""

    def run(argv: list[str]) -> int:
        import importlib

        return importlib.import_module(f"sgdeploy.{module}").main(argv)

    return run


# Subcommands whose arguments the module's own parser reads (its --help lists them).
DELEGATED: dict[str, tuple[str, str]] = {
    "wheel": ("wheel", "build the patched SGLang wheel of a config's patch set (sgdeploy.wheel)"),
    "sweep": ("sweep", "sweep a DDTREE config over budgets and top-k caps on one host (sgdeploy.sweep)"),
    "bench": ("bench", "the fixed greedy benchmark against a service URL (sgdeploy.bench)"),
    "records": ("records", "read or write deploy records in a folder (sgdeploy.records)"),
    "exactness": ("exactness", "the exactness gate's target-alone config, comparison, collection (sgdeploy.exactness)"),
    "patchwork": ("patchwork", "lay out the series in build/patchwork/ or write a diff back (sgdeploy.patchwork)"),
}


def _absolute(option: str):
    """An argparse type: an absolute folder without `..`, spaces or control characters (it reaches the unit)."""
    def parse(text: str) -> str:
        try:
            return controller.absolute_folder(option, text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return parse


def _release_label(config: spec.Config, patches_dir: Path | None) -> str:
    from sgdeploy import patchset

    kwargs = {"patches_dir": patches_dir} if patches_dir else {}
    return patchset.release_label(patchset.select(config.patch_features, **kwargs))


def cmd_config(args: argparse.Namespace) -> int:
    config = spec.load(args.config)
    sys.stdout.write(spec.to_yaml(config))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    problems: list[str] = []
    names = args.configs or spec.available()
    for name in names:
        try:
            spec.load(name)
        except spec.ConfigError as exc:
            problems.extend(exc.problems)
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"{len(names)} config(s) valid: {', '.join(names)}")
    return 2 if problems else 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Write the JSON Schema of a config (sgdeploy.config_model), for editors; configs/*.yml name it."""
    from sgdeploy import config_model

    out = Path(args.out)
    try:
        out.write_text(config_model.json_schema())
    except OSError as err:
        raise UsageError(f"{out}: cannot write: {err.strerror}") from None
    print(out)
    return 0


def host_settings(config: spec.Config, args: argparse.Namespace) -> render.HostSettings:
    label = args.release or _release_label(config, args.patches_dir)
    return render.HostSettings(
        release_label=label,
        bind_address=args.bind_address or None,
        launcher=args.launcher or render.DEFAULT_LAUNCHER,
        release_root=args.release_root,
        service_user=getattr(args, "service_user", render.SERVICE_USER),
        env_dir=getattr(args, "env_dir", render.ENV_DIR),
        models_root=getattr(args, "models_root", models.MODELS_ROOT),
        # An engine over several hosts (docs/multinode.md): rank 0 by default, joined at its own bind address.
        node_rank=getattr(args, "node_rank", 0),
        dist_init_address=getattr(args, "dist_init_address", "") or None,
    )


def cmd_render(args: argparse.Namespace) -> int:
    config = spec.load(args.config)
    host = host_settings(config, args)
    secrets = json.loads(args.secret_env_json) if args.secret_env_json else None
    try:
        d = controller.describe(config, host, replica=args.replica, out_dir=Path(args.out) if args.out else None,
                              verify=not args.no_verify, secret_env=secrets)
    except ValueError as exc:  # ReplicaError, a rank outside serving.nnodes
        raise UsageError(str(exc)) from None
    except render.VerifyError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(d["unit"])
        print(d["env"])
    return 0


class UsageError(Exception):
    """A wrong argument found after parsing: `sgdeploy SUB: message`, exit 2."""


def _config_and_host(args: argparse.Namespace) -> tuple[spec.Config, str, dict]:
    """The config and the inventory host a controller-side command talks to (--host, or the first
    of gpu_hosts) with its variables. Raises UsageError, spec.ConfigError."""
    from sgdeploy import sweep

    config = spec.load(args.config)
    target_hosts(args.inventory, args.host, limit_name="--host")
    try:
        data = sweep.read_inventory(Path(args.inventory))
        name, hostvars = sweep.pick_host(data, Path(args.inventory), args.host)
    except sweep.UsageError as err:
        raise UsageError(str(err)) from None
    return config, name, hostvars


def _ansible_bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def _parse_failure(stderr: str, inventory: str) -> str:
    """The reason Ansible gives for not parsing an inventory, in one line: the yaml plugin's for a
    .yml/.yaml file, the ini plugin's otherwise, else the first plugin's."""
    reasons = dict(re.findall(r"^\[WARNING\]: Failed to parse inventory with '(\w+)' plugin: (.*)$", stderr, re.M))
    preferred = ("yaml",) if inventory.endswith((".yml", ".yaml")) else ("ini",)
    for plugin in (*preferred, *reasons):
        if plugin in reasons:
            where = re.search(r"^Origin: (\S+:\d+:\d+)$", stderr, re.M)
            reason = reasons[plugin].strip()
            # Ansible names a type by its internal class: "got: <class '..._AnsibleTaggedList'>" says "got: a list".
            reason = re.sub(r"<class '(?:[\w.]*\.)?(?:_AnsibleTagged)?(\w+)'>", lambda m: "a " + m.group(1).lower(),
                            reason)
            return f"{reason} ({where.group(1)})" if where and plugin == "yaml" and "YAML parsing" in reason else reason
    lines = [line for line in stderr.splitlines() if line.startswith("[ERROR]")]
    return lines[-1].removeprefix("[ERROR]: ") if lines else "no inventory plugin could read it"


def target_hosts(inventory: str, limit: str | None = None, group: str = HOST_GROUP,
                 limit_name: str = "limit") -> list[str]:
    """The hosts of ``group`` in ``inventory`` that a play on ``group`` under ``--limit limit`` targets,
    as Ansible matches them (``ansible-inventory --list --limit``). UsageError, in one line naming the
    inventory or the limit pattern, when the inventory is missing or unparsable, the group has no host,
    or the limit (or one of its comma-separated patterns) matches no host of the group."""
    example = f"an Ansible inventory that lists the hosts in group {group}, as inventory/example.yml does"
    if not inventory:
        raise UsageError(f"inventory '': give {example}")
    if not Path(inventory).exists():
        raise UsageError(f"inventory {inventory}: no such file or folder; give {example}")
    env = dict(os.environ, ANSIBLE_INVENTORY_UNPARSED_FAILED="True", ANSIBLE_HOST_PATTERN_MISMATCH="warning",
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    cmd = [_ansible_bin("ansible-inventory"), "-i", inventory, "--list"]
    proc = subprocess.run(cmd + (["--limit", limit] if limit else []), capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, check=False)
    try:
        data = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UsageError(f"inventory {inventory}: Ansible cannot parse it: {_parse_failure(proc.stderr, inventory)}")
    hosts = _group_hosts(data, group)
    if limit:
        unmatched = re.findall(r"^\[WARNING\]: Could not match supplied host pattern, ignoring: (.*)$",
                               proc.stderr, re.M)
        if unmatched or not hosts:
            # What the group holds without the limit, to name in the message.
            every = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                                   check=False)
            try:
                listed = _group_hosts(json.loads(every.stdout), group)
            except ValueError:
                listed = []
            there = f"hosts of {group} there: {', '.join(listed)}" if listed else f"group {group} there has no host"
            part = (f": '{unmatched[0]}' matches no host" if unmatched and unmatched[0] != limit
                    else " matches no host" if unmatched else f" matches no host of group {group}")
            raise UsageError(f"{limit_name} '{limit}'{part} in {inventory} ({there})")
    elif not hosts:
        raise UsageError(f"inventory {inventory}: group {group} has no host; give {example}")
    return hosts


def _group_hosts(data: dict, group: str) -> list[str]:
    """The hosts of ``group`` and its children in ``ansible-inventory --list`` output (the sweep's own walk)."""
    from sgdeploy import sweep

    return sweep.group_hosts(data, group)


def cmd_hosts(args: argparse.Namespace) -> int:
    """Check, before a play runs, that it has hosts to run on; print them one a line (unless --quiet)."""
    hosts = target_hosts(args.inventory, args.limit or None, args.group, args.limit_name)
    if not args.quiet:
        print("\n".join(hosts))
    return 0


def _host_service_url(config: spec.Config, hostvars: dict) -> str:
    host = render.HostSettings(release_label="unused", bind_address=hostvars.get("sglang_bind_address") or None)
    return controller.service_url(config, host)


def cmd_gate(args: argparse.Namespace) -> int:
    """The gates of a config, run from the controller through an SSH tunnel to one host."""
    import tempfile

    from sgdeploy import gate

    config, name, hostvars = _config_and_host(args)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="sgdeploy-gate-") as f:
        json.dump({"config": config.name, "gates": config.gates.as_mapping(),
                   "speculative": config.speculative_enabled}, f)
        f.flush()
        extra = ["--only", "smoke"] if args.smoke_only else []
        return gate.main(["--url", _host_service_url(config, hostvars), "--config-json", f.name, "--via-ssh", name,
                          "--inventory", args.inventory, *extra])


def cmd_tunnel(args: argparse.Namespace) -> int:
    """Forward a local port to a config's service on one host (it binds to the host's loopback), until Ctrl-C,
    SIGTERM or ``--seconds``.

    Both signals are handled here, not left to Python's default: a process started in the background by a
    non-interactive shell (a script's ``cmd &``, CI) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt, so Ctrl-C (or a supervisor's SIGINT) did nothing and the tunnel ran out its seconds
    (lab CI check, 2026-12-05: test_cli's tunnel tests timed out waiting for the exit)."""
    import signal
    import threading
    from urllib.parse import urlsplit

    from sgdeploy import tunnel

    config, name, hostvars = _config_and_host(args)
    remote = urlsplit(_host_service_url(config, hostvars))

    def close(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, close)
    try:
        with tunnel.forward(tunnel.Target.from_hostvars(name, hostvars), remote.port or 80,
                            remote_host=remote.hostname or "127.0.0.1", local_port=args.local_port) as url:
            print(f"{url} -> {name} -> {remote.geturl()} ({config.name}); Ctrl-C closes it", flush=True)
            threading.Event().wait(args.seconds)
    except tunnel.TunnelError as err:
        print(f"{PROG} tunnel: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Rewrite results.md and sweep.png of a sweep report from its results.json."""
    from sgdeploy import report

    path = Path(args.dir)
    path = path / "results.json" if path.is_dir() else path
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        print(f"{PROG} report: {path}: cannot read a sweep's results.json: {err}", file=sys.stderr)
        return 2
    if not isinstance(results, dict) or results.get("schema") != 1 or not isinstance(results.get("variants"), list):
        print(f"{PROG} report: {path}: not a sweep report (results.json of schema 1 with variants; docs/sweep.md)",
              file=sys.stderr)
        return 2
    out = report.write(results, path.parent)
    for key in ("md", "png"):
        print(out[key])
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    """The Prometheus rule file (sgdeploy.monitoring_rules) for the named configs, default all of configs/."""
    from sgdeploy import monitoring_rules

    try:
        configs = monitoring_rules.load_configs(args.configs or spec.available())
        text = monitoring_rules.render_rules(configs, args.time_scale)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not args.out:
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as err:
        raise UsageError(f"{out}: cannot write: {err.strerror}") from None
    print(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("config", help="print the fully merged config as YAML")
    p.add_argument("config", help="config name (configs/NAME.yml) or path to a YAML file")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("validate", help="validate configs (all of configs/ by default)")
    p.add_argument("configs", nargs="*")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("schema", help="write the JSON Schema of a config, for editors (docs/config.schema.json)")
    p.add_argument("--out", default=str(spec.REPO_ROOT / "docs" / "config.schema.json"),
                   help="the file to write (default docs/config.schema.json)")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("render", help="render the unit and environment file of a config")
    p.add_argument("config")
    p.add_argument("--out", help="output folder (default build/render/<config>)")
    p.add_argument("--release", help="release label (default: from the config's patch set)")
    p.add_argument("--patches-dir", type=Path, default=None)
    p.add_argument("--release-root", default=render.RELEASE_ROOT)
    p.add_argument("--bind-address", default="", help="override serving.host (the lab does)")
    p.add_argument("--launcher", default="", help=f"what the release python runs (default "
                   f"'{render.DEFAULT_LAUNCHER}')")
    p.add_argument("--secret-env-json", default="", help=argparse.SUPPRESS)
    p.add_argument("--service-user", default=render.SERVICE_USER, help="the service account (User=, Group=)")
    p.add_argument("--env-dir", default=render.ENV_DIR, help="folder of the env file on the host")
    p.add_argument("--models-root", default=models.MODELS_ROOT, type=_absolute("--models-root"),
                   help=f"folder of the hf and controller models on the host (default {models.MODELS_ROOT})")
    p.add_argument("--no-verify", action="store_true", help="skip systemd-analyze verify")
    p.add_argument("--json", action="store_true", help="print a JSON description instead of paths")
    p.add_argument("--replica", type=int, default=None, help="only this replica (from 0) of a config with the router; "
                   "--json then describes it as its own deploy, <config>-r<i>")
    p.add_argument("--node-rank", type=int, default=0, help="with serving.nnodes > 1: this host's rank (default 0; "
                   "docs/multinode.md)")
    p.add_argument("--dist-init-address", default="", help="with serving.nnodes > 1: rank 0's address the other "
                   "ranks join (default: the bind address)")
    p.set_defaults(func=cmd_render)

    def host_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("config")
        p.add_argument("--inventory", required=True)
        p.add_argument("--host", default=None, help="inventory host (default: the first of gpu_hosts)")

    p = sub.add_parser("gate", help="run a config's gates from the controller through an SSH tunnel")
    host_args(p)
    p.add_argument("--smoke-only", action="store_true")
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("tunnel", help="forward a local port to a config's service on one host, until Ctrl-C")
    host_args(p)
    p.add_argument("--local-port", type=int, default=None, help="local port (default: a free one)")
    p.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)  # tests: close after this
    p.set_defaults(func=cmd_tunnel)

    p = sub.add_parser("hosts", help=f"the hosts of {HOST_GROUP} a play would target; none, or an inventory that "
                       "cannot be read, is exit 2 with one line")
    p.add_argument("--inventory", required=True, help="Ansible inventory (file or folder)")
    p.add_argument("--limit", default="", help="an Ansible --limit pattern (make's LIMIT=, HOST=)")
    p.add_argument("--group", default=HOST_GROUP, help=f"the group the play targets (default {HOST_GROUP})")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing when there are hosts")
    p.add_argument("--limit-name", default="limit", help=argparse.SUPPRESS)  # how the message names it (LIMIT, HOST)
    p.set_defaults(func=cmd_hosts)

    p = sub.add_parser("report", help="rewrite a sweep report's results.md and sweep.png from its results.json")
    p.add_argument("dir", help="the sweep's report folder (reports/sweeps/<id>) or its results.json")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("rules", help="write the Prometheus recording and alert rules of configs "
                       "(all of configs/ by default; docs/monitoring.md, Alert rules)")
    p.add_argument("configs", nargs="*", metavar="CONFIG", help="config names (configs/NAME.yml) or YAML paths")
    p.add_argument("-o", "--out", default="", help="the rule file to write (default: standard output)")
    p.add_argument("--time-scale", type=int, default=1, metavar="N",
                   help="divide every window and duration by N, e.g. 10 for a lab test (default 1: as documented)")
    p.set_defaults(func=cmd_rules)

    for name, (_module, text) in DELEGATED.items():
        sub.add_parser(name, help=f"{text}; `{PROG} {name} --help` for its arguments", add_help=False)
    return parser


def _check_sweep_hosts(argv: list[str]) -> None:
    """A sweep's inventory and host, checked as every command that touches hosts checks them (its own
    parser reads the rest; without --inventory, or with --help, it says what is missing)."""
    if {"-h", "--help"} & set(argv):
        return
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--inventory")
    parser.add_argument("--host")
    known, _rest = parser.parse_known_args(argv)
    if known.inventory is not None:
        target_hosts(known.inventory, known.host, limit_name="--host")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DELEGATED:
            if argv[0] == "sweep":
                try:
                    _check_sweep_hosts(argv[1:])
                except UsageError as err:
                    print(f"{PROG} sweep: {err}", file=sys.stderr)
                    return 2
            return _module_main(DELEGATED[argv[0]][0])(argv[1:])
        args = build_parser().parse_args(argv)
        try:
            return args.func(args)
        except UsageError as err:
            print(f"{PROG} {args.command}: {err}", file=sys.stderr)
            return 2
    except spec.ConfigError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
