"""The gates' command line (``sgdeploy gate``) and their thresholds from the config schema.

The gates themselves (smoke, exactness, throughput, acceptance, the report) are one implementation,
``sglang_gate`` in the sgdeploy.host collection's module_utils: the deploy runs them on the host
through the ``sgdeploy.host.sglang_gate`` module, and this command imports the same code (the
installed ``sgdeploy`` package carries the module_utils). What stays here is the controller's: the
thresholds with the defaults and checks of the config schema (``sgdeploy.gate_schema``), reading files
named on the command line, and the SSH tunnel. See docs/gates.md.

Command line (exit 0 all gates pass, 1 a gate failed or was inconclusive, 2 misuse)::

    python -m sgdeploy.gate --url URL (--config-json FILE | --thresholds-json STRING)
        [--speculative | --no-speculative] [--baseline RECORD.json] [--out REPORT.json]
        [--only smoke|exactness|throughput|acceptance ...] [--bench-timeout S] [--json]
        [--references DIR [--host NAME] [--exactness-report-only]]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate as _gates
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_gate import (  # noqa: F401
    ALL_GATES,
    FAIL,
    GATES,
    INCONCLUSIVE,
    PASS,
    ExactnessTarget,
    GateError,
    GateReport,
    GateResult,
    _judge,
    _num,
    acceptance,
    exactness_gate,
    garbled,
    record_reference,
    run_all,
    smoke,
    throughput,
)

from sgdeploy import exactness, gate_schema, records, serving


class GateThresholds(_gates.GateThresholds):
    """The config's ``gates`` mapping with the config schema's defaults (``sgdeploy.gate_schema``): what the
    gates read, built on the controller. ``GateThresholds(key=value, ...)`` sets some keys, the rest take
    their defaults; ``from_mapping`` also checks the values."""

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(gate_schema.FIELDS))
        if unknown:
            raise TypeError(f"GateThresholds: unknown setting {unknown[0]!r}")
        super().__init__({**gate_schema.DEFAULTS, **values})

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> GateThresholds:
        """Build from a mapping (missing keys take the defaults); GateError names a bad key or value."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise GateError(f"gates must be a mapping of names to values, not {type(data).__name__}")
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in gate_schema.FIELDS:
                raise GateError(f"gates.{key}: unknown setting; allowed: {', '.join(gate_schema.FIELDS)}")
            try:
                values[key] = gate_schema.check(key, value)
            except ValueError as err:
                raise GateError(f"gates.{key}: {value!r} is not allowed; {err}") from None
        return cls(**values)


# --- command line -------------------------------------------------------------------------------------------

def load_thresholds(config_json: str | None,
                    thresholds_json: str | None) -> tuple[GateThresholds, bool | None]:
    """Thresholds from a config JSON file (``{"gates": {...}, "speculative": ...}`` as written by
    ``python -m sgdeploy render --json``, or a bare gates mapping) or an inline JSON string. Also
    returns what the file says about speculation (None when it says nothing)."""
    if config_json is not None:
        source = f"--config-json {config_json}"
        data = records.read_json(config_json, source, GateError)
    else:
        assert thresholds_json is not None  # main's argument group requires --config-json or --thresholds-json
        try:
            data = json.loads(thresholds_json)
        except ValueError as err:
            raise GateError(f"--thresholds-json {thresholds_json!r}: not JSON ({err})") from None
        source = "--thresholds-json"
    if not isinstance(data, dict):
        raise GateError(f"{source}: expected a JSON object, not {type(data).__name__}")
    speculative = None
    if "gates" in data:
        spec = data.get("speculative")
        if isinstance(spec, bool):
            speculative = spec
        elif isinstance(spec, dict) and isinstance(spec.get("algorithm"), str):
            speculative = spec["algorithm"].upper() != "NONE"
        data = data["gates"]
    try:
        return GateThresholds.from_mapping(data), speculative
    except GateError as err:
        raise GateError(f"{source}: {err}") from None


def _exactness_target(args: argparse.Namespace) -> ExactnessTarget:
    """References folder and model from ``--references`` and the deploy description (``--config-json``)."""
    if not args.config_json:
        raise GateError("--references needs --config-json with the deploy description (its models name the target)")
    data = records.read_json(args.config_json, f"--config-json {args.config_json}", GateError)
    return ExactnessTarget(args.references, exactness.model_identity(data), str(data.get("config") or "?"),
                           args.host, data.get("release"))


