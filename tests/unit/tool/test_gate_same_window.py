"""A canary's gates against an old replica measured side by side with it, in the same window (issue 24).

The throughput and acceptance verdicts take two baselines: the last good record of the replica, and the
bench of an old replica (still on the old config) run at the same time with the same prompts. A canary
worse than the old replica fails even when the record alone would let it pass."""

from __future__ import annotations

import time

from engine_stub import StubEngine
from test_gate import bench_dict, record_with, thresholds

from sgdeploy import gate, records

PEER = "http://127.0.0.1:31203"


def peer_bench(**kw) -> dict:
    return bench_dict(url=PEER, **kw)


def test_throughput_fails_below_the_old_replica_in_the_same_window_though_the_record_passes():
    t = thresholds(min_tokens_per_s=100, max_regression_pct=15)
    record = record_with(bench_dict(tokens_per_s=160.0))
    alone = gate.throughput(bench_dict(tokens_per_s=150.0), t, record)
    assert alone.verdict == "pass"  # 6.2% below the record: allowed
    r = gate.throughput(bench_dict(tokens_per_s=150.0), t, record, peer_bench(tokens_per_s=190.0))
    assert r.verdict == "fail" and r.baseline == 160.0
    assert r.reason == (f"tokens_per_s 150 is 21.1% below the old replica in the same window ({PEER}) (190); "
                        "allowed 15%")
    assert r.details["same_window"] == {"url": PEER, "value": 190.0, "change_pct": -21.05, "compared": True}


def test_acceptance_fails_below_the_old_replica_in_the_same_window_though_the_record_passes():
    t = thresholds(min_accept_length=4, max_regression_pct=15)
    record = record_with(bench_dict(accept_length_mean=5.0))
    cand = bench_dict(accept_length_mean=4.8)
    assert gate.acceptance(cand, t, record).verdict == "pass"
    r = gate.acceptance(cand, t, record, peer=peer_bench(accept_length_mean=15.0))
    assert r.verdict == "fail"
    assert "accept_length 4.8 is 68.0% below the old replica in the same window" in r.reason
    assert r.details["same_window"]["value"] == 15.0 and r.details["requests"] == 6  # both kinds of details


def test_a_canary_as_good_as_the_old_replica_passes_and_says_by_how_much_against_both():
    t = thresholds(min_tokens_per_s=100, max_regression_pct=15)
    r = gate.throughput(bench_dict(tokens_per_s=170.0), t, record_with(bench_dict(tokens_per_s=160.0)),
                        peer_bench(tokens_per_s=180.0))
    assert r.verdict == "pass"
    assert "6.2% above the last good deploy (160); allowed 15% below" in r.reason
    assert f"5.6% below the old replica in the same window ({PEER}) (180); allowed 15% below" in r.reason
    assert r.details["same_window"]["compared"] is True


def test_an_old_replica_whose_bench_did_not_complete_is_recorded_not_compared_and_the_canary_is_inconclusive():
    # Issue 34 item 3: "only 8 of 12 ... not compared" used to pass, and the rollout went on.
    r = gate.throughput(bench_dict(tokens_per_s=150.0), thresholds(min_tokens_per_s=100),
                        None, peer_bench(tokens_per_s=10.0, completed=2, completed_fraction=0.33))
    assert r.verdict == "inconclusive" and not r.passed
    assert "only 2 of 6 of its bench requests completed: not compared" in r.reason
    assert r.reason.endswith("the canary's same-window comparison could not be made: inconclusive")
    assert r.details["same_window"] == {"url": PEER, "value": None, "change_pct": None, "compared": False}


def test_an_old_replica_measured_differently_is_not_compared():
    r = gate.throughput(bench_dict(tokens_per_s=150.0), thresholds(min_tokens_per_s=100), None,
                        peer_bench(tokens_per_s=400.0, max_new_tokens=8))
    assert r.verdict == "inconclusive" and "measured differently (max_new_tokens 8 vs 48): not compared" in r.reason


def test_without_an_old_replica_nothing_changes():
    r = gate.throughput(bench_dict(tokens_per_s=150.0), thresholds(min_tokens_per_s=100))
    assert "same_window" not in r.details and "old replica" not in r.reason


def test_run_all_measures_the_canary_and_the_old_replica_at_the_same_time_and_records_both():
    t = thresholds(min_tokens_per_s=10, min_accept_length=2, max_regression_pct=15)
    # Both stubs answer each request in 0.5 s: one after the other, the two benches (2 rounds each)
    # would take 2 s; side by side, 1 s.
    with StubEngine(delay=0.5, tokens=32) as canary, StubEngine(delay=0.5, tokens=32, verify_ct=2) as old:
        start = time.monotonic()
        report = gate.run_all(canary.url, t, True, None, ["throughput", "acceptance"], peer_url=old.url)
        took = time.monotonic() - start
        assert canary.calls == 6 and old.calls == 6
    assert took < 1.7, took
    assert report.peer_bench.url == old.url
    assert report.peer_bench.prompts_digest == report.bench.prompts_digest
    thr, acc = report.results
    assert thr.verdict == "pass" and thr.details["same_window"]["compared"]
    # The old replica accepts 16 tokens a step (32 / 2), the canary 8 (32 / 4): 50% below it.
    assert acc.verdict == "fail" and acc.details["same_window"]["value"] == 16.0
    assert "accept_length 8 is 50.0% below the old replica in the same window" in acc.reason
    lines = report.lines()
    assert any(line.startswith(f"same window, old replica {old.url}: 6/6 requests completed") for line in lines)
    data = report.to_dict()
    assert data["same_window"]["url"] == old.url and "samples" not in data["same_window"]["bench"]
    rec = records.build_record(config="lab-replicas-b32-r0", host="lab1", release="r", outcome="rolled_back",
                               started="2026-01-01T00:00:00Z", report=data)
    assert rec["same_window"]["bench"]["accept_length_mean"] == 16.0
    assert rec["bench"]["accept_length_mean"] == 8.0


def test_an_old_replica_that_does_not_answer_makes_the_canary_inconclusive():
    with StubEngine(tokens=32) as canary:
        report = gate.run_all(canary.url, thresholds(min_tokens_per_s=10, min_accept_length=2), True, None,
                              ["throughput"], peer_url="http://127.0.0.1:9", bench_timeout=10)
    (thr,) = report.results
    # Issue 34 item 3: the canary is not known to be as good as the old replicas; the rollout stops there.
    assert thr.verdict == "inconclusive" and thr.details["same_window"]["compared"] is False
    assert "of its bench requests completed: not compared" in thr.reason
    assert not report.passed
