"""Deploy records: one JSON file per deploy attempt, what it deployed, its gates and its outcome.

The records themselves are built, written and read by ``sglang_deploy_records`` in the collection's
module_utils, the code the host's record and gate modules run (the installed ``sgdeploy`` package
carries them; one implementation, docs/gates.md); this module is its command line on the controller.

``make status`` prints ``status_report`` (in-process, through the action plugin sgdeploy.host.controller_records):
what serves on each host now (from the hosts' current.json, as playbooks/status.yml collects them), then the
history, one row per record saying what it was (a deploy, a sweep variant, a manual rollback, a recovery) with the
last measured gate numbers.

Command line (exit 0 done, 1 nothing found, 2 misuse)::

    python -m sgdeploy.records status DIR [--all] [--json] [--now NOW_DIR [--hosts H1,H2]]
    python -m sgdeploy.records last-good DIR --config NAME --host HOST [--json]
    python -m sgdeploy.records write DIR --config NAME --host HOST --outcome OUTCOME
        (--release LABEL | --release-json FILE) [--report REPORT.json] [--started ISO]
        [--config-digest D] [--unit-digest D] [--rollback-json JSON] [--message TEXT] [--json]
"""

from __future__ import annotations

import json
import re
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

# --- what make status shows -----------------------------------------------------------------------------

# A sweep's variant config (sgdeploy.sweep.variant_name), deployed with the smoke gate only.
_VARIANT = re.compile(r"^(?P<base>.+)-b(?P<budget>\d+)-k(?P<cap>\d+)$")
_MEASURING_GATES = {"throughput", "acceptance"}


def _gate_names(record: dict) -> set:
    return {g.get("gate") for g in record.get("gates") or [] if isinstance(g, dict)}


def _unit_config(unit: str) -> str:
    """The config of a deploy's unit name (sglang-<config>.service)."""
    return unit.removeprefix("sglang-").removesuffix(".service")


def what_of(record: dict) -> str:
    """What a record was, in a few words: a deploy (and how it ended), a sweep variant, a manual
    rollback, the recovery of an interrupted switch."""
    outcome = record.get("outcome")
    rollback = record.get("rollback")
    if not isinstance(rollback, dict):
        rollback = {}
    if rollback.get("manual"):
        restored = [u for u in rollback.get("restored") or [] if isinstance(u, str)]
        if outcome == "rolled_back":
            return "manual rollback" + (f" to {_unit_config(restored[0])}" if restored else "")
        return "manual rollback, failed (what ran before was restored)"
    if rollback.get("interrupted_run"):
        return "recovery of an interrupted switch" + ("" if outcome == "rolled_back" else ", NOT HEALTHY")
    variant = _VARIANT.match(record.get("config") or "")
    if variant and not _gate_names(record) & _MEASURING_GATES:
        kind = (f"sweep variant of {variant['base']} (budget {variant['budget']}, "
                f"top-k cap {variant['cap']})")
    else:
        kind = "deploy"
    endings: dict[object, str] = {"unchanged": ", unchanged", "rolled_back": ", rolled back", "failed": ", failed"}
    by_watch = " by the post-deploy watch" if rollback.get("cause") == "watch" and outcome == "rolled_back" else ""
    return kind + endings.get(outcome, "") + by_watch


def _numbers(record: dict) -> tuple:
    bench = record.get("bench")
    if not isinstance(bench, dict):
        bench = {}
    return bench.get("accept_length_mean"), bench.get("tokens_per_s")


def last_measured(records: list[dict], config: str | None, host: str | None, unit_digest: str | None = None,
                  before: dict | None = None) -> dict | None:
    """The newest deployed record of ``config`` on ``host`` (older than ``before``, when given) whose
    gates measured accept length or tokens/s; one of the same unit when ``unit_digest`` is given and
    such a record exists."""
    found = []
    for r in records:
        if r is before:
            break
        if r.get("config") == config and r.get("host") == host and r.get("outcome") == "deployed" \
                and any(n is not None for n in _numbers(r)):
            found.append(r)
    same = [r for r in found if unit_digest and r.get("unit_digest") == unit_digest]
    newest = same or found
    return newest[-1] if newest else None


