"""DDTree budget schedule (issue 38): the config field's rules, its flag, and the sweep's derivation.

speculative.budget_schedule is a list of {min_batch, budget}; the rules (sgdeploy.config_model) tie it to
speculative.budget (its largest budget, derived when left out), the top-k cap (at most the smallest budget),
the state-forking rule (every scheduled budget) and the memory rule (the buffers are sized for the largest).
sgdeploy.schedule.derive picks a schedule from hand-made sweep tables.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from sgdeploy import render, schedule, spec

SOURCE = Path("configs/case.yml")
SCHED = [{"min_batch": 1, "budget": 64}, {"min_batch": 4, "budget": 32}, {"min_batch": 8, "budget": 15}]


def merged(**speculative) -> dict:
    data = spec.load_merged(spec.CONFIG_DIR / "ddtree-b64.yml")
    data["speculative"].update(speculative)
    return data


def problems(data: dict) -> list[str]:
    with pytest.raises(spec.ConfigError) as err:
        spec.validate(copy.deepcopy(data), SOURCE, "case")
    return err.value.problems


def test_a_schedule_renders_the_server_flag_and_budget_is_its_largest():
    config = spec.validate(merged(budget_schedule=SCHED), SOURCE, "case")
    assert config.speculative.budget == 64
    assert config.speculative.budget_schedule == ((1, 64), (4, 32), (8, 15))
    args = render.launch_args(config, render.HostSettings("r"))
    assert args[args.index("--speculative-ddtree-budget") + 1] == "64"
    assert args[args.index("--speculative-ddtree-budget-schedule") + 1] == "1:64,4:32,8:15"
    # Without a schedule, no flag (the fixed budget's unit is unchanged).
    plain = render.launch_args(spec.load("ddtree-b64"), render.HostSettings("r"))
    assert "--speculative-ddtree-budget-schedule" not in plain


def test_budget_left_out_is_derived_from_the_schedule_and_to_yaml_round_trips(tmp_path):
    config = spec.validate(merged(budget=None, budget_schedule=SCHED[1:2] and
                                  [{"min_batch": 1, "budget": 32}, {"min_batch": 16, "budget": 15}]), SOURCE, "case")
    assert config.speculative.budget == 32
    again = tmp_path / "again.yml"
    again.write_text(spec.to_yaml(config))
    assert spec.load(again).speculative == config.speculative


def test_the_shipped_scheduled_config_validates():
    config = spec.load("ddtree-sched")
    assert config.speculative.budget_schedule == ((1, 64), (4, 32), (8, 15))
    assert config.speculative.budget == 64 and config.speculative.topk_cap <= 15


@pytest.mark.parametrize(("change", "line"), [
    ({"budget": 32, "budget_schedule": SCHED},
     "speculative.budget: 32: with speculative.budget_schedule, must equal its largest budget (64; the buffers are "
     "sized for it), or be left out (null) to take it from the schedule"),
    ({"budget_schedule": SCHED[1:]},
     "speculative.budget_schedule: [{budget: 32, min_batch: 4}, {budget: 15, min_batch: 8}]: the first entry's "
     "min_batch is 4: it must be 1 (every batch size needs a budget)"),
    ({"budget_schedule": [SCHED[0], SCHED[2], SCHED[1]]},
     "speculative.budget_schedule: [{budget: 64, min_batch: 1}, {budget: 15, min_batch: 8}, {budget: 32, "
     "min_batch: 4}]: min_batch 4 after 8: min_batch must increase from entry to entry"),
    ({"budget": None, "budget_schedule": [{"min_batch": 1, "budget": 300}]},
     "speculative.budget_schedule: [{budget: 300, min_batch: 1}]: budget 300 (min_batch 1) must be between 1 and 256"),
    ({"budget": None, "budget_schedule": [{"min_batch": 1}]},
     "speculative.budget_schedule[0]: {min_batch: 1}: must be a mapping of exactly min_batch and budget, whole "
     "numbers (e.g. {min_batch: 4, budget: 32})"),
    ({"budget_schedule": [{"min_batch": 1, "budget": "64"}]},
     "speculative.budget_schedule[0]: {budget: '64', min_batch: 1}: must be a mapping of exactly min_batch and "
     "budget, whole numbers (e.g. {min_batch: 4, budget: 32})"),
    ({"budget_schedule": "1:64,4:32"},
     "speculative.budget_schedule: '1:64,4:32': must be a list of {min_batch, budget} mappings, e.g. "
     "[{min_batch: 1, budget: 64}, {min_batch: 8, budget: 15}]"),
    ({"budget": None, "budget_schedule": []},
     "speculative.budget_schedule: []: must have at least one entry, e.g. [{min_batch: 1, budget: 64}]"),
    ({"budget_schedule": SCHED, "topk_cap": 16},
     "speculative.topk_cap: 16: must not exceed the smallest budget of speculative.budget_schedule (15)"),
])
def test_a_bad_schedule_is_one_line_naming_field_value_and_what_is_allowed(change, line):
    assert problems(merged(**change)) == [f"{SOURCE}: {line}"]


def test_only_ddtree_takes_a_schedule():
    data = spec.load_merged(spec.CONFIG_DIR / "dflash-b16.yml")
    data["speculative"]["budget_schedule"] = SCHED
    assert problems(data) == [f"{SOURCE}: speculative.budget_schedule: [{{budget: 64, min_batch: 1}}, {{budget: 32, "
                              "min_batch: 4}, {budget: 15, min_batch: 8}]: only for algorithm DDTREE, not DFLASH"]


def test_an_entry_beyond_max_running_requests_is_never_reached():
    data = merged(budget_schedule=SCHED)
    data["serving"]["max_running_requests"] = 4
    assert problems(data) == [f"{SOURCE}: speculative.budget_schedule: [{{budget: 64, min_batch: 1}}, {{budget: 32, "
                              "min_batch: 4}, {budget: 15, min_batch: 8}]: min_batch 8 is never reached: "
                              "serving.max_running_requests is 4"]


def test_the_forking_rule_holds_for_every_scheduled_budget():
    """Without state forking on a hybrid model, a scheduled budget above block_size - 1 leaks, at any batch size;
    the reproduce_state_leak opt-in lets it through as it does a fixed budget."""
    leaky = merged(budget_schedule=[{"min_batch": 1, "budget": 15}, {"min_batch": 4, "budget": 32}], budget=None,
                   state_forking=False)
    (line,) = problems(leaky)
    assert line.startswith(f"{SOURCE}: speculative.budget_schedule: [")
    assert "every scheduled budget must be at most block_size - 1 (15)" in line
    leaky["speculative"]["reproduce_state_leak"] = True
    assert spec.validate(leaky, SOURCE, "case").speculative.budget == 32
    within = merged(budget_schedule=[{"min_batch": 1, "budget": 15}, {"min_batch": 4, "budget": 8}], budget=None,
                    state_forking=False)
    assert spec.validate(within, SOURCE, "case").speculative.budget == 15


def test_the_memory_rule_sizes_the_buffers_for_the_largest_scheduled_budget():
    """sgdeploy.budget predicts the forking buffers at the largest budget: a schedule whose largest budget does not
    fit is refused even though its other budgets would."""
    from sgdeploy import budget as budget_rule

    shape = budget_rule.QWEN3_6_27B
    gib = budget_rule.forking_buffer_bytes(shape, 32, 8) / 2**30 + 0.01  # room for budget 32 at 8 requests, not 64
    data = merged(budget_schedule=SCHED)
    data["serving"].update(max_running_requests=8, forking_memory_gib=round(gib, 2))
    (line,) = problems(data)
    assert line.startswith(f"{SOURCE}: speculative.budget: 64: the forking buffers of Qwen/Qwen3.6-27B at 8 running "
                           "request(s) need ")
    assert line.endswith("the largest budget that fits is 32 (the largest of speculative.budget_schedule: the buffers "
                         "are sized for it)")
    data["speculative"]["budget_schedule"] = [{"min_batch": 1, "budget": 32}, {"min_batch": 4, "budget": 15}]
    data["speculative"]["budget"] = None
    assert spec.validate(data, SOURCE, "case").speculative.budget == 32


# --------------------------------------------------------------------------------------------------
# The flag's form (the server parses it and picks the budget per step: tests/unit/series/test_ddtree_schedule.py)


def test_flag_value():
    assert schedule.flag_value(((1, 64), (4, 32), (8, 15))) == "1:64,4:32,8:15"


# --------------------------------------------------------------------------------------------------
# Derivation from hand-made sweep tables


def cells(table: dict[int, dict[int, float]], bad: set[int] = frozenset()) -> list[dict]:
    """{budget: {batch: tokens/s}} -> cells; the budgets in ``bad`` do not qualify (leak or fail a gate)."""
    return [{"budget": b, "batch": n, "tokens_per_s": tps, "accept_length_mean": 10.0, "qualifies": b not in bad}
            for b, row in table.items() for n, tps in row.items()]


def test_the_best_budget_changes_with_the_batch():
    table = {15: {1: 150, 4: 400, 8: 700, 16: 1000},
             32: {1: 170, 4: 420, 8: 650, 16: 900},
             64: {1: 180, 4: 410, 8: 600, 16: 800}}
    out = schedule.derive(cells(table), 0.03)
    assert out["schedule"] == ((1, 64), (4, 32), (8, 15))
    assert out["flag"] == "1:64,4:32,8:15"
    assert [(b["batch"], b["budget"], b["tokens_per_s"]) for b in out["buckets"]] == [
        (1, 64, 180), (4, 32, 420), (8, 15, 700), (16, 15, 1000)]
    assert [c["budget"] for c in out["buckets"][0]["candidates"]] == [15, 32, 64]


def test_one_budget_best_everywhere_is_a_one_entry_schedule():
    table = {15: {1: 100, 4: 300, 8: 500}, 32: {1: 150, 4: 390, 8: 650}, 64: {1: 120, 4: 310, 8: 520}}
    assert schedule.derive(cells(table), 0.03)["schedule"] == ((1, 32),)


def test_a_tie_within_the_tolerance_keeps_the_smaller_budget():
    table = {15: {1: 171, 8: 600}, 32: {1: 175, 8: 590}, 64: {1: 176, 8: 500}}
    out = schedule.derive(cells(table), 0.03)
    assert out["schedule"] == ((1, 15),)  # 171 is within 3% of 176; at batch 8 15 is fastest
    assert out["buckets"][0]["tied_with"] == [32, 64]
    # Tolerance 0: the fastest alone.
    assert schedule.derive(cells(table), 0.0)["schedule"] == ((1, 64), (8, 15))


def test_a_leaking_budget_is_never_chosen_however_fast():
    table = {15: {1: 150, 4: 400}, 32: {1: 300, 4: 800}}
    out = schedule.derive(cells(table, bad={32}), 0.03)
    assert out["schedule"] == ((1, 15),)
    assert [c["qualifies"] for c in out["buckets"][0]["candidates"]] == [True, False]
    assert schedule.derive(cells(table, bad={15, 32}), 0.03) is None


def test_a_batch_without_a_qualifying_budget_keeps_the_previous_bucket():
    table = {15: {1: 150, 4: 400}, 32: {1: 170}}
    data = cells(table) + [{"budget": 32, "batch": 4, "tokens_per_s": None, "qualifies": False}]
    data = [c for c in data if not (c["budget"] == 15 and c["batch"] == 4)]
    out = schedule.derive(data, 0.03)
    assert out["schedule"] == ((1, 32),)
    assert out["buckets"][1]["budget"] == 32
    assert out["buckets"][1]["note"] == ("no qualifying budget measured at this batch size; keeps budget 32 from the "
                                         "smaller batch")


def test_the_first_bucket_starts_at_1_whatever_the_smallest_batch_measured():
    table = {15: {2: 300, 8: 700}, 64: {2: 350, 8: 600}}
    assert schedule.derive(cells(table), 0.03)["schedule"] == ((1, 64), (8, 15))
