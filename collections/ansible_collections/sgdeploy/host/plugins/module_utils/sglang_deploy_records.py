# Copyright: sgdeploy contributors. Apache-2.0
"""Deploy records: one JSON file per deploy attempt, what it deployed, its gates and its outcome.

The one implementation (docs/gates.md): the record module (sgdeploy.host.sglang_deploy_record) and the
gate module write and read records with it on the host, and the controller's ``sgdeploy records``
(``make status``, the baseline) imports it. A records folder holds ``<UTC timestamp>.json`` files (on a
host: ``<state dir>/<config>/records/``; on the controller, fetched copies under ``reports/``, searched
recursively). Standard library only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_files

SCHEMA = 1
OUTCOMES = ("deployed", "rolled_back", "failed", "unchanged")
KEYS = ("schema", "config", "config_digest", "host", "release", "patches", "features", "unit_digest",
        "started", "finished", "outcome", "gates", "bench", "rollback", "message")


class RecordError(ValueError):
    """A record that cannot be read or built: one line naming the file or field and the value."""


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def build_record(*, config: str, host: str, release: str, outcome: str, started: str,
                 finished: str | None = None, config_digest: str | None = None,
                 patches: list[str] | tuple[str, ...] = (), features: list[str] | tuple[str, ...] = (),
                 unit_digest: str | None = None, report: Any = None, rollback: dict | None = None,
                 message: str = "", watch: dict | None = None) -> dict:
    """A deploy record. ``report`` is a gate.GateReport or its ``to_dict()`` (or None: no gates ran); ``watch``
    the post-deploy watch's result (sglang_watch: result, line, per-interval numbers) or None (it did not run)."""
    if outcome not in OUTCOMES:
        raise RecordError(f"outcome {outcome!r} is not allowed; allowed: {', '.join(OUTCOMES)}")
    for name, value in (("config", config), ("host", host), ("release", release)):
        if not isinstance(value, str) or not value:
            raise RecordError(f"{name} {value!r} must be a non-empty string")
    if rollback is not None and not isinstance(rollback, dict):
        raise RecordError(f"rollback {rollback!r} must be an object or null")
    if watch is not None and not isinstance(watch, dict):
        raise RecordError(f"watch {watch!r} must be an object or null")
    if report is not None and not isinstance(report, dict):
        report = report.to_dict()
    return {
        "schema": SCHEMA, "config": config, "config_digest": config_digest, "host": host, "release": release,
        "patches": list(patches), "features": list(features), "unit_digest": unit_digest,
        "started": started, "finished": finished or utc_now(), "outcome": outcome,
        "gates": list((report or {}).get("gates") or []), "bench": (report or {}).get("bench"),
        "rollback": rollback, "message": message,
        "exactness": (report or {}).get("exactness"),  # the exactness gate's result (sgdeploy.exactness)
        # A canary's old replica measured side by side with it ({"url", "bench"}; docs/router.md), or None.
        "same_window": (report or {}).get("same_window"),
        # The post-deploy watch (docs/monitoring-watch.md): {"result": passed|failed|inconclusive|off, "line",
        # "intervals": [...], ...}; None in a record from before the watch or one where no watch was due.
        "watch": watch,
    }


def write_json(path: str | Path, data: Any) -> None:
    """Write JSON atomically (a temporary file in the same folder, fsync, rename, fsync the folder)."""
    sglang_deploy_files.write_json(str(path), data)


