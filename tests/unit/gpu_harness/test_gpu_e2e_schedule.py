"""Set "schedule" of the end-to-end harness (issue 38, tests/gpu/e2e/sched_compare.py and the runner's
``schedule_rounds``): every comparison of tokens/s between its servers (the schedule against the fixed budgets it uses
and DFLASH 16, its per-width graphs on against off) runs in paired, interleaved rounds within the runner's deadline;
each ratio in the summary comes with its spread and a verdict; servers timed alone say "single pass, not a
comparison"."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "e2e"))

import paired  # noqa: E402
import plan  # noqa: E402
import runner  # noqa: E402
import sched_compare  # noqa: E402

SPEC = {"server": "sched-k8", "graphs_off": "sched-k8-onegraph", "control": "dflash",
        "fixed": ["ddtree-b15-k8", "ddtree-b32-k8", "ddtree-b64-k8"], "graphs_batches": [4, 8, 16]}
BATCHES = [1, 4, 8, 16]
VERDICT = re.compile(r": (within 3 %|not within 3 %|beats|does not beat|inconclusive \(.+\))$")


def rec(repeat: int, key: str, server: str, tps: float) -> dict:
    return {"repeat": repeat, "key": key, "server": server, "tokens_per_s": tps, "accept_length": 2.0, "errors": []}


def test_the_schedule_plan_names_what_it_compares_and_only_servers_it_starts():
    p = plan.build("schedule")
    assert p["schedule"] == SPEC and p["batches"] == BATCHES
    names = {s["name"] for s in p["servers"]}
    assert {SPEC["server"], SPEC["graphs_off"], SPEC["control"], *SPEC["fixed"]} <= names
    fixed_budgets = sorted(next(s["budget"] for s in p["servers"] if s["name"] == n) for n in SPEC["fixed"])
    assert fixed_budgets == sorted({b for _, b in plan.SCHEDULE_ENTRIES})  # the budgets the schedule uses
    assert plan.build("derive")["schedule"] is None and plan.build("budget")["schedule"] is None


def test_one_repeat_holds_every_comparison_and_the_next_runs_it_backwards():
    every = {"ar", "dflash", "nofork-b64-k8", SPEC["server"], SPEC["graphs_off"], *SPEC["fixed"]}
    g = sched_compare.groups(SPEC, BATCHES, every)
    fixed = SPEC["fixed"]
    assert g == {"batch1": ["sched-k8", *fixed],  # at batch 1 both twins run budget 64 from its graph
                 **{f"batch{n}": ["sched-k8", "sched-k8-onegraph", *fixed] for n in (4, 8, 16)},
                 "moving": ["sched-k8", *fixed, "dflash", "sched-k8-onegraph"]}
    first, second = paired.repeat_rounds(g, 0), paired.repeat_rounds(g, 1)
    assert first[:4] == [("batch1", n) for n in ["sched-k8", *fixed]]
    assert second[:4] == [("batch1", n) for n in reversed(["sched-k8", *fixed])]
    # a server that does not serve drops out; without the schedule's server nothing is compared
    assert "ddtree-b32-k8" not in sched_compare.groups(SPEC, BATCHES, every - {"ddtree-b32-k8"})["batch8"]
    assert sched_compare.groups(SPEC, BATCHES, every - {"sched-k8"}) == {}


def test_the_round_size_shrinks_before_the_repeats_fall_below_three():
    g = sched_compare.groups(SPEC, BATCHES, {SPEC["server"], SPEC["graphs_off"], SPEC["control"], *SPEC["fixed"]})
    full, three_quarter, half = (paired.repeat_cost(g, s) for s in paired.SCALES)
    assert (full, three_quarter, half) == (99.5, 82.875, 66.25)
    assert paired.plan_rounds(10_000, g) == (paired.MAX_REPEATS, 1.0)
    assert paired.plan_rounds(300, g) == (3, 1.0)
    assert paired.plan_rounds(260, g) == (3, 0.75)  # 2 full repeats would leave every verdict inconclusive
    assert paired.plan_rounds(200, g) == (3, 0.5)
    assert paired.plan_rounds(140, g) == (2, 0.5)  # no size gives 3: the smallest, as many as fit
    assert paired.plan_rounds(10, g) == (1, 0.5)
    last = (1, 0.5)
    for avail in range(0, 1200, 5):
        got = paired.plan_rounds(avail, g)
        assert got[1] >= last[1] and (got[1] != last[1] or got[0] >= last[0]), avail
        last = got


def test_graphs_on_against_off_say_beats_only_when_every_paired_ratio_is_above_one():
    records = []
    for r, (on, off) in enumerate([(1500, 1000), (900, 620), (1210, 800)]):  # drifts 40 %, on / off 1.45-1.51
        records += [rec(r, "batch8", "sched-k8", on), rec(r, "batch8", "sched-k8-onegraph", off)]
    for r, (on, off) in enumerate([(1000, 950), (980, 1010), (1005, 990)]):
        records += [rec(r, "batch16", "sched-k8", on), rec(r, "batch16", "sched-k8-onegraph", off)]
    got = sched_compare.graphs(records, "sched-k8", "sched-k8-onegraph", ["batch8", "batch16"])
    assert got["per_key"]["batch8"]["verdict"] == "beats"
    assert got["per_key"]["batch16"]["verdict"] == "inconclusive (spread 8.2 %)"
    assert got["holds"] is None and got["verdict"] == "inconclusive at batch16"
    two = [x for x in records if x["repeat"] < 2 and x["key"] == "batch8"]
    assert sched_compare.graphs(two, "sched-k8", "sched-k8-onegraph", ["batch8"])["verdict"] == "inconclusive at batch8"


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def time(self):
        return self.t


class _Proc:
    def poll(self):
        return None


class _Server:
    def __init__(self, name: str, role: str = "experiment"):
        self.name, self.status, self.proc, self.port = name, "serving", _Proc(), 0
        self.entry = {"name": name, "role": role, "tags": []}


# tokens/s of each server at each round kind on a machine that does not drift: the schedule 2 % above the best fixed
# budget at each batch, its graphs-off twin slower where its smaller widths run eagerly (batch 4, 8, 16), and over the
# moving load ahead of every fixed budget and DFLASH 16.
BASE = {
    "ddtree-b15-k8": {"batch1": 240, "batch4": 800, "batch8": 1500, "batch16": 2200, "moving": 900},
    "ddtree-b32-k8": {"batch1": 290, "batch4": 900, "batch8": 1400, "batch16": 1900, "moving": 920},
    "ddtree-b64-k8": {"batch1": 320, "batch4": 850, "batch8": 1300, "batch16": 1700, "moving": 940},
    "sched-k8": {"batch1": 326, "batch4": 918, "batch8": 1530, "batch16": 2244, "moving": 1000},
    "sched-k8-onegraph": {"batch1": 326, "batch4": 600, "batch8": 780, "batch16": 1250, "moving": 700},
    "dflash": {"moving": 800},
    "ar": {"batch1": 150, "batch4": 500, "batch8": 900, "batch16": 1400, "moving": 600},
    "nofork-b64-k8": {"batch1": 330, "batch4": 860, "batch8": 1310, "batch16": 1720, "moving": 950},
}


def _fake_machine(monkeypatch, clock, ran):
    """A GPU whose speed drifts by up to 30 % over minutes (as on the H200 of 2026-12-05), each round taking its
    estimated time."""
    def fake_round(server, ps, key, scale=1.0):
        ran.append((key, server.name))
        drift = 1 + 0.3 * math.sin((clock.t - 1000) / 200)
        clock.t += paired.round_cost(key, scale)
        return {"tokens_per_s": round(BASE[server.name][key] * drift, 1), "accept_length": 2.0, "errors": []}

    monkeypatch.setattr(runner, "timed_round", fake_round)
    monkeypatch.setattr(runner, "warm_up", lambda *a: None)
    monkeypatch.setattr(runner, "analyse", lambda *a: None)
    monkeypatch.setattr(runner.time, "time", clock.time)
    monkeypatch.setattr(runner, "say", lambda *a: None)


def _schedule_servers():
    names = ["ar", "dflash", *SPEC["fixed"], "nofork-b64-k8", "sched-k8", "sched-k8-onegraph"]
    return {n: _Server(n) for n in names}


def _rounds(monkeypatch, seconds: float, without: tuple[str, ...] = ()) -> tuple[list, dict, dict]:
    """Set "schedule"'s rounds on the drifting fake GPU with `seconds` left for them: (rounds ran, servers, results)."""
    clock, ran = _Clock(), []
    _fake_machine(monkeypatch, clock, ran)
    servers = {n: s for n, s in _schedule_servers().items() if n not in without}
    results = {n: {"status": "serving"} for n in servers}

    class Args:
        deadline = 1000 + seconds + runner.B_TAIL_S

    runner.schedule_rounds({"schedule": SPEC, "batches": BATCHES}, servers, results, [[1]], Args, lambda: None)
    return ran, servers, results


