"""Issue 38 on the GPU machine: the budget schedule derived from this run's own fixed-budget timings, and the derived
server judged against them (set ``derive``, tests/gpu/e2e/README.md).

Phase A: the runner times the fixed-budget DDTree servers in interleaved repeats at 1, 4, 8 and 16 requests in
flight (paired.py); ``cells`` turns each server's medians into the sweep's per-(budget, batch) cells and
``sgdeploy.schedule.derive`` (the project's own derivation, the one ``sgdeploy sweep`` uses) picks the schedule.
``derived_args`` gives the held-back server of the plan that schedule (its two flags; the unit tests check the result
equals what ``sgdeploy.render`` gives a config with that ``speculative.budget_schedule``). The runner starts it and
checks it against the AR server like every other.

Phase B: the derived server timed in alternation with the fixed budgets that could be the fastest at each batch
(``paired.contenders`` of phase A) and, over the 1 -> 16 -> 1 load, with every fixed budget and the control (DFLASH
16). ``compare`` is the issue's test on those paired rounds (within ``WITHIN`` of the best fixed budget at each
batch; beats every other over the moving load), with ``paired``'s verdicts: a claim is made only where the paired
ratios' spread allows it. Pure functions, no GPU; TEST EQUIPMENT of the harness.
"""

from __future__ import annotations

from typing import Any

import paired

WITHIN = paired.WITHIN  # issue 38 item 3: "within 3 % of the best fixed budget at that batch size"
TIE_TOLERANCE = 0.03  # the derivation's tie rule: a smaller budget within 3 % of the fastest wins (sgdeploy.schedule)
BUDGET_FLAG = "--speculative-ddtree-budget"
SCHEDULE_FLAG = "--speculative-ddtree-budget-schedule"


def cells(entries: list[dict], results: dict) -> list[dict[str, Any]]:
    """The sweep's cells from the fixed servers' timings (phase A's ``paired.summarise``: ``tokens_per_s`` is the
    median of the server's rounds): one per (server, batch measured). A cell qualifies when none of its rounds had a
    request error (the losslessness of each server is judged after, beside the AR server; the
    derivation here may only use what is known before the derived server starts)."""
    out = []
    for e in entries:
        timing = (results.get(e["name"]) or {}).get("timing") or {}
        for key, t in timing.items():
            if not key.startswith("batch") or not isinstance(t, dict):
                continue
            out.append({"server": e["name"], "budget": e["budget"], "batch": int(key[len("batch"):]),
                        "tokens_per_s": t.get("tokens_per_s"), "accept_length_mean": t.get("accept_length"),
                        "qualifies": not t.get("errors") and t.get("tokens_per_s") is not None})
    return out


def derived_args(args: list[str], schedule: tuple[tuple[int, int], ...]) -> list[str]:
    """``args`` (a DDTree server's launch flags) with ``--speculative-ddtree-budget`` the schedule's largest budget
    and ``--speculative-ddtree-budget-schedule`` the schedule (replaced where present, else added after the budget)."""
    flag = ",".join(f"{m}:{b}" for m, b in schedule)
    largest = max(b for _, b in schedule)
    out = list(args)
    i = out.index(BUDGET_FLAG)
    out[i + 1] = str(largest)
    if SCHEDULE_FLAG in out:
        out[out.index(SCHEDULE_FLAG) + 1] = flag
    else:
        out[i + 2:i + 2] = [SCHEDULE_FLAG, flag]
    return out


def compare(records: list[dict], derived: str, fixed: list[str], control: str | None,
            against: dict[int, list[str]], within: float = WITHIN) -> dict:
    """Phase B's rounds (``records``, paired.py) judged: at each batch ``n`` of ``against`` (the fixed budgets that
    could be the fastest there), the best fixed budget is the one of ``against[n]`` with the highest median in these
    rounds, and the derived server's paired ratios over it go to ``paired.judge_within``; over the moving load its paired ratios over every fixed server and the
    control, each by ``paired.judge_beats``. ``holds``: True / False where the rounds tell, None where they cannot."""
    summary = paired.summarise(records)
    per_batch = []
    for n, names in against.items():
        key = f"batch{n}"
        meds = {x: (summary.get(x, {}).get(key) or {}).get("tokens_per_s") for x in names}
        timed = [x for x in names if meds[x] is not None]
        best = max(timed, key=lambda x: meds[x]) if timed else None
        pairs = paired.paired_ratios(records, derived, [best], key) if best else []
        per_batch.append({"batch": n, "against": list(names), "best_fixed": best,
                          "best_fixed_tokens_per_s": meds.get(best), "pairs": pairs,
                          **paired.judge_within([p["ratio"] for p in pairs], within)})
    moving = {}
    for other in [*fixed, *([control] if control else [])]:
        ratios = [p["ratio"] for p in paired.paired_ratios(records, derived, [other], "moving")]
        moving[other] = {"ratios": ratios, **paired.judge_beats(ratios)}
    holds = {"every_batch_within": paired.all_of(per_batch), "moving_beats_all": paired.all_of(list(moving.values()))}
    return {"within": within, "per_batch": per_batch, "moving": moving, "holds": holds,
            "verdicts": {"batches": batches_verdict(per_batch, within), "moving": moving_verdict(moving, control)}}


