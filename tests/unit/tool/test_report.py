"""Sweep report: cliff detection, recommendation, warning, and the three files (issue 10)."""

from __future__ import annotations

import json
import struct

import pytest

from sgdeploy import report


def row(budget, cap, acc, tps, status="ok", **kw):
    if status != "ok":
        return report.variant_row(budget, cap, status=status, error=kw.get("error", "deploy failed: x"))
    return report.variant_row(budget, cap, accept_length_mean=acc, accept_length_sd=0.3, tokens_per_s=tps,
                              step_time_ms=80.0, requests=12, failures=0, **kw)


# The simulator's no-forking curve (tests/sim/README.md): a cliff right after block_size - 1 = 15.
NOFORK = [row(8, 8, 9.0, 112.9), row(15, 8, 15.0, 172.8), row(32, 8, 7.2, 92.2), row(64, 8, 4.8, 63.4)]
FORK = [row(8, 8, 9.0, 112.9), row(15, 8, 15.0, 172.8), row(32, 8, 15.6, 177.8), row(64, 8, 15.65, 178.9)]


def results_of(rows, **kw):
    return report.build_results(config="ddtree-b15-nofork", host="lab1", started="2025-01-01T00:00:00Z",
                                finished="2025-01-01T00:05:00Z", variants=rows, **kw)


def test_cliff_right_after_15_and_best_before_it_with_a_warning():
    res = results_of(NOFORK)
    assert res["cliff"] == {"budget": 32, "topk_cap": 8, "drop_pct": 52.0}
    assert res["best"]["budget"] == 15 and res["best"]["tokens_per_s"] == 172.8
    assert "budget 15 cap 8" in res["recommendation"] and "cliff at budget 32" in res["recommendation"]
    assert res["warning"] is not None and "right before the acceptance cliff: budget 32" in res["warning"]


def test_no_cliff_recommends_the_best_and_says_there_is_none():
    res = results_of(FORK)
    assert res["cliff"] is None and res["cliffs"] == []
    assert res["best"]["budget"] == 64 and res["fastest"]["budget"] == 64
    assert res["recommendation"].startswith("no acceptance cliff up to budget 64")
    assert "tied" not in res["recommendation"]
    assert res["warning"] is None


# The simulator's forking curve as measured: 32 and 64 within 1%, 64 a little slower.
FORK_MEASURED = [row(15, 8, 15.0, 172.8), row(32, 8, 15.63, 177.8), row(64, 8, 15.65, 176.7)]


def test_a_larger_budget_tied_with_the_fastest_is_recommended_and_the_tie_is_named():
    res = results_of(FORK_MEASURED)
    assert res["fastest"]["budget"] == 32
    assert res["best"]["budget"] == 64
    assert res["recommendation"] == (
        "no acceptance cliff up to budget 64 (no drop above 25% from the best so far); recommended: budget 64 "
        "cap 8: 176.7 tokens/s, accept length 15.65 (tied within 3% with budget 15 cap 8 at 172.8 and budget 32 "
        "cap 8 at 177.8 tokens/s; the larger tree accepts at least as much, so it is recommended)")
    md = report.markdown(res)
    assert "| 32 | 8 | 15.63 | 0.30 | 177.8 | 80.0 | 12 | 0 | no | - | - | - | - | ok (fastest) |" in md
    assert "| 64 | 8 | 15.65 | 0.30 | 176.7 | 80.0 | 12 | 0 | no | - | - | - | - | ok (best) |" in md
    # 172.8 is 2.8% below 177.8: inside 3%, so 15 ties too, and the largest of the three still wins.


def test_outside_the_tolerance_the_fastest_is_recommended():
    res = results_of(FORK_MEASURED, tie_tolerance=0.005)
    assert res["best"]["budget"] == 32 and "tied" not in res["recommendation"]
    res = results_of(FORK_MEASURED, tie_tolerance=0)
    assert res["best"]["budget"] == 32
    slower = [row(15, 8, 15.0, 172.8), row(32, 8, 15.63, 177.8), row(64, 8, 15.65, 170.0)]
    assert results_of(slower)["best"]["budget"] == 32  # 4.4% slower is a real cost, not a tie