def main(argv: list[str] | None = None) -> int:
    parser = serving._Parser(prog="python -m sgdeploy.gate", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="http://HOST:PORT of the service")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-json", metavar="FILE", help="config JSON with a gates mapping")
    src.add_argument("--thresholds-json", metavar="STRING", help="the gates mapping as a JSON string")
    parser.add_argument("--speculative", action=argparse.BooleanOptionalAction, default=None,
                        help="the config uses speculative decoding (default: what --config-json says)")
    parser.add_argument("--baseline", metavar="RECORD.json", help="the last good deploy record")
    parser.add_argument("--out", metavar="REPORT.json", help="write the report as JSON here")
    parser.add_argument("--only", action="append", choices=ALL_GATES, help="run only this gate (repeatable)")
    parser.add_argument("--references", metavar="DIR", help="the host's exactness references folder: a speculative "
                        "config is compared with its model's reference there, a non-speculative one records it")
    parser.add_argument("--host", metavar="NAME", default="?", help="the host's name (in references and messages)")
    parser.add_argument("--exactness-report-only", action="store_true",
                        help="record the exactness verdict without letting it fail the gates (the sweep's variants)")
    parser.add_argument("--bench-timeout", type=serving._positive(float), default=600.0,
                        help="seconds for the bench run (default 600)")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
    parser.add_argument("--via-ssh", metavar="HOST", help="run from the controller: reach --url as HOST sees it "
                        "through an SSH tunnel (the service binds to loopback); needs --inventory")
    parser.add_argument("--inventory", metavar="INV", help="the Ansible inventory that names HOST (with --via-ssh)")
    args = parser.parse_args(argv)
    if args.via_ssh:
        if not args.inventory:
            print(f"{parser.prog}: --via-ssh {args.via_ssh} needs --inventory", file=sys.stderr)
            return 2
        return _via_ssh(parser, args, argv)
    try:
        url = serving.check_url(args.url)
        thresholds, file_speculative = load_thresholds(args.config_json, args.thresholds_json)
        speculative = args.speculative if args.speculative is not None else file_speculative
        if speculative is None:
            raise GateError("say --speculative or --no-speculative (the thresholds do not say which)")
        baseline = records.read_record(args.baseline) if args.baseline else None
        target = _exactness_target(args) if args.references else None
        if args.out and not Path(args.out).resolve().parent.is_dir():
            raise GateError(f"--out {args.out}: its folder does not exist")
    except (GateError, serving.UsageError, records.RecordError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    report = run_all(url, thresholds, speculative, baseline, args.only, bench_timeout=args.bench_timeout,
                     exactness_target=target, exactness_enforced=not args.exactness_report_only)
    data = report.to_dict()
    if args.out:
        records.write_json(args.out, data)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print("\n".join(report.lines()))
    return 0 if report.passed else 1


def _via_ssh(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> int:
    """Open a tunnel to the service as the host sees it, then run the gates on the local end.

    Controller only (Fabric is not on the hosts): imported here so the host-side copy of this
    module keeps to the standard library.
    """
    from urllib.parse import urlsplit

    from sgdeploy import sweep, tunnel

    try:
        url = serving.check_url(args.url)
        parts = urlsplit(url)
        data = sweep.read_inventory(Path(args.inventory))
        name, hostvars = sweep.pick_host(data, Path(args.inventory), args.via_ssh)
    except (serving.UsageError, sweep.UsageError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    rest, skip = [], False
    for arg in (argv if argv is not None else sys.argv[1:]):
        if skip:
            skip = False
            continue
        if arg in ("--via-ssh", "--inventory", "--url"):
            skip = True
            continue
        if arg.startswith(("--via-ssh=", "--inventory=", "--url=")):
            continue
        rest.append(arg)
    try:
        with tunnel.forward(tunnel.Target.from_hostvars(name, hostvars), parts.port or 80,
                            remote_host=parts.hostname or "127.0.0.1") as local_url:
            print(f"gates through an SSH tunnel: {local_url} -> {name} -> {url}", file=sys.stderr)
            return main(["--url", local_url, *rest])
    except tunnel.TunnelError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
