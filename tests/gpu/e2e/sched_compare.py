"""Set ``schedule`` (issue 38) on the GPU machine: what its summary compares, every comparison from paired,
interleaved rounds (paired.py; the runner's ``schedule_rounds``), never from servers timed one after another.

Why: the H200 run of 2026-12-05 timed each server alone, one after the other (``timing_batches``, now gone), and
one server timed twice minutes apart differed by 19-30 %, two identical servers by 6-7 %; the schedule's ratios
read from such numbers (graphs on / off "1.52x / 1.96x / 1.79x" at 4 / 8 / 16 in flight) carry that noise.

One repeat (``groups``): at each batch size the schedule's server, its twin with the per-width graphs off (only at
the plan's ``graphs_batches``: below them both run the largest width from its graph) and the fixed budgets the
schedule uses, one round each, A B C, the next repeat C B A; over the moving load the same servers and the control
(DFLASH 16). ``compare`` judges them:

- the schedule against the fixed budgets (``derive.compare``, the issue's test, as set ``derive`` judges the derived
  schedule): at each batch within 3 % of the best fixed budget (the highest median there); over the moving load
  beats each fixed budget and the control;
- graphs on against graphs off: at each of ``graphs_batches`` and over the moving load, "beats" / "does not beat" /
  inconclusive (``paired.judge_beats``).

Every ratio in ``lines`` comes with its min-max, its spread and its verdict. Pure functions, no GPU; TEST
EQUIPMENT of the harness.
"""

from __future__ import annotations

from typing import Any

import derive
import paired


def groups(spec: dict, batches: list[int], serving: set[str]) -> dict[str, list[str]]:
    """The rounds of one repeat of set ``schedule``'s comparisons ({``batchN`` | ``moving``: servers in order}), the
    servers of ``spec`` (plan key ``schedule``) that serve; {} when the schedule's server does not serve or nothing
    serves to compare it with."""
    if spec["server"] not in serving:
        return {}

    def keep(names: list[str | None]) -> list[str]:
        return [n for n in names if n and n in serving]

    off, fixed = spec.get("graphs_off"), list(spec["fixed"])
    out = {f"batch{n}": keep([spec["server"], off if n in spec["graphs_batches"] else None, *fixed])
           for n in batches}
    out["moving"] = keep([spec["server"], *fixed, spec.get("control"), off])
    return {k: v for k, v in out.items() if len(v) > 1}


def graphs(records: list[dict], on: str, off: str, keys: list[str]) -> dict[str, Any]:
    """Graphs on (``on``) against off (``off``) at each of ``keys``: the paired ratios on / off and
    ``paired.judge_beats``; ``verdict`` over all of them."""
    per_key = {}
    for key in keys:
        pairs = paired.paired_ratios(records, on, [off], key)
        per_key[key] = {"pairs": pairs, **paired.judge_beats([p["ratio"] for p in pairs])}
    lost = [k for k, v in per_key.items() if v["holds"] is False]
    unknown = [k for k, v in per_key.items() if v["holds"] is None]
    if not per_key:
        verdict = "inconclusive (nothing compared)"
    elif lost:
        verdict = f"graphs on does not beat graphs off at {', '.join(lost)}"
    elif unknown:
        verdict = f"inconclusive at {', '.join(unknown)}"
    else:
        verdict = "graphs on beats graphs off at " + ", ".join(per_key)
    return {"on": on, "off": off, "per_key": per_key, "holds": paired.all_of(list(per_key.values())),
            "verdict": verdict}


def compare(records: list[dict], spec: dict, batches: list[int], rounds: dict[str, list[str]]) -> dict[str, Any]:
    """The comparisons of set ``schedule`` on its paired rounds (``records``) of ``rounds`` (``groups``' answer)."""
    s = spec["server"]
    fixed = [n for n in spec["fixed"] if any(n in names for names in rounds.values())]
    timed = {n for names in rounds.values() for n in names}
    control = spec.get("control") if spec.get("control") in timed else None
    against = {n: [x for x in fixed if x in rounds.get(f"batch{n}", [])] for n in batches}
    out: dict[str, Any] = {"schedule": derive.compare(records, s, fixed, control, against)}
    off = spec.get("graphs_off")
    if off in timed:
        keys = [k for k in (*(f"batch{n}" for n in spec["graphs_batches"]), "moving") if off in rounds.get(k, [])]
        out["graphs"] = graphs(records, s, off, keys)
    return out


def lines(report: dict) -> list[str]:
    """The summary's lines for set ``schedule``: the rounds, each server's medians, every comparison with its paired
    ratios' median, min-max, spread and verdict, and the servers timed alone (single pass, not a comparison)."""
    if not report:
        return []
    if "error" in report:
        return [f"schedule: {report['error']}"]
    out = []
    rd = report.get("rounds") or {}
    s = report.get("server")
    if rd:
        out.append(f"schedule comparisons, paired rounds: {rd.get('repeats_ran')} of {rd.get('repeats_planned')} "
                   f"repeats ran (at least {paired.MIN_REPEATS} for a verdict), round size x{rd.get('scale')}: "
                   f"requests per round {rd.get('round_requests')}, moving {rd.get('moving')}; servers alternated "
                   f"A B | B A" + (f"; {rd['stopped']}" if rd.get("stopped") else "") + "; tok/s median [min-max] x n")
        for name, t in (rd.get("summary") or {}).items():
            out.append(f"  {name}: " + " | ".join(f"{k} {paired.cell_text(v)}" for k, v in t.items()))
    cmp_ = (report.get("compare") or {}).get("schedule") or {}
    for p in cmp_.get("per_batch") or []:
        out.append(f"  batch {p['batch']}: {s} / best fixed {p['best_fixed']} (highest median of "
                   f"{', '.join(p['against'])}), paired: {paired.ratio_text(p)}: {p['verdict']}")
    for name, v in (cmp_.get("moving") or {}).items():
        out.append(f"  moving 1->16->1: {s} / {name}, paired: {paired.ratio_text(v)}: {v['verdict']}")
    if cmp_.get("verdicts"):
        out.append(f"schedule {s} (issue 38): {cmp_['verdicts']['batches']}; moving load: "
                   f"{cmp_['verdicts']['moving']}")
    g = (report.get("compare") or {}).get("graphs")
    if g:
        for key, v in g["per_key"].items():
            out.append(f"  graphs on / off {key}: {g['on']} / {g['off']}, paired: {paired.ratio_text(v)}: "
                       f"{v['verdict']}")
        out.append(f"per-width graphs ({g['on']} / {g['off']}): {g['verdict']}")
    single = report.get("single") or {}
    if single.get("servers"):
        out.append(f"timed alone (single pass, not a comparison): {', '.join(single['servers'])}"
                   + (f"; {single['not_run']}" if single.get("not_run") else ""))
    return out