def test_a_tie_never_recommends_a_budget_at_or_past_the_cliff():
    # 32 collapsed (the cliff) but happens to be as fast as 15: the recommendation stays before the cliff.
    rows = [row(8, 8, 9.0, 112.9), row(15, 8, 15.0, 172.8), row(32, 8, 10.0, 172.0), row(64, 8, 4.8, 63.4)]
    res = results_of(rows)
    assert res["cliff"]["budget"] == 32
    assert res["best"]["budget"] == 15
    assert "right before the acceptance cliff: budget 32" in res["warning"]


def test_a_tie_across_caps_prefers_the_larger_budget_then_the_larger_cap():
    rows = [row(32, 4, 14.0, 176.0), row(32, 8, 15.6, 177.0), row(16, 8, 15.1, 177.5)]
    assert (results_of(rows)["best"]["budget"], results_of(rows)["best"]["topk_cap"]) == (32, 8)


@pytest.mark.parametrize("bad", [-0.01, 0.5, 2, "0.03", True])
def test_a_bad_tie_tolerance_is_rejected_naming_it(bad):
    with pytest.raises(report.ReportError, match="tie tolerance"):
        results_of(FORK, tie_tolerance=bad)


def test_noise_below_the_threshold_is_no_cliff_but_a_bigger_drop_is():
    noisy = [row(8, 8, 9.0, 110), row(15, 8, 15.0, 170), row(32, 8, 11.4, 150), row(64, 8, 14.0, 160)]
    # 11.4 is 24% below 15.0: under the default 25%.
    assert results_of(noisy)["cliff"] is None
    # With a 20% threshold the same drop is the cliff; the drop is measured from the best so far (15.0 at 15).
    res = results_of(noisy, cliff_drop=0.20)
    assert res["cliff"] == {"budget": 32, "topk_cap": 8, "drop_pct": 24.0}
    # A drop from the best so far, not from the previous budget: 14.0 after 11.4 is a rise, and 10 after
    # a plateau of 15 is 33% down even though the step before it fell only a little.
    slope = [row(8, 8, 15.0, 1), row(16, 8, 13.0, 1), row(24, 8, 11.5, 1), row(32, 8, 10.0, 1)]
    assert results_of(slope)["cliff"]["budget"] == 32


def test_rows_are_taken_in_budget_order_whatever_order_they_ran_in():
    shuffled = [NOFORK[3], NOFORK[1], NOFORK[0], NOFORK[2]]
    assert results_of(shuffled)["cliff"]["budget"] == 32


def test_several_caps_each_get_their_own_cliff_and_the_first_is_reported():
    rows = [row(8, 4, 8.0, 100), row(15, 4, 13.4, 157.7), row(32, 4, 12.9, 150), row(64, 4, 5.0, 60),
            row(8, 8, 9.0, 112.9), row(15, 8, 15.0, 172.8), row(32, 8, 7.2, 92.2), row(64, 8, 4.8, 63.4)]
    res = results_of(rows)
    assert [(c["topk_cap"], c["budget"]) for c in res["cliffs"]] == [(4, 64), (8, 32)]
    assert res["cliff"]["budget"] == 32 and res["cliff"]["topk_cap"] == 8
    assert res["best"]["topk_cap"] == 8 and res["best"]["budget"] == 15
    assert "right before" in res["warning"]


def test_best_far_from_its_cliff_gets_no_warning():
    rows = [row(8, 8, 9.0, 180.0), row(15, 8, 15.0, 172.8), row(32, 8, 7.2, 92.2)]
    res = results_of(rows)
    assert res["cliff"]["budget"] == 32 and res["best"]["budget"] == 8
    assert res["warning"] is None


