"""The simulator's --speculative-ddtree-budget-schedule (issue 38; test equipment, not SGLang's behaviour).

Each decode step uses the budget of the last entry with min_batch <= the running batch size, with the model's
acceptance and step time at that budget, and the Decode batch line says the budget.
"""

from __future__ import annotations

import threading

import pytest
from test_sim import HYBRID, Sim, ddtree, load_model, run_cli

SCHEDULE = ["--speculative-ddtree-budget-schedule", "1:64,4:32,8:15"]
FORK = "ddtree.fork.topk.abcdef12"


def test_each_step_takes_the_budget_of_its_batch_size_and_its_acceptance():
    m = load_model()
    cfg = m.SpecConfig(algorithm="DDTREE", budget=64, hybrid=True, fork=True, fused_topk=True)
    engine = m.Engine.__new__(m.Engine)  # no scheduler thread: step_config alone
    engine.cfg, engine.accept_mean, engine.schedule = cfg, m.mean_accept(cfg), ((1, 64), (4, 32), (8, 15))
    for running, budget in ((1, 64), (3, 64), (4, 32), (7, 32), (8, 15), (40, 15)):
        step_cfg, mean = engine.step_config(running)
        assert (step_cfg.budget, engine.step_budget) == (budget, budget)
        assert mean == pytest.approx(m.mean_accept(m.SpecConfig(algorithm="DDTREE", budget=budget, hybrid=True,
                                                                 fork=True, fused_topk=True)))
    # An override (or a collapse) of the configured budget's acceptance scales the scheduled ones alike.
    engine.accept_mean = m.mean_accept(cfg) / 2
    assert engine.step_config(8)[1] == pytest.approx(m.mean_accept(m.SpecConfig(
        algorithm="DDTREE", budget=15, hybrid=True, fork=True, fused_topk=True)) / 2)


@pytest.mark.parametrize(("schedule", "budget", "words"), [
    ("1:64,4-32", "64", "entry '4-32' is not min_batch:budget"),
    ("2:64,4:32", "64", "min_batch must start at 1 and increase"),
    ("1:64,8:32,4:15", "64", "min_batch must start at 1 and increase"),
    ("1:64,4:32", "32", "--speculative-ddtree-budget (32) must equal the largest scheduled budget"),
])
def test_a_bad_schedule_exits_2_with_one_line(tmp_path, schedule, budget, words):
    r = run_cli(tmp_path, FORK, ddtree(int(budget)) + ["--speculative-ddtree-budget-schedule", schedule])
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang_sim: error: argument --speculative-ddtree-budget-schedule: ") and words in last
    assert "Traceback" not in r.stderr


def test_a_stock_release_refuses_the_schedule_flag(tmp_path):
    r = run_cli(tmp_path, "stock", ["--model-path", HYBRID, "--speculative-algorithm", "DFLASH",
                                    "--speculative-draft-model-path", "d", *SCHEDULE])
    assert r.returncode == 2 and "--speculative-ddtree-budget-schedule" in r.stderr.strip().splitlines()[-1]


def test_the_decode_batch_line_says_the_budget_of_the_running_batch(tmp_path):
    sim = Sim(tmp_path, "sched", FORK, ddtree(64) + SCHEDULE, {"SGLANG_SIM_SLOWDOWN": "0.05"})
    try:
        sim.wait_ready()
        assert "DDTree budget schedule: 64 from 1 running, 32 from 4 running, 15 from 8 running" in sim.log
        one = sim.generate("alone", 64)["meta_info"]
        # long enough that a 40-step log window closes while all four run
        threads = [threading.Thread(target=sim.generate, args=(f"four {i}", 2000)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lines = [ln for ln in sim.log.splitlines() if "Decode batch." in ln]
        assert any("#running-req: 1," in ln and ln.endswith("ddtree budget: 64") for ln in lines), lines
        assert any("#running-req: 4," in ln and ln.endswith("ddtree budget: 32") for ln in lines), lines
        for ln in lines:  # each line: the running batch of the window's last step and that step's budget
            running = int(ln.split("#running-req: ")[1].split(",")[0])
            assert ln.endswith(f"ddtree budget: {64 if running < 4 else 32 if running < 8 else 15}"), ln
        assert one["completion_tokens"] == 64
    finally:
        sim.stop()
