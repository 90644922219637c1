"""The benchmark: what it sends, what it measures, and how it reports failures and time limits."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import pytest
from engine_stub import ROOT, StubEngine, free_port, simulator

from sgdeploy import bench


def test_the_repository_prompt_set_is_varied_and_fixed():
    prompts = bench.load_prompts()
    assert len(prompts) >= 16
    assert len({p.id for p in prompts}) == len(prompts)
    assert len({p.text for p in prompts}) == len(prompts)
    # The digest identifies the set: a changed prompt changes it (baselines are then not compared).
    changed = prompts[:-1] + [bench.Prompt(prompts[-1].id, prompts[-1].text + "!")]
    assert bench.prompts_digest(changed) != bench.prompts_digest(prompts)


@pytest.mark.parametrize("content, message", [
    ('{"id": "a", "text": "x"}\nnot json\n', "line 2: not JSON"),
    ('{"id": "a", "text": ""}\n', "line 1: needs a string id and a non-empty string text"),
    ("\n\n", "has no prompts"),
])
def test_load_prompts_names_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(bench.BenchError, match=message) as err:
        bench.load_prompts(path)
    assert str(path) in str(err.value)


def test_accept_length_prefers_the_reported_value_then_the_ratio():
    assert bench.accept_length({"spec_accept_length": 3.5, "completion_tokens": 32, "spec_verify_ct": 4}) == 3.5
    assert bench.accept_length({"completion_tokens": 32, "spec_verify_ct": 4}) == 8.0
    assert bench.accept_length({"completion_tokens": 32, "spec_verify_ct": 0}) is None
    assert bench.accept_length({"completion_tokens": 32}) is None


def test_run_sends_greedy_requests_and_aggregates_per_request_values():
    # Accept lengths alternate 8 and 4 (32 tokens over 4 or 8 verify steps): mean 6, stdev of the sample.
    with StubEngine(tokens=32, verify_ct=[4, 8], delay=0.05) as stub:
        result = bench.run(stub.url, requests=6, concurrency=1, max_new_tokens=32, timeout=30)
        assert stub.calls == 6
    assert result.completed == 6 and result.failed == 0 and result.completed_fraction == 1.0
    assert result.total_completion_tokens == 6 * 32
    assert result.accept_length_mean == pytest.approx(6.0)
    assert result.accept_length_stdev == pytest.approx(statistics.stdev([8, 4, 8, 4, 8, 4]), abs=1e-3)
    assert result.accept_length_requests == 6
    # step time: e2e latency 0.5 s over 4 or 8 verify steps
    assert result.step_time_ms_mean == pytest.approx((125 + 62.5) / 2)
    assert result.tokens_per_s == pytest.approx(result.total_completion_tokens / result.wall_s, rel=1e-3)
    assert [s.prompt_id for s in result.samples[:2]] == [p.id for p in bench.load_prompts()[:2]]


def test_run_against_the_simulator_is_json_and_round_trips(tmp_path):
    with simulator(tmp_path) as sim:
        result = bench.run(sim.url, requests=6, concurrency=3, max_new_tokens=48, timeout=60)
    data = json.loads(json.dumps(result.to_dict()))
    assert bench.BenchResult.from_dict(data) == result
    assert data["completed"] == 6 and data["failed"] == 0
    assert all(s["completion_tokens"] == 48 for s in data["samples"])  # ignore_eos: exactly max_new_tokens
    assert all(s["spec_verify_ct"] > 0 for s in data["samples"])
    assert 3 < data["accept_length_mean"] <= 16  # DDTree budget 15, block 16, state forking on
    assert data["tokens_per_s"] > 0 and data["step_time_ms_mean"] > 0
    assert set(data) >= {"tokens_per_s", "accept_length_mean", "accept_length_stdev", "completed", "failed",
                         "step_time_ms_mean", "errors", "samples", "prompts_digest", "wall_s"}


def test_run_stops_at_the_time_limit_and_counts_the_rest_as_failed():
    with StubEngine(delay=3) as stub:
        start = time.monotonic()
        result = bench.run(stub.url, requests=4, concurrency=2, max_new_tokens=8, timeout=0.5)
        elapsed = time.monotonic() - start
    assert elapsed < 2
    assert result.completed == 0 and result.failed == 4 and result.tokens_per_s == 0.0
    messages = {e["message"] for e in result.errors}
    assert any("time limit (0.5 s)" in m for m in messages)


def test_run_records_errors_when_the_engine_crashes(tmp_path):
    with simulator(tmp_path, env={"SGLANG_SIM_CRASH_AFTER": "2"}) as sim:
        result = bench.run(sim.url, requests=6, concurrency=1, max_new_tokens=16, timeout=30)
    assert result.completed <= 2 and result.failed >= 4
    assert sum(e["count"] for e in result.errors) == result.failed
    assert all(not s.ok and s.error for s in result.samples if not s.ok)


def test_run_rejects_bad_counts():
    with pytest.raises(bench.BenchError, match="concurrency 0 must be a whole number of at least 1"):
        bench.run("http://127.0.0.1:1", requests=1, concurrency=0)


def test_cli_prints_a_line_or_json_and_exits_by_outcome():
    with StubEngine(tokens=16, verify_ct=4) as stub:
        ok = subprocess.run([sys.executable, "-m", "sgdeploy.bench", "--url", stub.url, "--requests", "2",
                             "--max-tokens", "16", "--json"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["accept_length_mean"] == 4.0
    down = subprocess.run([sys.executable, "-m", "sgdeploy.bench", "--url", f"http://127.0.0.1:{free_port()}",
                           "--requests", "1"], cwd=ROOT, capture_output=True, text=True)
    assert down.returncode == 1 and "0/1 requests completed" in down.stdout
    bad = subprocess.run([sys.executable, "-m", "sgdeploy.bench", "--url", "http://127.0.0.1:1", "--prompts",
                          "/nonexistent.jsonl"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "prompt file /nonexistent.jsonl: cannot read it" in bad.stderr
    assert "Traceback" not in bad.stderr
