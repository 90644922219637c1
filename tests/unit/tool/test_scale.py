"""tests/lab/scale_table.py (the rollout at scale, docs/router.md "At scale") and the arithmetic of
tests/lab/scale_probe.py (the controller's cost per host): formulas, the fit, the super-linear flags,
the alias inventory, and that the docs hold what the table script prints."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "lab"))

import scale_probe as sp  # noqa: E402
import scale_table as st  # noqa: E402

X = st.Inputs(engine_lab_s=50, sim_start_s=2, gpu_start_s=100, weights_s=0, host_s=10, engines_per_host=4)


def test_one_engine_takes_the_lab_time_with_the_real_start_in_place_of_the_simulators():
    assert X.engine_s == 148


def test_today_rolls_batches_of_hosts_each_host_engine_by_engine():
    r = st.per_host(8, 2, X)
    assert r.wall_s == 4 * (10 + 4 * 148)
    assert r.held == (1 - 2 / 32,)
    # SERIAL above the host count is one batch of all of them.
    assert st.per_host(2, 5, X).wall_s == 10 + 4 * 148


def test_the_fleet_model_is_a_canary_then_batches_of_max_unavailable():
    r = st.fleet(8, 3, X)   # 32 engines: canary, then ceil(31 / 3) = 11 batches
    assert r.wall_s == 10 * 3 + 148 + 11 * 148
    assert r.held == (31 / 32, 29 / 32)
    assert r.min_held == 29 / 32
    # max_unavailable 1 costs what today's SERIAL=1 costs: the fleet router buys one endpoint and a
    # fleet-wide canary, not speed, until more than one engine may be out.
    assert st.fleet(8, 1, X).wall_s == st.per_host(8, 1, X).wall_s


def test_bad_counts_are_refused():
    with pytest.raises(ValueError):
        st.per_host(0, 1, X)
    with pytest.raises(ValueError):
        st.fleet(2, 0, X)
    assert st.main(["--engines-per-host", "0"]) == 2


def test_durations_read_as_minutes_hours_or_days():
    assert st.duration(600) == "10 min"
    assert st.duration(3 * 3600) == "3.0 h"
    assert st.duration(3 * 86400) == "3.0 d"


def test_the_docs_hold_the_table_the_script_prints():
    text = (REPO / "docs" / "router.md").read_text()
    begin, end = "<!-- scale_table.py begin -->", "<!-- scale_table.py end -->"
    assert begin in text and end in text, "docs/router.md lacks the At scale table's markers"
    held = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert held == st.document(st.Inputs()), "docs/router.md's At scale table is stale: rerun tests/lab/scale_table.py"


def test_the_fit_finds_the_cost_per_host():
    a, b = sp.linear_fit([(2, 12.0), (8, 30.0), (32, 102.0)])
    assert math.isclose(a, 6.0) and math.isclose(b, 3.0)
    assert sp.growth_exponent([(2, 4.0), (8, 64.0)]) == pytest.approx(2.0)
    assert sp.marginal_costs([(2, 12.0), (8, 30.0), (32, 102.0)]) == [3.0, 3.0]


def test_linear_costs_are_not_flagged_and_quadratic_ones_are():
    linear = [(n, 5 + 3.0 * n) for n in (2, 8, 32, 128)]
    quadratic = [(n, 5 + 3.0 * n + 0.05 * n * n) for n in (2, 8, 32, 128)]
    assert not sp.superlinear(linear, 1.5)
    assert sp.superlinear(quadratic, 1.5)


def test_a_task_whose_time_per_host_grows_is_flagged():
    def run(n, quad):
        return {"hosts": n, "tasks": {"steady": {"starts": n, "cpu_s": 0.5 * n},
                                      "scan": {"starts": n, "cpu_s": 0.01 * n * (n if quad else 1)}}}
    flags = sp.task_flags([run(2, True), run(8, True), run(128, True)], 1.5, 0.5)
    assert [f["task"] for f in flags] == ["scan"]
    assert sp.task_flags([run(2, False), run(8, False), run(128, False)], 1.5, 0.5) == []


def test_noise_in_a_tasks_share_is_not_flagged():
    # Up and down between sizes, or up by less than min_delta_s per host: the late reaping of workers.
    def run(n, per_host):
        return {"hosts": n, "tasks": {"t": {"starts": n, "cpu_s": per_host * n}}}
    assert sp.task_flags([run(2, 0.04), run(8, 0.03), run(128, 0.08)], 1.5, 0.5) == []
    assert sp.task_flags([run(2, 0.04), run(8, 0.06), run(128, 0.08)], 1.5, 0.5) == []
    assert sp.task_flags([run(2, 0.04), run(8, 0.06), run(128, 0.10)], 1.5, 0.5)[0]["task"] == "t"


def test_earlier_outputs_are_summarized_again(tmp_path, capsys):
    runs = [{"hosts": n, "ok": True, "tasks": {},
             "steps": {s: {"rc": 0, "wall_s": 1.0 + 2.0 * n, "cpu_s": 0.5 + n} for s in ("validate", "hosts", "plan")}}
            for n in (2, 8, 32)]
    earlier = tmp_path / "a.json"
    earlier.write_text(__import__("json").dumps({"runs": runs, "summary": {}}))
    assert sp.main(["--summarize", str(earlier), "--out", str(tmp_path / "b.json")]) == 0
    assert "plan.cpu_s" in capsys.readouterr().out


def test_the_aliases_point_at_the_lab_hosts_in_turn_each_with_its_own_ssh_socket():
    lab = sp.lab_hosts({"all": {"children": {"gpu_hosts": {"hosts": {
        "lab1": {"ansible_host": "127.0.45.1", "gpu_count": 8}, "lab2": {"ansible_host": "127.0.45.2"}}}}}})
    hosts = sp.alias_inventory(lab, 3)["all"]["children"]["gpu_hosts"]["hosts"]
    assert list(hosts) == ["scale-001", "scale-002", "scale-003"]
    assert [h["ansible_host"] for h in hosts.values()] == ["127.0.45.1", "127.0.45.2", "127.0.45.1"]
    assert hosts["scale-003"]["gpu_count"] == 8 and hosts["scale-003"]["scale_probe_alias_of"] == "lab1"
    assert len({h["ansible_control_path"] for h in hosts.values()}) == 3
    assert "ansible_control_path" not in sp.alias_inventory(lab, 2, shared_ssh=True)["all"]["children"][
        "gpu_hosts"]["hosts"]["scale-001"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert sp.main(["--inventory", str(tmp_path / "none.yml")]) == 2
    assert sp.main(["--hosts", "two"]) == 2
    empty = tmp_path / "inv.yml"
    empty.write_text("all: {}\n")
    assert sp.main(["--inventory", str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("scale_probe: ") for line in err)
