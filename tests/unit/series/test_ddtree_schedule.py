"""The budget schedule's parser and table (patch 0005, patches/sglang/src/.../speculative/ddtree_schedule.py), loaded
from the series' source: it needs neither torch nor SGLang."""

from __future__ import annotations

import pytest
import series_source


@pytest.fixture(scope="module")
def sched():
    return series_source.load("speculative/ddtree_schedule.py")


def test_each_batch_size_takes_the_last_entry_at_or_below_it(sched):
    s = sched.BudgetSchedule.from_text("1:64,4:32,8:15", max_bs=16)
    assert [s.budget_for(n) for n in range(1, 17)] == [64] * 3 + [32] * 4 + [15] * 9
    assert s.budget_for(5000) == 15  # beyond the host table
    assert (s.largest, s.smallest, s.budgets, str(s)) == (64, 15, (15, 32, 64), "1:64,4:32,8:15")


def test_a_bucket_above_the_table_is_still_honoured(sched):
    s = sched.BudgetSchedule.from_text("1:15,2000:8", max_bs=64)
    assert s.budget_for(64) == 15 and s.budget_for(1999) == 15 and s.budget_for(2000) == 8


def test_a_budget_may_rise_with_the_batch(sched):
    """The schedule is data, not a rule: a sweep may find a larger tree pays at a larger batch."""
    s = sched.BudgetSchedule.from_text("1:15,8:32", max_bs=16)
    assert s.budget_for(7) == 15 and s.budget_for(8) == 32 and s.largest == 32


@pytest.mark.parametrize("text, words", [
    ("", "is empty"), ("  ", "is empty"), ("2:8", "must start at min_batch 1"), ("1:8,1:9", "must rise strictly"),
    ("1:8,4:4,2:2", "must rise strictly"), ("1:x", "not min_batch:budget"), ("1-8", "not min_batch:budget"),
    ("1:8:9", "not min_batch:budget"), ("1:0", "budget must be 1 to 1024"), ("1:8,4:2000", "budget must be 1 to 1024"),
    ("0:8", "min_batch must be 1"), ("1:-8", "not min_batch:budget"), ("1:8,,4:4", "not min_batch:budget"),
])
def test_a_bad_schedule_names_the_flag_the_value_and_what_is_allowed(sched, text, words):
    with pytest.raises(ValueError) as err:
        sched.parse(text)
    msg = str(err.value)
    assert msg.startswith("--speculative-ddtree-budget-schedule") and words in msg, msg
    assert "\n" not in msg.replace(repr(text), "")
