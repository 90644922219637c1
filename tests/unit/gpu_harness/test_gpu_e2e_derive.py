"""Set "derive" of the end-to-end harness (issue 38 item 3, tests/gpu/e2e/derive.py): the schedule the runner derives
from its own fixed-budget timings, the flags the held-back server then gets, and the comparison it is judged by."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "e2e"))

import derive  # noqa: E402
import plan  # noqa: E402

from sgdeploy import schedule  # noqa: E402


def timing(moving: float | None = None, **batches):
    """A server's results with its tokens/s at each batch (``batch1=...``) and over the moving load."""
    return {"timing": {**{k: {"tokens_per_s": v, "accept_length": 2.0, "errors": []} for k, v in batches.items()},
                       "moving": {"tokens_per_s": moving}}}


def test_the_derive_plan_holds_its_server_back_and_names_what_it_derives_from():
    p = plan.build("derive")
    names = [s["name"] for s in p["servers"]]
    assert p["derive"]["server"] in names and set(p["derive"]["from"]) <= set(names)
    assert p["batches"] == [1, 4, 8, 16] and p["learned"]
    # the guessed schedule's servers stay in set "schedule": here they would take time and memory from the rounds
    assert sorted(names) == sorted(["ar", "dflash", *p["derive"]["from"], p["derive"]["server"]])
    budgets = {s["name"]: s["budget"] for s in p["servers"]}
    assert sorted(budgets[n] for n in p["derive"]["from"]) == [15, 32, 64]


def test_the_derived_flags_are_what_the_project_renders_for_that_schedule():
    p = plan.build("derive")
    held = next(s for s in p["servers"] if s["name"] == p["derive"]["server"])
    for sched in (((1, 64), (8, 32)), ((1, 32),), ((1, 64), (4, 32), (16, 15))):
        got = derive.derived_args(held["args"], sched)
        server = plan.Server("sched-derived", "ddtree-b64", max(b for _, b in sched), 8, budget_schedule=sched,
                             tags=("schedule", "derived"), max_running=16)
        index = [s["name"] for s in p["servers"]].index(held["name"])
        want = plan.server_entry(server, index, p["models"])["args"]
        assert got == want, sched


def test_cells_and_the_projects_derivation_pick_the_fastest_budget_per_batch():
    entries = [{"name": f"b{b}", "budget": b} for b in (15, 32, 64)]
    results = {"b15": timing(batch1=240, batch8=1200), "b32": timing(batch1=300, batch8=1150),
               "b64": timing(batch1=360, batch8=1000)}
    results["b32"]["timing"]["batch8"]["errors"] = ["ConnectionError"]  # a cell with an error never qualifies
    got = schedule.derive(derive.cells(entries, results), derive.TIE_TOLERANCE)
    assert got["flag"] == "1:64,8:15"
