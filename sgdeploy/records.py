"""Deploy records: one JSON file per deploy attempt, what it deployed, its gates and its outcome.

The records themselves are built, written and read by ``sglang_deploy_records`` in the collection's
module_utils, the code the host's record and gate modules run (``sgdeploy.host_code``; one
implementation, docs/gates.md); this module is its command line on the controller.

Command line (exit 0 done, 1 nothing found, 2 misuse)::

    python -m sgdeploy.records status DIR [--all] [--json]
    python -m sgdeploy.records last-good DIR --config NAME --host HOST [--json]
    python -m sgdeploy.records write DIR --config NAME --host HOST --outcome OUTCOME
        (--release LABEL | --release-json FILE) [--report REPORT.json] [--started ISO]
        [--config-digest D] [--unit-digest D] [--rollback-json JSON] [--message TEXT] [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_records import (  # noqa: F401
    KEYS,
    OUTCOMES,
    SCHEMA,
    RecordError,
    build_record,
    check_record,
    is_good,
    iter_records,
    last_good,
    last_good_path,
    read_json,
    read_record,
    read_records,
    status_rows,
    status_table,
    utc_now,
    write_json,
    write_record,
)

# --- command line ---------------------------------------------------------------------------------------

def _split(text: str | None) -> list[str]:
    return [p for p in (text or "").split(",") if p]


def _cmd_write(args) -> int:
    patches, features, release = _split(args.patches), _split(args.features), args.release
    if args.release_json:
        try:
            meta = json.loads(Path(args.release_json).read_text(encoding="utf-8"))
            release = release or meta["label"]
            patches = patches or list(meta.get("patches") or [])
            features = features or list(meta.get("features") or [])
        except OSError as err:
            raise RecordError(f"--release-json {args.release_json}: cannot read it "
                              f"({err.strerror or err})") from None
        except (ValueError, KeyError, TypeError):
            raise RecordError(f"--release-json {args.release_json}: "
                              "expected a release.json with a label") from None
    if not release:
        raise RecordError("give --release LABEL or --release-json FILE")
    report = None
    if args.report:
        try:
            report = json.loads(Path(args.report).read_text(encoding="utf-8"))
        except OSError as err:
            raise RecordError(f"--report {args.report}: cannot read it ({err.strerror or err})") from None
        except ValueError:
            raise RecordError(f"--report {args.report}: not JSON") from None
        if not isinstance(report, dict) or not isinstance(report.get("gates"), list):
            raise RecordError(f"--report {args.report}: not a gate report (no gates list)")
    rollback = None
    if args.rollback_json:
        try:
            rollback = json.loads(args.rollback_json)
        except ValueError:
            raise RecordError(f"--rollback-json {args.rollback_json!r}: not JSON") from None
    record = build_record(config=args.config, host=args.host, release=release, outcome=args.outcome,
                          started=args.started or utc_now(), config_digest=args.config_digest,
                          patches=patches, features=features, unit_digest=args.unit_digest, report=report,
                          rollback=rollback, message=args.message)
    path = write_record(args.dir, record)
    print(json.dumps({"path": str(path), "record": record}, sort_keys=True) if args.json else path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from sgdeploy.serving import _Parser

    parser = _Parser(prog="python -m sgdeploy.records", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("status", help="the newest record per config and host")
    p.add_argument("dir")
    p.add_argument("--all", action="store_true", help="every record, oldest first")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("last-good", help="path of the newest good record of a config on a host")
    p.add_argument("dir")
    p.add_argument("--config", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--json", action="store_true", help="print the record itself")
    p = sub.add_parser("write", help="build and write a record; prints its path")
    p.add_argument("dir")
    p.add_argument("--config", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--outcome", required=True, choices=OUTCOMES)
    p.add_argument("--release")
    p.add_argument("--release-json", metavar="FILE",
                   help="the release's release.json (label, patches, features)")
    p.add_argument("--patches", help="comma-separated")
    p.add_argument("--features", help="comma-separated")
    p.add_argument("--report", metavar="REPORT.json", help="the gate report (python -m sgdeploy.gate --out)")
    p.add_argument("--started", help="ISO 8601 UTC time the deploy started (default now)")
    p.add_argument("--config-digest")
    p.add_argument("--unit-digest")
    p.add_argument("--rollback-json", metavar="JSON", help="what the rollback did, as a JSON object")
    p.add_argument("--message", default="")
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            return _cmd_write(args)
        if not Path(args.dir).is_dir():
            raise RecordError(f"records folder {args.dir}: does not exist")
        if args.command == "last-good":
            found = last_good_path(args.dir, args.config, args.host)
            if not found:
                print(f"no good deploy of {args.config} on {args.host} in {args.dir}", file=sys.stderr)
                return 1
            print(json.dumps(found[1], indent=2, sort_keys=True) if args.json else found[0])
            return 0
        errors: list[str] = []
        recs = read_records(args.dir, errors)
        for e in errors:
            print(f"warning: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps(status_rows(recs, args.all), indent=2, sort_keys=True))
        else:
            print(status_table(recs, args.all))
        return 0
    except RecordError as err:
        print(f"{parser.prog} {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