def batches_verdict(per_batch: list[dict], within: float = WITHIN) -> str:
    pct = f"{within * 100:g} %"
    if not per_batch:
        return "inconclusive (no batch compared)"
    bad = [p["batch"] for p in per_batch if p["holds"] is False]
    if bad:
        return f"not within {pct} of the best fixed budget at batch {', '.join(map(str, bad))}"
    if all(p["holds"] for p in per_batch):
        return f"within {pct} of the best fixed budget at every batch"
    return "inconclusive at batch " + ", ".join(str(p["batch"]) for p in per_batch if p["holds"] is None)


def moving_verdict(moving: dict, control: str | None) -> str:
    if not moving:
        return "inconclusive (nothing compared)"
    lost = [n for n, v in moving.items() if v["holds"] is False]
    if lost:
        return f"does not beat {', '.join(lost)}"
    if all(v["holds"] for v in moving.values()):
        return "beats every fixed budget" + (f" and {control}" if control else "")
    return "inconclusive against " + ", ".join(n for n, v in moving.items() if v["holds"] is None)


def lines(report: dict) -> list[str]:
    """The summary's lines for the derivation and the comparison: tokens/s as median [min-max] x rounds."""
    if not report:
        return []
    if "error" in report:
        return [f"derive: {report['error']}"]
    out = []
    pa = report.get("phase_a") or {}
    if pa:
        out.append(f"derivation rounds (phase A): {pa.get('repeats_ran')} of {pa.get('repeats_planned')} repeats, "
                   f"requests per round {pa.get('round_requests')}, servers alternated; tok/s median [min-max] x n")
        for name, t in (pa.get("summary") or {}).items():
            out.append(f"  {name}: " + " | ".join(f"{k} {paired.cell_text(v)}" for k, v in t.items()))
    out.append(f"derived schedule: {report.get('flag')} (from the medians of {', '.join(report.get('from') or [])}; "
               f"tie tolerance {report.get('tie_tolerance')})")
    for b in report.get("buckets") or []:
        out.append(f"  batch {b['batch']}: budget {b['budget']} at {b['tokens_per_s']} tok/s"
                   + (f" (tied with {b['tied_with']})" if b.get("tied_with") else "")
                   + (f"; {b['note']}" if b.get("note") else ""))
    pb = report.get("phase_b") or {}
    if pb:
        out.append(f"paired rounds (phase B): {pb.get('repeats_ran')} repeats (at most {pb.get('repeats_most')}), "
                   f"requests per round {pb.get('round_requests')}, moving {pb.get('moving')}"
                   + (f"; {pb['stopped']}" if pb.get("stopped") else ""))
        for name, t in (pb.get("summary") or {}).items():
            out.append(f"  {name}: " + " | ".join(f"{k} {paired.cell_text(v)}" for k, v in t.items()))
    cmp_ = report.get("compare") or {}
    for p in cmp_.get("per_batch") or []:
        out.append(f"  batch {p['batch']}: derived / best fixed {p['best_fixed']} (highest median of "
                   f"{', '.join(p['against'])}), paired: {paired.ratio_text(p)}: {p['verdict']}")
    for name, v in (cmp_.get("moving") or {}).items():
        out.append(f"  moving 1->16->1: derived / {name}: {paired.ratio_text(v)}: {v['verdict']}")
    if cmp_.get("verdicts"):
        out.append(f"issue 38 item 3: {cmp_['verdicts']['batches']}; moving load: {cmp_['verdicts']['moving']}")
    return out