def test_set_schedule_compares_its_servers_only_in_paired_rounds_and_says_so(monkeypatch):
    ran, servers, results = _rounds(monkeypatch, 360)
    rep = results["schedule"]
    assert rep["budget"]["repeats"] == 3 and rep["budget"]["scale"] == 1.0
    assert rep["rounds"]["repeats_ran"] == 3 and rep["analysed_early"] == list(servers)
    # the comparisons' rounds: every group's servers one right after the other, A B | B A
    compared = ran[:3 * 25]
    assert compared[:4] == [("batch1", n) for n in ["sched-k8", *SPEC["fixed"]]]
    assert compared[25:29] == [("batch1", n) for n in reversed(["sched-k8", *SPEC["fixed"]])]
    assert {n for _, n in compared} == set(servers) - {"ar", "nofork-b64-k8"}
    # then one pass of AR and the leak, which compare with nothing
    assert sorted(ran[75:]) == sorted((k, n) for k in ("batch1", "batch4", "batch8", "batch16", "moving")
                                      for n in ("ar", "nofork-b64-k8"))
    cmp_ = rep["compare"]
    # The drift moves the medians by up to 30 %; the paired ratios stay where the servers are.
    assert [p["verdict"] for p in cmp_["schedule"]["per_batch"]] == ["within 3 %"] * 4
    assert cmp_["schedule"]["verdicts"]["moving"] == "beats every fixed budget and dflash"
    assert cmp_["graphs"]["verdict"] == "graphs on beats graphs off at batch4, batch8, batch16, moving"
    assert results["sched-k8"]["timing"]["method"] == "paired, 3 repeats"
    assert results["ar"]["timing"]["method"] == "single pass, not a comparison"

    lines = runner.summary_lines(results)
    text = "\n".join(lines)
    assert "schedule comparisons, paired rounds: 3 of 3 repeats ran" in text
    assert "per-width graphs (sched-k8 / sched-k8-onegraph): graphs on beats graphs off" in text
    assert "timed alone (single pass, not a comparison): ar, nofork-b64-k8" in text
    ratio_lines = [ln for ln in lines if "paired:" in ln]
    assert len(ratio_lines) == 4 + 4 + 4  # per batch, moving against 3 fixed + DFLASH, graphs at 4 / 8 / 16 / moving
    for ln in ratio_lines:
        assert "spread" in ln and VERDICT.search(ln), ln
    ar_line = next(ln for ln in lines if ln.startswith("ar "))
    assert "single pass, not a comparison" in ar_line and "[" not in ar_line.split("tok/s")[1]


