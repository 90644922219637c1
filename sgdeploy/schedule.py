"""DDTree budget schedule (issue 38): a budget per running-batch bucket, and its derivation from a sweep.

The patched server's flag ``--speculative-ddtree-budget-schedule "1:64,4:32,8:15"`` is a list of
``min_batch:budget`` entries, min_batch ascending from 1; a decode step whose running batch holds n requests
uses the budget of the last entry with min_batch <= n, and ``--speculative-ddtree-budget`` is the largest
scheduled budget (the buffers and the top-k cap are sized for it). A config writes it as
``speculative.budget_schedule: [{min_batch: 1, budget: 64}, {min_batch: 4, budget: 32}, ...]``
(docs/ddtree.md, "Budget schedule"); the config's rules are in ``sgdeploy.config_model``.

``derive`` picks the schedule from a sweep's per-(budget, batch) measurements (docs/sweep.md, "Batches and
the budget schedule"): at each batch size measured, the qualifying budget with the most tokens/s, a budget
within the tie tolerance of it and smaller winning the tie; the schedule has an entry where the best
budget changes. Pure functions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Schedule = tuple[tuple[int, int], ...]  # ((min_batch, budget), ...), min_batch ascending from 1


def flag_value(schedule: Schedule) -> str:
    """``((1, 64), (4, 32))`` -> ``"1:64,4:32"`` (the server flag's form)."""
    return ",".join(f"{m}:{b}" for m, b in schedule)


def as_entries(schedule: Schedule) -> list[dict[str, int]]:
    """The config's form: ``[{"min_batch": 1, "budget": 64}, ...]``."""
    return [{"min_batch": m, "budget": b} for m, b in schedule]


def problems(schedule: Sequence[tuple[int, int]], max_budget: int) -> list[str]:
    """What is wrong with a schedule's order and budgets, one phrase each (empty: nothing): the first
    min_batch is 1, min_batch strictly increases, every budget is between 1 and ``max_budget``."""
    out = []
    if not schedule:
        return ["must have at least one entry"]
    if schedule[0][0] != 1:
        out.append(f"the first entry's min_batch is {schedule[0][0]}: it must be 1 (every batch size needs a budget)")
    for (m0, _), (m1, _) in zip(schedule, schedule[1:], strict=False):
        if m1 <= m0:
            out.append(f"min_batch {m1} after {m0}: min_batch must increase from entry to entry")
    for m, b in schedule:
        if not 1 <= b <= max_budget:
            out.append(f"budget {b} (min_batch {m}) must be between 1 and {max_budget}")
    return out


# --------------------------------------------------------------------------------------------------
# Derivation from a sweep


def best_at_batch(cells: Sequence[dict[str, Any]], tie_tolerance: float) -> tuple[dict | None, list[dict]]:
    """(chosen cell, the cells tied with the fastest) among the qualifying cells of one batch size.

    A cell: ``{"budget", "batch", "tokens_per_s", "accept_length_mean", "qualifies"}``; only cells that
    qualify (measured, not leaking, the deploy's gates would pass them) count. The fastest wins, but a
    smaller budget within ``tie_tolerance`` of its tokens/s wins the tie: at the same speed the smaller tree
    does less verify work for the other requests of the batch."""
    ok = [c for c in cells if c.get("qualifies") and c.get("tokens_per_s") is not None]
    if not ok:
        return None, []
    fastest = max(ok, key=lambda c: (c["tokens_per_s"], -c["budget"]))
    floor = fastest["tokens_per_s"] * (1 - tie_tolerance)
    tied = sorted((c for c in ok if c["tokens_per_s"] >= floor), key=lambda c: c["budget"])
    return tied[0], tied


def derive(cells: Sequence[dict[str, Any]], tie_tolerance: float) -> dict[str, Any] | None:
    """The budget schedule of a sweep's per-(budget, batch) cells, or None when no batch has a qualifying cell.

    Returns ``{"schedule": ((min_batch, budget), ...), "flag": "1:64,8:15", "buckets": [...]}``: one bucket
    per batch size measured (ascending) with its chosen budget, its tokens/s and accept length, the budgets
    it tied with, and every candidate's numbers. The budget measured at batch b holds from b up to the next
    batch measured; the first bucket's from 1 (the server's schedule starts at 1). A batch size without a
    qualifying cell keeps the previous bucket's budget (its bucket says so)."""
    batches = sorted({c["batch"] for c in cells})
    buckets: list[dict[str, Any]] = []
    entries: list[tuple[int, int]] = []
    for batch in batches:
        here = [c for c in cells if c["batch"] == batch]
        chosen, tied = best_at_batch(here, tie_tolerance)
        candidates = [{"budget": c["budget"], "tokens_per_s": c.get("tokens_per_s"),
                       "accept_length_mean": c.get("accept_length_mean"), "qualifies": bool(c.get("qualifies"))}
                      for c in sorted(here, key=lambda c: c["budget"])]
        bucket: dict[str, Any] = {"batch": batch, "budget": None, "tokens_per_s": None, "accept_length_mean": None,
                                  "tied_with": [], "candidates": candidates, "note": None}
        if chosen is None:
            bucket["note"] = "no qualifying budget measured at this batch size"
            if entries:
                bucket["budget"] = entries[-1][1]
                bucket["note"] += f"; keeps budget {entries[-1][1]} from the smaller batch"
            buckets.append(bucket)
            continue
        bucket.update(budget=chosen["budget"], tokens_per_s=chosen["tokens_per_s"],
                      accept_length_mean=chosen.get("accept_length_mean"),
                      tied_with=[c["budget"] for c in tied if c is not chosen])
        buckets.append(bucket)
        if not entries:
            entries.append((1, chosen["budget"]))
        elif entries[-1][1] != chosen["budget"]:
            entries.append((batch, chosen["budget"]))
    if not entries:
        return None
    schedule = tuple(entries)
    return {"schedule": schedule, "flag": flag_value(schedule), "entries": as_entries(schedule), "buckets": buckets}