def test_failed_rows_are_skipped_and_kept_in_the_table():
    rows = [NOFORK[0], NOFORK[1], row(32, 8, None, None, status="failed", error="deploy failed: GATE FAILED smoke"),
            NOFORK[3]]
    res = results_of(rows)
    # 64 is the first measured budget after 15: the cliff moves there.
    assert res["cliff"]["budget"] == 64
    assert res["variants"][2]["status"] == "failed"
    md = report.markdown(res)
    assert "failed: deploy failed: GATE FAILED smoke" in md


def test_nothing_measured_recommends_nothing():
    res = results_of([row(8, 8, None, None, status="failed")])
    assert res["best"] is None and res["cliff"] is None
    assert res["recommendation"] == "no variant recommended: no variant was measured (1 of 1 failed)"


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "0.25", True])
def test_a_bad_cliff_drop_is_rejected_naming_it(bad):
    with pytest.raises(report.ReportError, match="cliff drop"):
        report.find_cliffs(NOFORK, bad)


def test_results_md_has_the_table_cliff_and_recommendation():
    res = results_of(NOFORK, restored="ddtree-b15")
    md = report.markdown(res)
    assert md.startswith("# Sweep of ddtree-b15-nofork on lab1")
    assert ("| budget | top-k cap | accept length | sd | tokens/s | step ms | requests | failures | leaks | smoke | "
            "exactness | throughput | acceptance | status |") in md
    assert "| 15 | 8 | 15.00 | 0.30 | 172.8 | 80.0 | 12 | 0 | no | - | - | - | - | ok (best) |" in md
    assert "| 32 | 8 | 7.20 | 0.30 | 92.2 | 80.0 | 12 | 0 | no | - | - | - | - | ok (cliff) |" in md
    assert "**Cliff**: budget 32 (cap 8), accept length down 52.0% from the best so far." in md
    assert "**Recommendation**: acceptance cliff at budget 32" in md
    assert "**Warning**:" in md and "restored ddtree-b15" in md


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def test_write_gives_json_of_the_documented_shape_md_and_a_png(tmp_path):
    res = results_of(NOFORK, restored="ddtree-b15")
    paths = report.write(res, tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert {"schema", "config", "host", "started", "finished", "variants", "cliff", "best", "recommendation",
            "warning", "restored"} <= set(data)
    assert data["schema"] == 1 and data["restored"] == "ddtree-b15"
    for v in data["variants"]:
        assert set(report.VARIANT_KEYS) <= set(v)
        assert v["status"] in ("ok", "failed")
    assert set(data["cliff"]) == {"budget", "topk_cap", "drop_pct"}
    assert data["best"]["budget"] == 15
    assert paths["md"].read_text() == report.markdown(res)
    width, height = png_size(paths["png"])
    assert (width, height) == (750, 650)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.json", "results.md", "sweep.png"]


def test_png_is_written_with_several_caps_a_failed_row_and_no_cliff(tmp_path):
    rows = FORK + [row(8, 4, 8.0, 100), row(15, 4, None, None, status="failed")]
    paths = report.write(results_of(rows), tmp_path)
    assert png_size(paths["png"]) == (750, 650)
    assert json.loads(paths["json"].read_text())["cliff"] is None


def test_a_row_missing_a_key_is_refused():
    bad = dict(NOFORK[0])
    del bad["tokens_per_s"]
    with pytest.raises(report.ReportError, match="missing tokens_per_s"):
        results_of([bad])


def test_png_with_a_tie_band_is_written(tmp_path):
    res = results_of(FORK_MEASURED)
    assert res["best"] is not res["fastest"]
    paths = report.write(res, tmp_path)
    assert png_size(paths["png"]) == (750, 650)
    assert "ok (fastest)" in paths["md"].read_text()


def test_a_variant_that_fails_exactness_is_shown_and_never_recommended():
    """The fastest variant gives wrong tokens (a state leak): the sweep must not recommend it (issue 22)."""
    rows = [row(15, 8, 10.0, 150.0, exactness={"verdict": "pass"}),
            row(32, 8, 11.0, 200.0, exactness={"verdict": "fail", "reason": "prompt x01 ..."})]
    res = results_of(rows)
    assert res["best"]["budget"] == 15
    assert res["recommendation"].endswith("; not recommended: budget 32 cap 8 (exactness fail)")
    md = report.markdown(res)
    assert ("| 32 | 8 | 11.00 | 0.30 | 200.0 | 80.0 | 12 | 0 | no | - | fail | - | - | ok (not recommended: "
            "exactness fail) |") in md
    assert "| 15 | 8 | 10.00 | 0.30 | 150.0 | 80.0 | 12 | 0 | no | - | pass | - | - | ok (best) |" in md


# --------------------------------------------------------------------------------------------------
# Issue 33 item 3: the sweep tells the whole truth. Rows as the sweep writes them: ``leaks`` (spec's rule:
# no state forking above block_size - 1 on a recurrent model), each of the deploy's four gates' verdict
# and ``gates_failed`` (the gates that would stop a deploy). The numbers are the simulator's shape; they
# prove the plumbing, not how SGLang behaves.

def gated(budget, acc, tps, leak=False, failed=(), cap=8, **verdicts):
    gates = {g: {"verdict": "pass", "reason": "x"} for g in ("smoke", "exactness", "throughput", "acceptance")}
    for g in failed:
        gates[g]["verdict"] = "fail"
    for g, v in verdicts.items():
        gates[g]["verdict"] = v
    return row(budget, cap, acc, tps, leaks=leak, gates=gates, gates_failed=list(failed),
               exactness={"verdict": gates["exactness"]["verdict"], "reason": "x"})


# ddtree-b15-nofork over 8 15 16 32 64: budget 16 leaks but is as fast as 15 (the tie picked it before).
NOFORK_16 = [gated(8, 9.0, 112.9), gated(15, 15.0, 172.8, exactness="inconclusive"),
             gated(16, 14.4, 173.0, leak=True, exactness="inconclusive"),
             gated(32, 7.2, 92.2, leak=True, failed=("acceptance",)),
             gated(64, 4.8, 63.4, leak=True, failed=("throughput", "acceptance"))]


def test_a_leaking_budget_is_never_recommended_nor_fastest_however_fast():
    res = results_of(NOFORK_16)
    assert (res["best"]["budget"], res["fastest"]["budget"]) == (15, 15)
    assert "recommended: budget 15 cap 8" in res["recommendation"]
    assert ("not recommended: budget 16 cap 8 (leaks: no state forking above block_size - 1), budget 32 cap 8 "
            "(leaks: no state forking above block_size - 1; acceptance fail)") in res["recommendation"]
    assert [v["not_recommended"] != [] for v in res["variants"]] == [False, False, True, True, True]


def test_a_variant_that_fails_any_gate_is_never_recommended():
    rows = [gated(15, 15.0, 150.0), gated(32, 15.6, 200.0, failed=("throughput",))]
    res = results_of(rows)
    assert (res["best"]["budget"], res["fastest"]["budget"]) == (15, 15)
    assert res["recommendation"].endswith("not recommended: budget 32 cap 8 (throughput fail)")
    # An inconclusive gate that the deploy counts as not passed (recorded in gates_failed) also disqualifies.
    rows = [gated(15, 15.0, 150.0), gated(32, 15.6, 200.0, failed=("smoke",), smoke="inconclusive")]
    assert results_of(rows)["best"]["budget"] == 15
    # An inconclusive exactness verdict that does not stop the deploy does not.
    rows = [gated(15, 15.0, 150.0), gated(32, 15.6, 200.0, exactness="inconclusive")]
    assert results_of(rows)["best"]["budget"] == 32


def test_when_nothing_qualifies_nothing_is_recommended_and_the_text_says_why():
    rows = [gated(16, 14.4, 173.0, leak=True), gated(32, 7.2, 92.2, leak=True, failed=("acceptance",))]
    res = results_of(rows)
    assert res["best"] is None and res["fastest"] is None and res["warning"] is None
    assert res["recommendation"] == (
        "no variant recommended: no measured variant qualifies; not recommended: budget 16 cap 8 (leaks: no "
        "state forking above block_size - 1), budget 32 cap 8 (leaks: no state forking above block_size - 1; "
        "acceptance fail)")


def test_results_md_has_a_leaks_column_and_all_four_gate_verdicts():
    md = report.markdown(results_of(NOFORK_16))
    assert ("| leaks | smoke | exactness | throughput | acceptance | status |") in md
    assert ("| 15 | 8 | 15.00 | 0.30 | 172.8 | 80.0 | 12 | 0 | no | pass | inconclusive | pass | pass | "
            "ok (best) |") in md
    assert ("| 16 | 8 | 14.40 | 0.30 | 173.0 | 80.0 | 12 | 0 | yes | pass | inconclusive | pass | pass | ok (not "
            "recommended: leaks: no state forking above block_size - 1) |") in md
    assert ("| 64 | 8 | 4.80 | 0.30 | 63.4 | 80.0 | 12 | 0 | yes | pass | pass | fail | fail | ok (not recommended: "
            "leaks: no state forking above block_size - 1; throughput fail, acceptance fail) |") in md


def test_a_simulated_host_is_said_to_prove_the_plumbing_only():
    md = report.markdown(results_of(NOFORK_16, simulated=True))
    assert "**Simulated**: the host runs the lab's simulated engine (tests/sim): these numbers prove the " \
           "plumbing, not how SGLang behaves." in md
    assert "**Simulated**" not in report.markdown(results_of(NOFORK_16))


def _capture_figure(monkeypatch):
    """The figure sweep.png is saved from, captured at savefig (works whatever builds it)."""
    from matplotlib.figure import Figure

    saved = {}
    original = Figure.savefig

    def savefig(self, *a, **k):
        self.canvas.draw()
        saved["fig"] = self
        saved["labels"] = [[(t.get_text(), t.get_window_extent()) for t in ax.get_xticklabels()
                            if t.get_visible() and t.get_text()] for ax in self.axes]
        saved["legend"] = [t.get_text() for ax in self.axes if ax.get_legend()
                           for t in ax.get_legend().get_texts()]
        saved["markers"] = [c.get_paths()[0].vertices.tolist() for ax in self.axes for c in ax.collections]
        return original(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def test_the_plot_marks_leaking_and_gate_failing_variants(tmp_path, monkeypatch):
    saved = _capture_figure(monkeypatch)
    report.write(results_of(NOFORK_16), tmp_path)
    legend = " / ".join(saved["legend"])
    assert "leaks (no state forking): never recommended" in legend
    assert "a gate not passed: never recommended" in legend


def test_tick_labels_never_overlap_with_many_budgets_and_caps(tmp_path, monkeypatch):
    budgets = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15, 16, 17, 18, 20, 24, 28, 32, 40, 48, 56, 64, 96, 128, 192, 256]
    rows = [row(b, min(c, b), 10.0 + c / 10, 100 + b + c) for b in budgets for c in (1, 2, 4, 8, 16)]
    saved = _capture_figure(monkeypatch)
    report.write(results_of(rows), tmp_path)
    for labels in saved["labels"]:
        for i, (text_a, a) in enumerate(labels):
            for text_b, b in labels[i + 1:]:
                assert a.x1 <= b.x0 or b.x1 <= a.x0, f"tick labels {text_a} and {text_b} overlap"
    shown = [t for labels in saved["labels"] for t, _ in labels]
    assert "1" in shown and "256" in shown  # the ends stay labelled
    # Few budgets far apart keep every label.
    saved = _capture_figure(monkeypatch)
    report.write(results_of(NOFORK), tmp_path)
    assert [t for labels in saved["labels"] for t, _ in labels] == ["8", "15", "32", "64"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_the_report_files_share_one_mode_whatever_the_umask(tmp_path, umask):
    import os

    old = os.umask(umask)
    try:
        paths = report.write(results_of(NOFORK), tmp_path / "out")
    finally:
        os.umask(old)
    modes = {name: oct(p.stat().st_mode & 0o777) for name, p in paths.items()}
    assert modes == {"json": "0o644", "md": "0o644", "png": "0o644"}
