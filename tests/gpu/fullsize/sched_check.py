"""Does a scheduled server step like the fixed budget its schedule picked? (issue 38 item 3; CPU)

    python tests/gpu/fullsize/sched_check.py RESULTS.json [RESULTS2.json ...] [--out DIR] [--tolerance 0.03]

For every server of the results with a ``budget_schedule`` (full_plan's ``ddtree-sched``) and every batch size
it measured: the budget its schedule gives that batch (the last entry with min_batch <= batch, as the patched
server's ``ddtree_schedule`` does), its median step time, the median step time of the fixed server of that
budget (``ddtree-b<budget>``, same runner, same measurement), their ratio and whether it is within the
tolerance (|ratio - 1| <= 3 %: the step "matches" the fixed budget's). Each fixed number names the results file
it came from, so a number taken from an earlier call (docs/results/...) shows as such. Then the CUDA graphs'
memory the server logged (full_runner.graphs_from_log): SGLang's own capture and patch 0005's extra verify
graphs at the other scheduled widths, or the line saying those widths verify eagerly.

Several results files are merged in order, a later file's server winning (as analysis.py does). Writes
OUT/schedule.md and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analysis  # noqa: E402  (step_ms, merge_servers, num)

TOLERANCE = 0.03


def budget_at(schedule: list[list[int]], batch: int) -> int:
    """The scheduled budget of a decode step with ``batch`` running requests."""
    picked = [b for m, b in schedule if m <= batch]
    if not picked:
        raise ValueError(f"schedule {schedule}: no entry for batch {batch} (the first min_batch must be 1)")
    return picked[-1]


def rows(results: dict, sources: dict[str, str], tolerance: float = TOLERANCE) -> list[dict]:
    """One row per scheduled server and batch size it measured (its schedule's fixed server compared)."""
    out = []
    for name, entry in results.items():
        schedule = entry.get("budget_schedule") if isinstance(entry, dict) else None
        if not schedule:
            continue
        for batch in entry.get("batches") or []:
            budget = budget_at(schedule, batch)
            fixed = f"ddtree-b{budget}"
            s, f = analysis.step_ms(results, name, batch), analysis.step_ms(results, fixed, batch)
            ratio = round(s / f, 4) if s is not None and f is not None else None
            out.append({"server": name, "batch": batch, "budget": budget, "step_ms": s, "fixed": fixed,
                        "fixed_step_ms": f, "fixed_source": sources.get(fixed), "ratio": ratio,
                        "within": None if ratio is None else abs(ratio - 1) <= tolerance})
    return out


def graph_lines(results: dict) -> list[str]:
    """What each scheduled server (and each fixed server it uses) logged about its CUDA graphs."""
    out = []
    for name, entry in results.items():
        if not isinstance(entry, dict) or not entry.get("budget_schedule"):
            continue
        for who in (name, *sorted({f"ddtree-b{b}" for _, b in entry["budget_schedule"]})):
            g = ((results.get(who) or {}).get("memory") or {}).get("graphs")
            if g is None:
                out.append(f"- {who}: no graph lines in its results (server log not read, or an older runner)")
                continue
            caps = ", ".join(f"{k} {v:.2f} GiB" for k, v in sorted((g.get("capture_gib") or {}).items()))
            line = f"- {who}: SGLang's capture: {caps or 'no capture line'}"
            extra = g.get("schedule_graphs")
            if extra:
                gib = "not read" if extra["extra_gib"] is None else f"{extra['extra_gib']:.2f} GiB"
                line += (f"; patch 0005's verify graphs at widths {extra['widths']} (bs {extra['bs']}): "
                         f"the extra ones {gib} in {extra['extra_s']:g} s")
            elif g.get("schedule_eager"):
                line += f"; **no per-width graphs**: `{g['schedule_eager']}`"
            out.append(line)
    return out


def markdown(table: list[dict], graphs: list[str], tolerance: float = TOLERANCE) -> str:
    lines = [f"Step time of each scheduled server against the fixed budget its schedule picks at that batch "
             f"(within {100 * tolerance:g} %: |ratio - 1| <= {tolerance:g}).", "",
             "| server | batch | scheduled budget | step ms | fixed server | its step ms | ratio | within | "
             "fixed number from |", "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |"]
    f = analysis.num
    for r in table:
        within = "" if r["within"] is None else ("yes" if r["within"] else "**no**")
        lines.append(f"| {r['server']} | {r['batch']} | {r['budget']} | {f(r['step_ms'])} | {r['fixed']} | "
                     f"{f(r['fixed_step_ms'])} | {f(r['ratio'], 4)} | {within} | {r['fixed_source'] or 'not run'} |")
    if not table:
        lines.append("| (no server with a budget schedule in the results) | | | | | | | | |")
    lines += ["", "CUDA graphs' memory (server logs):", "", *(graphs or ["- none"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+", help="full_runner results.json; several are merged, a later "
                    "file's server winning")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest |ratio - 1| that matches "
                    f"(default {TOLERANCE})")
    args = ap.parse_args(argv)
    if not 0 < args.tolerance < 1:
        print(f"sched_check: --tolerance {args.tolerance:g}: give a fraction between 0 and 1 (0.03 is 3 %)",
              file=sys.stderr)
        return 2
    results: dict = {}
    sources: dict[str, str] = {}
    for path in args.results:
        try:
            found = analysis.merge_servers(json.loads(path.read_text()))
        except (OSError, ValueError) as err:
            print(f"sched_check: {path}: cannot read the results: {err}", file=sys.stderr)
            return 2
        results.update(found)
        sources.update({name: str(path) for name in found})
    try:
        table = rows(results, sources, args.tolerance)
    except ValueError as err:
        print(f"sched_check: {err}", file=sys.stderr)
        return 2
    text = markdown(table, graph_lines(results), args.tolerance)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "schedule.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
