"""The full-size run's numbers on the CPU: the acceptance each budget needs to beat budget 15
(tests/gpu/fullsize/analysis.py), and the runner's step-time and memory summaries (full_runner.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "gpu"
sys.path.insert(0, str(HERE / "fullsize"))
sys.path.insert(0, str(HERE / "e2e"))

import analysis  # noqa: E402
import full_runner  # noqa: E402


def server(batches, b1, bn):
    return {"predicted_bytes": {}, "batches": batches,
            "measure": {f"batch_{batches[0]}": {"step_ms_median": b1}, f"batch_{batches[-1]}": {"step_ms_median": bn}}}


RESULTS = {"plan": "fullsize", "ar": server([1, 8], 14.0, 15.0), "dflash-b16": server([1, 8], 20.0, 25.0),
           "ddtree-b15": server([1, 8], 21.0, 26.0), "ddtree-b32": server([1, 8], 22.4, 30.0),
           "ddtree-b64": server([1, 6], 25.2, 40.0)}


def test_needed_acceptance_is_the_field_acceptance_times_the_step_ratio():
    assert analysis.needed_accept(21.0, 21.0) == 15.0
    assert analysis.needed_accept(25.2, 21.0) == pytest.approx(18.0)
    assert analysis.needed_accept(22.4, 21.0, field_accept=12) == pytest.approx(12.8)
    with pytest.raises(ValueError, match="positive"):
        analysis.needed_accept(0, 21.0)


def test_rows_mark_budgets_that_cannot_reach_the_needed_acceptance():
    rows = {(r["server"], r["batch"]): r for r in analysis.rows(RESULTS)}
    b32, b64 = rows[("ddtree-b32", 1)], rows[("ddtree-b64", 1)]
    assert b32["needed_accept"] == 16.0 and b32["reachable"] is True  # exactly the cap: reachable
    assert b64["needed_accept"] == 18.0 and b64["reachable"] is False and b64["vs_b15"] == 1.2
    assert rows[("ddtree-b15", 1)]["vs_dflash"] == 1.05
    assert rows[("ddtree-b64", 6)]["needed_accept"] is None  # budget 15 did not run batch 6 here
    assert ("ddtree-b64", 8) not in rows
    assert rows[("ddtree-b32", 8)]["needed_accept"] == pytest.approx(15 * 30 / 26, abs=1e-3)
    assert rows[("ar", 1)]["reachable"] is None


def test_a_batch_size_both_ran_is_compared_at_that_size():
    both = {**RESULTS, "ddtree-b15": {"predicted_bytes": {}, "batches": [1, 6, 8], "measure": {
        "batch_1": {"step_ms_median": 21.0}, "batch_6": {"step_ms_median": 25.0}, "batch_8": {"step_ms_median": 26.0}}}}
    rows = {(r["server"], r["batch"]): r for r in analysis.rows(both)}
    assert rows[("ddtree-b64", 6)]["vs_b15"] == 1.6 and rows[("ddtree-b64", 6)]["needed_accept"] == 24.0
    assert rows[("ddtree-b64", 6)]["reachable"] is False


def test_the_cli_writes_the_table_and_the_plot(tmp_path, capsys):
    res = tmp_path / "results.json"
    res.write_text(json.dumps(RESULTS))
    assert analysis.main([str(res), "--out", str(tmp_path / "o")]) == 0
    text = (tmp_path / "o" / "acceptance.md").read_text()
    assert "| ddtree-b64 | 1 | 25.200 | 1.200 | 1.260 | 18.00 | **no** |" in text
    assert (tmp_path / "o" / "acceptance.png").read_bytes()[:4] == b"\x89PNG"
    later = tmp_path / "later.json"  # a second call that ran budget 64 again, faster; and a server that did not run
    later.write_text(json.dumps({"ddtree-b64": server([1, 6], 23.1, 39.0), "ddtree-b32": {"predicted_bytes": {}}}))
    assert analysis.main([str(res), str(later), "--out", str(tmp_path / "m")]) == 0
    merged = (tmp_path / "m" / "acceptance.md").read_text()
    assert "| ddtree-b64 | 1 | 23.100 | 1.100 | 1.155 | 16.50 | **no** |" in merged
    assert "| ddtree-b32 | 1 | 22.400 |" in merged
    assert analysis.main([str(res), "--field-accept", "20"]) == 2
    assert "--field-accept 20: give 1 to --cap (16)" in capsys.readouterr().err
    assert analysis.main([str(tmp_path / "none.json")]) == 2


def test_the_runner_summarises_the_servers_step_samples():
    first = {"e2e_latency": 2.6, "verify_ct": 127, "accept_length": 1.0}
    runs = [{"step_s": [0.020, 0.021, 0.022], "requests": [first]},
            {"step_s": [0.019, 0.021], "requests": [{"error": "URLError: boom"}]}]
    s = full_runner.summarise_batch(runs, "DDTREE")
    assert s["steps"] == 5 and s["step_ms_median"] == 21.0 and s["run_medians_ms"] == [21.0, 20.0]
    assert s["request_step_ms_median"] == pytest.approx(2600 / 127, abs=1e-3)
    assert s["errors"] == ["URLError: boom"] and s["accept_length_mean"] == 1.0
    assert full_runner.per_request_step_s({"e2e_latency": 1.27, "completion_tokens": 128}, "NONE") == 1.27 / 128


def test_the_runner_reads_the_forking_buffers_from_the_server_log():
    log = ("[2026-12-01] Load weight end. type=Qwen3_5ForCausalLM, mem usage=50.12 GB\n"
           "[2026-12-01] Mamba Cache is allocated. max_mamba_cache_size: 16, conv_state size: 0.08GB, "
           "ssm_state size: 2.25GB intermediate_ssm_state_cache size: 20.25GB "
           "intermediate_conv_window_cache size: 0.40GB \n")
    m = full_runner.memory_from_log(log)
    assert m["forking_gib"] == 20.65 and m["ssm_state_gib"] == 2.25
    assert len(m["lines"]) == 2
    assert full_runner.memory_from_log("nothing") == {"lines": []}


RECORDED = sorted((Path(__file__).resolve().parents[3] / "docs" / "results").glob("fullsize-*"))


@pytest.mark.parametrize("folder", RECORDED, ids=[p.name for p in RECORDED])
def test_the_recorded_acceptance_table_is_what_its_raw_results_give(folder, tmp_path):
    """docs/results/benchmarks-history.md quotes these tables: each must come out of the raw results next to it,
    the calls merged in their order (a later call's server wins), by the script in the repository."""
    calls = sorted(folder.glob("results-call*.json"))
    assert calls, f"{folder}: no raw results"
    assert analysis.main([*map(str, calls), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "acceptance.md").read_text() == (folder / "acceptance.md").read_text()