def test_too_little_time_gives_fewer_rounds_and_verdicts_that_say_inconclusive(monkeypatch):
    _, _, results = _rounds(monkeypatch, 120, without=("sched-k8-onegraph",))
    rep = results["schedule"]
    assert rep["rounds"]["repeats_ran"] == 2 and rep["budget"]["scale"] == 0.5
    assert "graphs" not in rep["compare"]
    per_batch = rep["compare"]["schedule"]["per_batch"]
    assert all(p["verdict"].startswith("inconclusive (2 paired repeats") for p in per_batch)
    assert rep["single"]["not_run"].startswith("not run:")
    text = "\n".join(runner.summary_lines(results))
    assert "schedule sched-k8 (issue 38): inconclusive at batch 1, 4, 8, 16" in text
    assert ": within" not in text and ": beats" not in text


def test_a_server_timed_alone_in_one_pass_says_it_is_not_a_comparison():
    one = {"batch1": {"tokens_per_s": 300.0, "step_ms": 3.1}, "batch8": {"tokens_per_s": 1400.0}}
    lines = runner.summary_lines({"ddtree-b15-k8": {"status": "serving", "timing": one}})
    assert "tok/s (single pass, not a comparison) b1 300.0 b8 1400.0" in lines[0]
    sweep = runner.summary_lines({"sweep": {"recommendation": "budget 32"}})  # the product's sweep, set "judge"
    assert sweep == ["sweep (the project's own sgdeploy sweep: one bench pass per server, single pass, not a "
                     "comparison): budget 32"]
    assert not hasattr(runner, "timing_batches")  # one way to time servers against each other: paired rounds


def test_the_runner_runs_set_schedule_through_its_paired_rounds(monkeypatch, tmp_path):
    """main, servers and requests faked: set "schedule"'s plan goes to ``schedule_rounds`` and its summary.txt has
    the paired verdicts."""
    clock, ran = _Clock(), []
    _fake_machine(monkeypatch, clock, ran)
    monkeypatch.setattr(runner.time, "sleep", lambda s: setattr(clock, "t", clock.t + s))

    class FakeProc(_Server):
        def __init__(self, entry, releases, site):
            super().__init__(entry["name"])
            self.entry = entry
            self.log_path = tmp_path / "logs" / f"{self.name}.log"
            self.path_log = tmp_path / "paths" / self.name

        def start(self):
            pass

        def poll(self):
            return "serving"

        def startup_s(self):
            return 1.0

        def stop(self):
            pass

    monkeypatch.setattr(runner, "ServerProc", FakeProc)
    monkeypatch.setattr(runner, "experiment", lambda s, ps, deadline: {"greedy": []})
    monkeypatch.setattr(runner, "analyse_paths", lambda *a: None)
    p = plan.build("schedule")
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"vocab": 16, "prompts": [{"kind": "code", "text": "x", "ids": [1, 2]}]}))
    p["prompts"] = str(prompts)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(p))
    out = tmp_path / "out"
    assert runner.main(["--plan", str(plan_file), "--out", str(out), "--deadline", str(1000 + 500)]) == 0
    summary = (out / "summary.txt").read_text()
    assert "schedule comparisons, paired rounds:" in summary
    assert "per-width graphs (sched-k8 / sched-k8-onegraph)" in summary
    assert json.loads((out / "results.json").read_text())["schedule"]["rounds"]["repeats_ran"] >= 3
