"""Paired, interleaved timing of set "derive" (issue 38 item 3, tests/gpu/e2e/paired.py and the runner's
``paired_rounds``): the order the rounds run in, medians and paired ratios, the three verdicts (among them on the
H200 run of 2026-12-05's real numbers, which must never read "within"), and how many repeats fit a deadline."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "e2e"))

import derive  # noqa: E402
import paired  # noqa: E402
import runner  # noqa: E402


def rec(repeat: int, key: str, server: str, tps: float | None, errors: list | None = None) -> dict:
    return {"repeat": repeat, "key": key, "server": server, "tokens_per_s": tps, "accept_length": 2.0,
            "errors": errors or []}


def test_servers_alternate_a_b_then_b_a_within_each_batch_size_of_every_repeat():
    groups = {"batch1": ["d", "b64", "b32"], "batch16": ["d", "b64"], "moving": ["d", "b15", "dflash"]}
    assert paired.repeat_rounds(groups, 0) == [
        ("batch1", "d"), ("batch1", "b64"), ("batch1", "b32"), ("batch16", "d"), ("batch16", "b64"),
        ("moving", "d"), ("moving", "b15"), ("moving", "dflash")]
    assert paired.repeat_rounds(groups, 1) == [
        ("batch1", "b32"), ("batch1", "b64"), ("batch1", "d"), ("batch16", "b64"), ("batch16", "d"),
        ("moving", "dflash"), ("moving", "b15"), ("moving", "d")]
    assert paired.repeat_rounds(groups, 2) == paired.repeat_rounds(groups, 0)


def test_a_round_is_at_least_three_seconds_at_the_fastest_measured_rates_and_the_same_prompts_for_everyone():
    fastest = {1: 324.3, 4: 1078.8, 8: 1837.5, 16: 2704.8}  # DDTREE 64, H200 2026-12-05, timed first
    for n, rate in fastest.items():
        count = paired.round_requests(n)
        assert count % n == 0 and count * 128 / rate >= 3.0, (n, count)
        assert paired.round_requests(n, 0.5) % n == 0 and paired.round_requests(n, 0.5) < count
    ps = [[i] for i in range(64)]
    assert paired.pick(ps, 8) == [[0], [8], [16], [24], [32], [40], [48], [56]]
    assert paired.pick(ps, 70)[64:] == ps[:6]


def test_medians_spread_and_paired_ratios_use_the_rounds_of_one_repeat():
    records = [rec(0, "batch8", "d", 1000), rec(0, "batch8", "b64", 1010), rec(0, "batch8", "b32", 900),
               rec(1, "batch8", "b32", 700), rec(1, "batch8", "b64", 800), rec(1, "batch8", "d", 790),
               rec(2, "batch8", "d", 1200), rec(2, "batch8", "b64", 1190), rec(2, "batch8", "b32", 1250),
               rec(3, "batch8", "d", 5000, errors=["ConnectionError"]), rec(3, "batch8", "b64", 1000)]
    s = paired.summarise(records)
    assert s["d"]["batch8"]["tokens_per_s"] == 1000 and s["d"]["batch8"]["n"] == 3
    assert (s["d"]["batch8"]["min"], s["d"]["batch8"]["max"]) == (790, 1200)
    assert s["d"]["batch8"]["errors"] == ["ConnectionError"]  # counted, never in the numbers
    assert s["b64"]["batch8"]["tokens_per_s"] == 1005.0  # median of four
    got = paired.paired_ratios(records, "d", ["b64", "b32"], "batch8")
    assert [(p["repeat"], p["against"]) for p in got] == [(0, "b64"), (1, "b64"), (2, "b32")]
    assert [p["ratio"] for p in got] == [round(1000 / 1010, 4), round(790 / 800, 4), round(1200 / 1250, 4)]
    # The drift between repeats (1000 -> 790 -> 1200) is 50 %, the paired ratios stay within 4 %.
    assert paired.ratio_stats([p["ratio"] for p in got])["spread_pct"] < 4


@pytest.mark.parametrize(("ratios", "verdict"), [
    ([0.99, 1.01, 0.98], "within 3 %"),
    ([1.02, 0.975, 1.0, 0.99, 0.985], "within 3 %"),
    ([0.90, 0.92, 0.95], "not within 3 %"),
    ([0.95, 1.00, 0.99], "inconclusive (spread 5.0 %)"),
    ([0.99, 1.0], "inconclusive (2 paired repeats, at least 3 needed)"),
    ([], "inconclusive (0 paired repeats, at least 3 needed)"),
])
def test_within_only_when_every_paired_ratio_allows_it(ratios, verdict):
    got = paired.judge_within(ratios)
    assert got["verdict"] == verdict
    assert got["holds"] == {"w": True, "n": False, "i": None}[verdict[0]]


@pytest.mark.parametrize(("ratios", "verdict"), [
    ([1.05, 1.02, 1.10], "beats"), ([0.9, 1.0, 0.95], "does not beat"),
    ([1.05, 0.99, 1.02], "inconclusive (spread 6.0 %)"),
    ([1.2, 1.3], "inconclusive (2 paired repeats, at least 3 needed)"),
])
def test_beats_only_when_every_paired_ratio_is_above_one(ratios, verdict):
    assert paired.judge_beats(ratios)["verdict"] == verdict


def _run_of_2026_12_05() -> list[dict]:
    """The H200 run's real numbers as paired rounds: ddtree-b64-k8 timed first (repeat 0) and retimed ~3 minutes
    later (repeat 1), sched-derived (schedule 1:64: the same server) timed once, beside both."""
    b64 = [{"batch1": 324.3, "batch4": 1078.8, "batch8": 1837.5, "batch16": 2704.8, "moving": 973.0},
           {"batch1": 263.3, "batch4": 859.8, "batch8": 1411.1, "batch16": 1886.6, "moving": 821.6}]
    derived = {"batch1": 248.4, "batch4": 826.8, "batch8": 1334.9, "batch16": 2024.3, "moving": 793.5}
    others = {"ddtree-b15-k8": 1125.3, "ddtree-b32-k8": 833.5, "dflash": 953.4}
    out = []
    for r in (0, 1):
        for key, v in derived.items():
            out += [rec(r, key, "sched-derived", v), rec(r, key, "ddtree-b64-k8", b64[r][key])]
        out += [rec(r, "moving", n, v) for n, v in others.items()]
    return out


@pytest.mark.parametrize("min_n", [paired.MIN_REPEATS, 2])
def test_the_real_numbers_of_2026_12_05_never_read_within(min_n, monkeypatch):
    monkeypatch.setattr(paired, "MIN_REPEATS", min_n)
    monkeypatch.setattr(paired.judge_within, "__defaults__", (paired.WITHIN, min_n))
    monkeypatch.setattr(paired.judge_beats, "__defaults__", (min_n,))
    records = _run_of_2026_12_05()
    got = derive.compare(records, "sched-derived", ["ddtree-b15-k8", "ddtree-b32-k8", "ddtree-b64-k8"], "dflash",
                         {n: ["ddtree-b64-k8"] for n in (1, 4, 8, 16)})
    verdicts = {p["batch"]: p["verdict"] for p in got["per_batch"]}
    assert all(v.startswith(("inconclusive", "not within")) for v in verdicts.values()), verdicts
    assert got["holds"]["every_batch_within"] is not True and got["holds"]["moving_beats_all"] is not True
    if min_n == 2:  # even on two repeats: batch 1, 4 and 8 clearly below 0.97, batch 16 0.75 / 1.07 apart
        assert [verdicts[n] for n in (1, 4, 8)] == ["not within 3 %"] * 3
        assert verdicts[16] == "inconclusive (spread 32.5 %)"
        assert got["moving"]["ddtree-b15-k8"]["verdict"] == "does not beat"
        assert got["verdicts"]["batches"] == "not within 3 % of the best fixed budget at batch 1, 4, 8"
    text = "\n".join(derive.lines({"flag": "1:64", "from": [], "compare": got}))
    assert ": within 3 %" not in text and "beats every" not in text and ": beats" not in text


def test_compare_and_summary_say_within_and_beats_only_where_the_rounds_tell():
    records = []
    for r in range(3):
        records += [rec(r, "batch1", "d", 300 + r), rec(r, "batch1", "b64", 302 + r),
                    rec(r, "batch16", "d", 2000 + 50 * r), rec(r, "batch16", "b15", 2100 - 60 * r),
                    rec(r, "moving", "d", 1000), rec(r, "moving", "b64", 950 + 10 * r), rec(r, "moving", "b15", 900),
                    rec(r, "moving", "dflash", 990 + 7 * r)]
    got = derive.compare(records, "d", ["b15", "b64"], "dflash", {1: ["b64"], 16: ["b15"]})
    verdicts = [(p["batch"], p["verdict"]) for p in got["per_batch"]]
    assert verdicts == [(1, "within 3 %"), (16, "inconclusive (spread 10.8 %)")]
    assert got["holds"] == {"every_batch_within": None, "moving_beats_all": None}
    assert got["verdicts"]["batches"] == "inconclusive at batch 16"
    assert got["verdicts"]["moving"] == "inconclusive against dflash"
    lines = derive.lines({"flag": "1:64", "from": ["b15", "b64"], "compare": got})
    assert any(ln.startswith("issue 38 item 3: inconclusive at batch 16") for ln in lines), lines


def test_contenders_are_the_fastest_and_any_budget_that_came_within_three_percent_of_it():
    records = []
    for r, (b15, b32, b64) in enumerate([(800, 1000, 1100), (820, 1080, 1090), (790, 990, 1120)]):
        records += [rec(r, "batch8", "b15", b15), rec(r, "batch8", "b32", b32), rec(r, "batch8", "b64", b64)]
    assert paired.contenders(records, ["b15", "b32", "b64"], "batch8") == ["b32", "b64"]
    records[4]["tokens_per_s"] = 1000  # b32 never within 3 % of b64 now
    assert paired.contenders(records, ["b15", "b32", "b64"], "batch8") == ["b64"]


def test_the_repeats_shrink_with_the_time_left_and_never_below_one():
    a, b = 24.0, 55.0  # the estimates of a derive call (half rounds for phase A, 2 servers a batch + moving for B)
    assert paired.fit_repeats(10_000, a, b) == (paired.MAX_REPEATS, paired.MAX_REPEATS)
    assert paired.fit_repeats(240, a, b) == (3, 3)  # the derive call with servers serving at ~t+170 s
    assert paired.fit_repeats(160, a, b) == (2, 2)
    assert paired.fit_repeats(20, a, b) == (1, 1)
    last = (paired.MAX_REPEATS, paired.MAX_REPEATS)
    for avail in range(1000, 0, -7):
        got = paired.fit_repeats(avail, a, b)
        assert got[0] <= last[0] and got[1] <= last[1] and min(got) >= 1
        assert got[0] * a + got[1] * b <= max(avail, a + b)
        last = got
    assert paired.next_repeat_fits(100, 160, [], 55) and not paired.next_repeat_fits(100, 150, [], 55)
    assert not paired.next_repeat_fits(100, 160, [40, 61], 10)  # the longest repeat so far, not the estimate


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def time(self):
        return self.t


def test_the_runner_stops_the_repeats_at_the_stop_time_and_says_how_many_ran(monkeypatch):
    clock, ran = _Clock(), []

    def fake_round(server, ps, key, scale=1.0):
        ran.append((key, server))
        clock.t += 3.5 * scale
        return {"tokens_per_s": 100.0, "accept_length": 2.0, "errors": []}

    monkeypatch.setattr(runner, "timed_round", fake_round)
    monkeypatch.setattr(runner.time, "time", clock.time)
    monkeypatch.setattr(runner, "say", lambda *a: None)
    groups = {"batch1": ["d", "b64"], "batch16": ["d", "b64"]}  # 4 rounds: 14 s a repeat
    records, info = runner.paired_rounds({"d": "d", "b64": "b64"}, [[1]], groups, 5, 1000 + 40, 1.0, 14.0)
    assert info["repeats_ran"] == 2 and info["repeats_planned"] == 5 and "repeat 3 not run" in info["stopped"]
    assert ran[:4] == [("batch1", "d"), ("batch1", "b64"), ("batch16", "d"), ("batch16", "b64")]
    assert ran[4:] == [("batch1", "b64"), ("batch1", "d"), ("batch16", "b64"), ("batch16", "d")]
    assert {r["repeat"] for r in records} == {0, 1}
    clock.t, ran[:] = 1000.0, []
    records, info = runner.paired_rounds({"d": "d", "b64": "b64"}, [[1]], groups, 3, 1000 + 5, 0.5, 7.0, min_repeats=1)
    assert info["repeats_ran"] == 1 and len(ran) == 4  # phase A runs one repeat even past its stop time