def history_rows(records: list[dict], every: bool = False) -> list[dict]:
    """``status_rows`` with what each record was (``what``) and, for an unchanged deploy (whose smoke
    gate measures nothing), the numbers of the last measured deploy of its unit and when they were
    measured (``measured``)."""
    chosen = records
    if not every:
        latest: dict[tuple, dict] = {}
        for r in records:
            latest[(r.get("config"), r.get("host"))] = r
        chosen = sorted(latest.values(), key=lambda r: (r.get("config") or "", r.get("host") or ""))
    rows = []
    for r in chosen:
        row = status_rows([r], every=True)[0]
        measured = any(n is not None for n in _numbers(r))
        row["what"], row["measured"] = what_of(r), r.get("finished") if measured else None
        if r.get("outcome") == "unchanged" and row["measured"] is None:
            source = last_measured(records, r.get("config"), r.get("host"), r.get("unit_digest"), before=r)
            if source:
                row["accept_length"], row["tokens_per_s"] = _numbers(source)
                row["measured"] = source.get("finished")
                row["what"] += f" (numbers of {_when(source.get('finished'))})"
        rows.append(row)
    return rows


def now_rows(now: dict[str, dict | None], records: list[dict]) -> list[dict]:
    """What serves on each host now: one row per deploy whose current.json the host has (or one saying
    nothing is deployed, or that the host did not answer), with the last measured gate numbers of its
    unit on that host. ``now`` maps each host to what its status module returned (None: no answer). The ranks
    of an engine over several hosts are gathered as they are read and shown as one row (``engine_row``), where
    its first rank was read."""
    rows: list[dict | tuple] = []  # a tuple: the key of an engine over several hosts in ``engines``
    engines: dict[tuple, list[tuple[dict, dict]]] = {}  # (config, engine hosts) -> [(row, current.json entry)]
    for host, data in now.items():
        base = {"host": host, "config": None, "state": "", "release": None, "since": None, "accept_length": None,
                "tokens_per_s": None, "measured": None}
        if data is None:
            rows.append(base | {"state": "UNREACHABLE: what serves there is unknown"})
            continue
        deployed = [d for d in data.get("deployed") or [] if isinstance(d, dict)]
        for d in deployed:
            state = ("serving" if d.get("healthy") else "running, /health does not answer"
                     if d.get("healthy") is False else "running") if d.get("active") else "NOT RUNNING"
            source = last_measured(records, d.get("config"), host, d.get("unit_digest"))
            accept, tps = _numbers(source) if source else (None, None)
            row = base | {"config": d.get("config"), "state": state, "release": d.get("release"),
                          "since": d.get("deployed"), "accept_length": accept, "tokens_per_s": tps,
                          "measured": source.get("finished") if source else None}
            if isinstance(d.get("nnodes"), int) and d["nnodes"] > 1:
                key = (d.get("config"), tuple(d.get("engine_hosts") or ()))
                if key not in engines:
                    engines[key] = []
                    rows.append(key)
                engines[key].append((row, d))
            else:
                rows.append(row)
        pending = data.get("uncommitted")
        if isinstance(pending, dict) and pending.get("config"):
            rows.append(base | {"config": pending["config"],
                                "state": "uncommitted (an interrupted switch; the next deploy or rollback rolls it "
                                         "back), " + ("running" if pending.get("active") else "not running")})
        if not deployed and not pending:
            rows.append(base | {"state": "nothing deployed by sgdeploy"})
    return [engine_row(engines[r]) if isinstance(r, tuple) else r for r in rows]


def engine_row(ranks_read: list[tuple[dict, dict]]) -> dict:
    """The ranks of an engine over several hosts (serving.nnodes; docs/multinode.md) as one row: its hosts rank 0
    first, rank 0's state, release and numbers (rank 0 serves and is gated), and every other rank that does not run
    or was not found. ``ranks_read``: each rank's row and its current.json entry (the same config and engine
    hosts, current.json's engine_hosts)."""
    members = sorted(ranks_read, key=lambda m: (m[1].get("node_rank") is None, m[1].get("node_rank") or 0))
    nnodes = max(d["nnodes"] for _, d in members)
    first = next((r for r, d in members if d.get("node_rank") == 0), None)
    ranks = [{"host": r["host"], "rank": d.get("node_rank"), "state": r["state"]} for r, d in members]
    notes = [f"rank {r['rank']} ({r['host']}) {r['state']}" for r in ranks if r["rank"] != 0
             and r["state"] != "running"]
    found = {r["rank"] for r in ranks}
    expected = tuple(members[0][1].get("engine_hosts") or ())
    notes += [f"rank {i}" + (f" ({expected[i]})" if i < len(expected) else "") + " not found"
              for i in range(nnodes) if i not in found]
    lead = first or members[0][0]
    state = (lead["state"] if first else "rank 0 not found")
    merged = dict(lead)
    merged |= {"host": ",".join(r["host"] for r, _ in members), "ranks": ranks,
               "state": "; ".join([state, *[n for n in notes if not n.startswith("rank 0 ")]])}
    if not first:
        merged |= {"accept_length": None, "tokens_per_s": None, "measured": None}
    return merged