def write_record(records_dir: str | Path, record: dict) -> Path:
    """Write ``record`` as ``<finished, compact>.json`` in ``records_dir`` (made if missing); never
    overwrites another record. Returns the path."""
    check_record(record, "record")
    folder = Path(records_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = record["finished"].replace("-", "").replace(":", "")
    path, n = folder / f"{stamp}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stamp}-{n}.json"
    write_json(path, record)
    return path


def check_record(record: Any, where: str) -> dict:
    if not isinstance(record, dict):
        raise RecordError(f"{where}: not a deploy record (expected a JSON object)")
    if record.get("schema") != SCHEMA:
        raise RecordError(f"{where}: schema {record.get('schema')!r} is not a deploy record's; "
                          f"expected {SCHEMA}")
    missing = [k for k in KEYS if k not in record]
    if missing:
        raise RecordError(f"{where}: not a deploy record; missing {', '.join(missing)}")
    if record["outcome"] not in OUTCOMES:
        raise RecordError(f"{where}: outcome {record['outcome']!r} is not one of {', '.join(OUTCOMES)}")
    if not isinstance(record["gates"], list):
        raise RecordError(f"{where}: gates must be a list")
    return record


def read_json(path: str | Path, label: str, error: type[Exception] = ValueError) -> Any:
    """The JSON in ``path``; an unreadable file or bad JSON raises ``error`` with one line that
    starts with ``label`` (the file, or the option that named it)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise error(f"{label}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:
        raise error(f"{label}: not JSON ({err})") from None


def read_record(path: str | Path) -> dict:
    """Read and check one record file; RecordError names the file and what is wrong."""
    return check_record(read_json(path, str(path), RecordError), str(path))


def iter_records(records_dir: str | Path, errors: list[str] | None = None) -> list[tuple[Path, dict]]:
    """(path, record) for every record under ``records_dir`` (recursively), oldest first.

    Files that are not records are skipped; their reasons go to ``errors`` when given.
    A missing folder holds no records.
    """
    folder = Path(records_dir)
    found = []
    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        if path.name.startswith("."):
            continue
        try:
            found.append((path, read_record(path)))
        except RecordError as err:
            if errors is not None:
                errors.append(str(err))
    found.sort(key=lambda pr: (pr[1].get("finished") or "", pr[1].get("started") or "", _name_key(pr[0])))
    return found


def _name_key(path: Path) -> tuple[str, str, int]:
    """Order ``T.json`` before ``T-2.json`` before ``T-10.json`` (records finished in the same second)."""
    stem, dash, n = path.stem.rpartition("-")
    if dash and n.isdigit():
        return str(path.parent), stem, int(n)
    return str(path.parent), path.stem, 1


def read_records(records_dir: str | Path, errors: list[str] | None = None) -> list[dict]:
    return [r for _, r in iter_records(records_dir, errors)]


def is_good(record: dict) -> bool:
    """Deployed, with at least one gate, and every gate passed."""
    gates = record.get("gates") or []
    return record.get("outcome") == "deployed" and bool(gates) and all(
        isinstance(g, dict) and g.get("verdict") == "pass" for g in gates)


def last_good_path(records_dir: str | Path, config: str, host: str) -> tuple[Path, dict] | None:
    """The newest good record of ``config`` on ``host``, with its path, or None."""
    for path, record in reversed(iter_records(records_dir)):
        if record.get("config") == config and record.get("host") == host and is_good(record):
            return path, record
    return None


def last_good(records_dir: str | Path, config: str, host: str) -> dict | None:
    """The newest record of ``config`` on ``host`` with outcome deployed and all gates passed."""
    found = last_good_path(records_dir, config, host)
    return found[1] if found else None


def watch_cell(record: dict) -> str:
    """The post-deploy watch of a record in a word: passed, failed, inconclusive, off, or - (no watch was due)."""
    watch = record.get("watch")
    if not isinstance(watch, dict):
        return "-"
    return str(watch.get("result") or "-")


def status_rows(records: list[dict], every: bool = False) -> list[dict]:
    """Rows for ``make status``: the newest record per (config, host), or every record."""
    if not every:
        latest: dict[tuple[str | None, str | None], dict] = {}
        for r in records:
            latest[(r.get("config"), r.get("host"))] = r
        records = sorted(latest.values(), key=lambda r: (r.get("config") or "", r.get("host") or ""))
    rows = []
    for r in records:
        bench = r.get("bench") or {}
        failed = [g.get("gate") for g in r.get("gates") or [] if g.get("verdict") != "pass"]
        rows.append({
            "config": r.get("config"), "host": r.get("host"), "release": r.get("release"),
            "outcome": r.get("outcome"),
            "gates": ("-" if not r.get("gates") else "pass" if not failed else "fail: " + ",".join(failed)),
            "accept_length": bench.get("accept_length_mean"), "tokens_per_s": bench.get("tokens_per_s"),
            "finished": r.get("finished"), "message": r.get("message") or "",
            "exactness": (r.get("exactness") or {}).get("verdict") or "-",  # the exactness gate's verdict
            "watch": watch_cell(r),
        })
    return rows


def status_table(records: list[dict], every: bool = False) -> str:
    """A plain-text table: config, host, release, outcome, gates, accept length, tokens/s, when."""
    rows = status_rows(records, every)
    if not rows:
        return "no deploy records"
    head = ("config", "host", "release", "outcome", "gates", "exactness", "accept", "tok/s", "when")

    def cell(row: dict) -> tuple[str, ...]:
        acc, tps = row["accept_length"], row["tokens_per_s"]
        when = (row["finished"] or "-").replace("T", " ")
        return (row["config"] or "-", row["host"] or "-", row["release"] or "-", row["outcome"] or "-",
                row["gates"], row["exactness"], "-" if acc is None else f"{acc:.2f}",
                "-" if tps is None else f"{tps:.1f}", when)

    table = [head] + [cell(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in table)
