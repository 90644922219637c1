"""The end-to-end harness's statistics (tests/gpu/e2e/e2e_stats.py): the near-tie rule, whole-output
checks, accepted-path sibling ranks and their shares. CPU only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "e2e"))

import e2e_stats as st  # noqa: E402

TOL = st.TIE_TOLERANCE_NATS


def step(*pairs):
    """An ``output_top_logprobs`` step as SGLang returns it: [logprob, id, text]."""
    return [[lp, tok, None] for lp, tok in pairs]


AR_IDS = [5, 6, 7]
AR_TOP = [step((-1.0, 5), (-2.0, 9)), step((-1.0, 6), (-1.0 - TOL / 2, 3), (-3.0, 4)), step((-0.5, 7), (-2.5, 1))]


def test_equal_outputs_are_equal():
    assert st.compare_greedy(AR_IDS, AR_TOP, [5, 6, 7])["verdict"] == st.EQUAL


def test_a_flip_to_a_token_within_the_tolerance_is_a_near_tie():
    v = st.compare_greedy(AR_IDS, AR_TOP, [5, 3, 1])
    assert v["verdict"] == st.NEAR_TIE and v["step"] == 1 and v["ar_token"] == 6 and v["cand_token"] == 3
    assert v["gap"] == pytest.approx(TOL / 2)


def test_a_flip_past_the_tolerance_is_a_divergence():
    v = st.compare_greedy(AR_IDS, AR_TOP, [9, 6, 7])
    assert v["verdict"] == st.DIVERGED and v["step"] == 0 and v["cand_gap"] == pytest.approx(1.0)


def test_a_token_the_ar_server_did_not_list_is_a_divergence_even_at_a_tiny_top2_gap():
    v = st.compare_greedy(AR_IDS, AR_TOP, [5, 11, 7])
    assert v["verdict"] == st.DIVERGED and v["gap"] == pytest.approx(TOL / 2) and v["cand_gap"] is None


def test_a_short_output_is_incomplete_and_counts_outside_the_rule():
    v = st.compare_greedy(AR_IDS, AR_TOP, [5, 6])
    assert v["verdict"] == st.INCOMPLETE
    summary = st.summarize_lossless([v, st.compare_greedy(AR_IDS, AR_TOP, AR_IDS)])
    assert summary["outside_rule"] == 1 and summary["equal"] == 1 and summary["flip_rate"] == 0.5


def test_summary_counts_and_lists_the_divergences():
    verdicts = [st.compare_greedy(AR_IDS, AR_TOP, c) for c in ([5, 6, 7], [5, 3, 1], [9, 6, 7], [5, 6, 7])]
    s = st.summarize_lossless(verdicts)
    assert (s["equal"], s["near_tie"], s["diverged"], s["outside_rule"]) == (2, 1, 1, 1)
    assert s["flip_rate"] == 0.5 and s["near_tie_gap_max"] == pytest.approx(TOL / 2)
    assert s["divergences"] == [{"prompt": 2, "step": 0, "ar": 5, "cand": 9, "gap": 1.0, "cand_gap": 1.0}]


def test_teacher_forced_checks_every_token_past_a_first_flip():
    # AR scored the candidate's own prefix: position 1 is a near-tie, position 2 a real error.
    scores = [step((-1.0, 5), (-2.0, 9)), step((-1.0, 6), (-1.0 - TOL / 2, 3)), step((-0.5, 7), (-2.5, 1))]
    out = st.teacher_forced([5, 3, 1], scores)
    assert out == {"checked": 3, "near_ties": 1, "outside_rule": 1, "first_outside": 2, "worst_gap": 2.0}
    assert st.teacher_forced([5, 6, 7], scores)["outside_rule"] == 0


# Tree (verify indices): root 0; 1, 2, 3 children of the root in rank order; 4, 5 children of 2; 6 child of 5.
PARENT = [-1, 0, 0, 0, 2, 2, 5]
FIRST = [1, -1, 4, -1, -1, 6, -1]
SIBLING = [-1, 2, 3, -1, 5, -1, -1]


def test_path_ranks_give_each_accepted_nodes_rank_among_its_siblings():
    assert st.path_ranks([0, 1], PARENT, FIRST, SIBLING) == [0]
    assert st.path_ranks([0, 2, 5, 6], PARENT, FIRST, SIBLING) == [1, 1, 0]
    assert st.path_ranks([0], PARENT, FIRST, SIBLING) == []


def test_a_path_that_is_not_a_parent_chain_is_refused():
    with pytest.raises(ValueError, match="parent"):
        st.path_ranks([0, 4], PARENT, FIRST, SIBLING)


def test_step_rows_read_eagles_global_node_ids():
    width = 7
    # request 0 accepted 0 -> 3 (rank 2); request 1 (same tree) accepted only the root.
    index = [[0, 3, -1], [width, -1, -1]]
    rows = st.step_rows(index, [2, 1], [PARENT, PARENT], [FIRST, FIRST], [SIBLING, SIBLING], width)
    assert rows == [[1, [2]], [0, []]]


def test_path_statistics_shares():
    rows = [[0, []], [1, [0]], [1, [3]], [2, [0, 1]], [3, [2, 0, 0]]]
    s = st.path_statistics(rows)
    assert s["steps"] == 5 and s["accepted_hist"] == {"0": 1, "1": 2, "2": 1, "3": 1}
    assert s["nonfirst_sibling_share"] == 0.6 and s["two_plus_share"] == 0.4 and s["max_rank"] == 3
    assert s["mean_accepted"] == 1.4


def test_server_histograms_merge_by_index():
    assert st.merge_histograms([[2, 1], None, [0, 3, 1]]) == {"0": 2, "1": 4, "2": 1}
