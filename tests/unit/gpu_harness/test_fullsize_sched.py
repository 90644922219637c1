"""The scheduled server's check on the CPU (tests/gpu/fullsize/sched_check.py): its step at each batch size
against the fixed budget its schedule picks, and the CUDA graphs' memory the runner reads from the server log
(full_runner.graphs_from_log). Synthetic results; the log lines are SGLang 0.5.23's and patch 0005's formats."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "gpu"
sys.path.insert(0, str(HERE / "fullsize"))
sys.path.insert(0, str(HERE / "e2e"))

import full_runner  # noqa: E402
import sched_check  # noqa: E402

SCHED_LOG = (
    "[2026-12-06 10:00:01] Capture target verify CUDA graph end. bs=[1, 6, 8], elapsed=9.87 s, mem usage=1.23 GB, "
    "avail mem=30.00 GB.\n"
    "[2026-12-06 10:00:05] DDTREE schedule: target verify graphs at widths [16, 33] (bs [1, 6, 8]), the extra ones "
    "in 3.2 s, 0.53 GiB.\n")
EAGER_LOG = ("[2026-12-06 10:00:05] DDTREE schedule: budgets other than 32 verify eagerly "
             "(SGLANG_DDTREE_SCHEDULE_GRAPHS=1 captures graphs for them).\n")


def measured(steps: dict[int, float], **extra) -> dict:
    return {"predicted_bytes": {}, "batches": sorted(steps), **extra,
            "measure": {f"batch_{b}": {"step_ms_median": ms} for b, ms in steps.items()}}


RESULTS = {
    "plan": "fullsize",
    "ddtree-b15": measured({1: 20.2, 6: 27.3, 8: 29.8}),
    "ddtree-b32": measured({1: 22.4, 6: 38.4, 8: 48.0}),
    "ddtree-sched": measured({1: 22.9, 6: 27.5, 8: 31.0}, budget_schedule=[[1, 32], [6, 15]],
                             memory=full_runner.memory_from_log(SCHED_LOG)),
}


def test_the_schedules_budget_is_the_last_entry_at_or_below_the_batch():
    assert [sched_check.budget_at([[1, 32], [6, 15]], b) for b in (1, 5, 6, 8)] == [32, 32, 15, 15]
    with pytest.raises(ValueError, match="no entry for batch 1"):
        sched_check.budget_at([[2, 32]], 1)


def test_each_batch_is_compared_with_the_fixed_budget_the_schedule_picked():
    rows = {r["batch"]: r for r in sched_check.rows(RESULTS, {"ddtree-b15": "a.json", "ddtree-b32": "b.json"})}
    assert sorted(rows) == [1, 6, 8]
    assert (rows[1]["budget"], rows[1]["fixed"], rows[1]["fixed_step_ms"]) == (32, "ddtree-b32", 22.4)
    assert rows[1]["ratio"] == round(22.9 / 22.4, 4) and rows[1]["within"] is True  # +2.2 %
    assert (rows[6]["fixed"], rows[6]["ratio"], rows[6]["within"]) == ("ddtree-b15", round(27.5 / 27.3, 4), True)
    assert rows[8]["ratio"] == round(31.0 / 29.8, 4) and rows[8]["within"] is False  # +4.0 %: not within 3 %
    assert rows[6]["fixed_source"] == "a.json"


def test_a_fixed_server_that_did_not_run_leaves_the_ratio_empty():
    rows = sched_check.rows({k: v for k, v in RESULTS.items() if k != "ddtree-b32"}, {})
    one = next(r for r in rows if r["batch"] == 1)
    assert one["fixed_step_ms"] is None and one["ratio"] is None and one["within"] is None


def test_the_runner_reads_the_graphs_memory_from_the_server_log():
    g = full_runner.memory_from_log(SCHED_LOG)["graphs"]
    assert g["capture_gib"] == {"target verify": 1.23}
    assert g["schedule_graphs"] == {"widths": [16, 33], "bs": "[1, 6, 8]", "extra_s": 3.2, "extra_gib": 0.53}
    assert len(full_runner.memory_from_log(SCHED_LOG)["graph_lines"]) == 2
    eager = full_runner.memory_from_log(EAGER_LOG)["graphs"]
    assert "schedule_graphs" not in eager and "verify eagerly" in eager["schedule_eager"]
    unread = full_runner.graphs_from_log(SCHED_LOG.replace("0.53 GiB", "? GiB"))
    assert unread["schedule_graphs"]["extra_gib"] is None
    assert "graphs" not in full_runner.memory_from_log("Load weight end. mem usage=50.12 GB")


def test_the_cli_writes_the_table_and_names_where_each_fixed_number_came_from(tmp_path, capsys):
    now = tmp_path / "results.json"
    now.write_text(json.dumps({k: v for k, v in RESULTS.items() if k != "ddtree-b32"}))
    earlier = tmp_path / "earlier.json"  # ddtree-b32 from an earlier call (docs/results/...)
    earlier.write_text(json.dumps({"ddtree-b32": RESULTS["ddtree-b32"]}))
    assert sched_check.main([str(earlier), str(now), "--out", str(tmp_path / "o")]) == 0
    text = (tmp_path / "o" / "schedule.md").read_text()
    assert f"| ddtree-sched | 1 | 32 | 22.900 | ddtree-b32 | 22.400 | 1.0223 | yes | {earlier} |" in text
    assert f"| ddtree-sched | 8 | 15 | 31.000 | ddtree-b15 | 29.800 | 1.0403 | **no** | {now} |" in text
    assert "the extra ones 0.53 GiB in 3.2 s" in text and "target verify 1.23 GiB" in text
    assert "- ddtree-b32: no graph lines in its results" in text
    assert text in capsys.readouterr().out
    assert sched_check.main([str(now), "--tolerance", "3", "--out", str(tmp_path)]) == 2
    assert "--tolerance 3: give a fraction between 0 and 1" in capsys.readouterr().err
    assert sched_check.main([str(tmp_path / "none.json"), "--out", str(tmp_path)]) == 2


def test_eager_widths_are_said_in_the_table(tmp_path):
    res = {**RESULTS, "ddtree-sched": {**RESULTS["ddtree-sched"], "memory": full_runner.memory_from_log(EAGER_LOG)}}
    (tmp_path / "r.json").write_text(json.dumps(res))
    assert sched_check.main([str(tmp_path / "r.json"), "--out", str(tmp_path)]) == 0
    assert "**no per-width graphs**" in (tmp_path / "schedule.md").read_text()