def _when(stamp: str | None) -> str:
    return (stamp or "-").replace("T", " ")


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(head: tuple[str, ...], cells: list[tuple[str, ...]]) -> list[str]:
    table = [head, *cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table]


def history_table(records: list[dict], every: bool = False) -> str:
    """The history as text: config, host, what it was, release, outcome, gates, exactness, accept
    length, tokens/s, when."""
    rows = history_rows(records, every)
    if not rows:
        return "no deploy records"
    head = ("config", "host", "what", "release", "outcome", "gates", "exactness", "watch", "accept", "tok/s", "when")
    return "\n".join(_table(head, [(r["config"] or "-", r["host"] or "-", r["what"], r["release"] or "-",
                                    r["outcome"] or "-", r["gates"], r["exactness"], r["watch"],
                                    _num(r["accept_length"], ".2f"),
                                    _num(r["tokens_per_s"], ".1f"), _when(r["finished"])) for r in rows]))


def now_table(now: dict[str, dict | None], records: list[dict]) -> str:
    rows = now_rows(now, records)
    if not rows:
        return "no host"
    head = ("host", "serves now", "state", "release", "since", "accept", "tok/s", "measured")
    return "\n".join(_table(head, [(r["host"], r["config"] or "-", r["state"], r["release"] or "-",
                                    _when(r["since"]) if r["since"] else "-", _num(r["accept_length"], ".2f"),
                                    _num(r["tokens_per_s"], ".1f"), _when(r["measured"]) if r["measured"] else "-")
                                   for r in rows]))


def status_report(records: list[dict], now: dict[str, dict | None] | None, every: bool = False) -> str:
    """``make status``: now (when the hosts' state is given), then the history."""
    history = ("history (every record, oldest first):" if every
               else "history (the newest record of each config on each host):")
    parts = [] if now is None else ["now (what serves on each host; numbers: its last measured deploy):",
                                    now_table(now, records), ""]
    return "\n".join([*parts, history, history_table(records, every)])


def read_now(folder: str | Path, hosts: list[str] | None) -> dict[str, dict | None]:
    """What ``playbooks/status.yml`` kept of each host (``<host>.json``); a host of ``hosts`` without a
    file did not answer (None)."""
    found: dict[str, dict | None] = {}
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        data = read_json(path, str(path), RecordError)
        if not isinstance(data, dict):
            raise RecordError(f"{path}: not a host's status (expected a JSON object)")
        found[path.stem] = data
    return {h: found.get(h) for h in hosts} if hosts is not None else found


def collect(records_dir: str | Path, now_dir: str | Path | None = None,
            hosts: list[str] | None = None) -> tuple[list[dict], dict[str, dict | None] | None, list[str]]:
    """What ``make status`` shows, from the folders ``playbooks/status.yml`` fills: the records, each host's state
    (``read_now``; None without ``now_dir``) and one line per record that cannot be read (skipped). The command
    line's ``status`` and the action plugin sgdeploy.host.controller_records both read them here."""
    if not Path(records_dir).is_dir():
        raise RecordError(f"records folder {records_dir}: does not exist")
    errors: list[str] = []
    records = read_records(records_dir, errors)
    now = read_now(now_dir, hosts) if now_dir else None
    return records, now, errors


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
    p.add_argument("--now", metavar="NOW_DIR", help="the hosts' state (<host>.json from playbooks/status.yml): "
                   "show what serves on each host now first")
    p.add_argument("--hosts", help="comma-separated: the hosts asked (one without a file in NOW_DIR did not answer)")
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
        if args.command == "last-good":
            if not Path(args.dir).is_dir():
                raise RecordError(f"records folder {args.dir}: does not exist")
            found = last_good_path(args.dir, args.config, args.host)
            if not found:
                print(f"no good deploy of {args.config} on {args.host} in {args.dir}", file=sys.stderr)
                return 1
            print(json.dumps(found[1], indent=2, sort_keys=True) if args.json else found[0])
            return 0
        recs, now, errors = collect(args.dir, args.now, _split(args.hosts) if args.hosts is not None else None)
        for e in errors:
            print(f"warning: {e}", file=sys.stderr)
        if args.json:
            rows = history_rows(recs, args.all)
            print(json.dumps(rows if now is None else {"now": now_rows(now, recs), "history": rows}, indent=2,
                             sort_keys=True))
        else:
            print(status_report(recs, now, args.all))
        return 0
    except RecordError as err:
        print(f"{parser.prog} {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
