"""Command line: `python -m sgdeploy <command>`. A thin layer over the modules; exit codes:
0 success, 1 a check failed, 2 bad input (a config problem, a wrong argument)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sgdeploy import render, spec


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


def host_settings(config: spec.Config, args: argparse.Namespace) -> render.HostSettings:
    label = args.release or _release_label(config, args.patches_dir)
    return render.HostSettings(
        release_label=label,
        bind_address=args.bind_address or None,
        launcher=args.launcher or render.DEFAULT_LAUNCHER,
        release_root=args.release_root,
        service_user=getattr(args, "service_user", render.SERVICE_USER),
        env_dir=getattr(args, "env_dir", render.ENV_DIR),
    )


def service_url(config: spec.Config, host: render.HostSettings) -> str:
    address = render.bind_address(config, host)
    if ":" in address:
        address = f"[{address}]"
    elif address == "0.0.0.0":
        address = "127.0.0.1"
    return f"http://{address}:{config.serving.port}"


def cmd_render(args: argparse.Namespace) -> int:
    config = spec.load(args.config)
    host = host_settings(config, args)
    secrets = json.loads(args.secret_env_json) if args.secret_env_json else None
    rendered = render.render(config, host, secret_env=secrets)
    out_dir = Path(args.out) if args.out else Path("build/render") / config.name
    unit_path, env_path = render.write(rendered, out_dir)
    if not args.no_verify:
        try:
            render.verify(unit_path, rendered.argv[0])
        except render.VerifyError as exc:
            print(f"{unit_path}: systemd-analyze verify failed:\n{exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({
            "config": config.name, "unit_name": rendered.unit_name, "unit": str(unit_path),
            "env_name": rendered.env_name, "env": str(env_path), "release": host.release_label,
            "argv": list(rendered.argv), "digest": rendered.digest, "ports": list(config.ports),
            "gpus": list(config.serving.gpus), "bind_address": render.bind_address(config, host),
            "features": list(config.patch_features), "url": service_url(config, host),
            "speculative": config.speculative_enabled,
            "gates": config.gates.as_mapping(), "start_timeout_s": config.serving.start_timeout_s,
            "stop_timeout_s": config.serving.stop_timeout_s,
            "drain_timeout_s": config.serving.drain_timeout_s,
            "models": render.model_sources(config),
        }, indent=2))
    else:
        print(unit_path)
        print(env_path)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    """The gates of a config, run from the controller through an SSH tunnel to one host."""
    import tempfile

    from sgdeploy import gate, sweep

    config = spec.load(args.config)
    try:
        data = sweep.read_inventory(Path(args.inventory))
        name, hostvars = sweep.pick_host(data, Path(args.inventory), args.host)
    except sweep.UsageError as err:
        print(f"python -m sgdeploy gate: {err}", file=sys.stderr)
        return 2
    host = render.HostSettings(release_label="unused", bind_address=hostvars.get("sglang_bind_address") or None)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="sgdeploy-gate-") as f:
        json.dump({"config": config.name, "gates": config.gates.as_mapping(),
                   "speculative": config.speculative_enabled}, f)
        f.flush()
        extra = ["--only", "smoke"] if args.smoke_only else []
        return gate.main(["--url", service_url(config, host), "--config-json", f.name, "--via-ssh", name,
                          "--inventory", args.inventory, *extra])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sgdeploy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("config", help="print the fully merged config as YAML")
    p.add_argument("config", help="config name (configs/NAME.yml) or path to a YAML file")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("validate", help="validate configs (all of configs/ by default)")
    p.add_argument("configs", nargs="*")
    p.set_defaults(func=cmd_validate)

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
    p.add_argument("--no-verify", action="store_true", help="skip systemd-analyze verify")
    p.add_argument("--json", action="store_true", help="print a JSON description instead of paths")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("gate", help="run a config's gates from the controller through an SSH tunnel")
    p.add_argument("config")
    p.add_argument("--inventory", required=True)
    p.add_argument("--host", default=None, help="inventory host (default: the first of gpu_hosts)")
    p.add_argument("--smoke-only", action="store_true")
    p.set_defaults(func=cmd_gate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except spec.ConfigError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
