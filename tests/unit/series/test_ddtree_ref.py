"""The plain-Python DDTree reference builder: hand-checked cases, invariants, brute force, ties."""

from __future__ import annotations

import itertools
import random

import pytest

from sgdeploy.ddtree_ref import ROOT, Tree, build_tree, build_trees, f32, max_nodes


def _lp(rows):
    return [[f32(v) for v in row] for row in rows]


def _ids(d, k):
    return [[100 * (i + 1) + r for r in range(k)] for i in range(d)]


def test_hand_checked_small_tree():
    # depth 1: ranks 0,1 with -0.1, -1.0; depth 2: -0.2, -0.5
    lp = [[-0.1, -1.0], [-0.2, -0.5]]
    t = build_tree(lp, _ids(2, 2), budget=4)
    # scores: (0)=-0.1, (0,0)=-0.3, (0,1)=-0.6, (1)=-1.0, (1,0)=-1.2
    assert [t.path(i) for i in range(4)] == [(0,), (0, 0), (0, 1), (1,)]
    assert t.parent == [ROOT, 0, 0, ROOT]
    assert t.depth == [1, 2, 2, 1]
    assert t.token == [100, 200, 201, 101]
    assert t.score == pytest.approx([-0.1, -0.3, -0.6, -1.0], abs=1e-6)
    assert t.verify_parent() == [-1, 0, 1, 1, 0]
    assert t.next_token() == [1, 2, -1, -1, -1]
    assert t.next_sibling() == [-1, 4, 3, -1, -1]
    mask = t.ancestor_mask()
    assert mask[3] == [True, True, False, True, False]
    assert mask[4] == [True, False, False, False, True]


def test_chain_when_k_is_one_and_exhaustion():
    t = build_tree([[-0.5], [-0.5], [-0.5]], _ids(3, 1), budget=10)
    assert len(t) == 3 == max_nodes(3, 1)
    assert t.parent == [ROOT, 0, 1]
    assert t.next_sibling() == [-1] * 4


def test_budget_one_and_errors():
    t = build_tree([[-1.0, -2.0]], _ids(1, 2), budget=1)
    assert t.path(0) == (0,)
    with pytest.raises(ValueError):
        build_tree([[-1.0, -2.0]], _ids(1, 2), budget=0)
    with pytest.raises(ValueError):
        build_tree([[-2.0, -1.0]], _ids(1, 2), budget=2)  # not sorted


def test_tie_break_prefers_earlier_parent():
    # All log-probs equal: every candidate ties; the earlier-selected parent wins, so the
    # root's children come first (parent -1), then node 0's children, ...
    lp = [[-1.0, -1.0], [0.0, 0.0]]
    t = build_tree(lp, _ids(2, 2), budget=6)
    # (0)=-1, then tie between (1)=-1 [parent root] and (0,0)=-1 [parent 0]: root wins.
    assert [t.path(i) for i in range(6)] == [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]


def test_tie_break_is_independent_of_input_order_of_equal_scores():
    lp = [[-0.5, -0.5, -0.5]]
    t = build_tree(lp, _ids(1, 3), budget=3)
    assert [t.rank[i] for i in range(3)] == [0, 1, 2]


def _check_invariants(t: Tree, k: int):
    paths = [t.path(i) for i in range(len(t))]
    assert len(set(paths)) == len(paths)
    index = {p: i for i, p in enumerate(paths)}
    for i, p in enumerate(paths):
        if len(p) > 1:
            assert p[:-1] in index and index[p[:-1]] < i  # closed under parent, parent first
        if p[-1] > 0:
            prev = p[:-1] + (p[-1] - 1,)
            assert prev in index and index[prev] < i  # closed under previous sibling
        assert 0 <= p[-1] < k
    # scores never increase along selection order (best-first)
    assert all(a >= b for a, b in zip(t.score, t.score[1:], strict=False))


def _all_paths(lp):
    d, k = len(lp), len(lp[0])
    out = {}
    for depth in range(1, d + 1):
        for ranks in itertools.product(range(k), repeat=depth):
            s = 0.0
            for i, r in enumerate(ranks):
                s = f32(s + lp[i][r])
            out[ranks] = s
    return out


@pytest.mark.parametrize("seed", range(40))
def test_top_budget_paths_match_brute_force(seed):
    rng = random.Random(seed)
    d, k = rng.randint(1, 3), rng.randint(1, 3)
    lp = [sorted((rng.uniform(-4, 0) for _ in range(k)), reverse=True) for _ in range(d)]
    lp = _lp(lp)
    total = max_nodes(d, k)
    budget = rng.randint(1, total)
    t = build_tree(lp, _ids(d, k), budget)
    _check_invariants(t, k)
    scores = _all_paths(lp)
    chosen = sorted(scores[t.path(i)] for i in range(len(t)))
    best = sorted(scores.values(), reverse=True)[:budget]
    assert chosen == sorted(best)  # exactly the budget best scores (distinct random values)
    assert [scores[t.path(i)] for i in range(len(t))] == t.score


@pytest.mark.parametrize("seed", range(20))
def test_invariants_with_many_ties(seed):
    rng = random.Random(1000 + seed)
    d, k = rng.randint(1, 4), rng.randint(1, 4)
    lp = _lp([sorted((-0.5 * rng.randint(0, 3) for _ in range(k)), reverse=True) for _ in range(d)])
    budget = rng.randint(1, max_nodes(d, k))
    t = build_tree(lp, _ids(d, k), budget)
    _check_invariants(t, k)
    scores = _all_paths(lp)
    # With ties the set may differ from an arbitrary top-budget choice, but the multiset of
    # scores is the top-budget multiset.
    assert sorted(t.score, reverse=True) == sorted(scores.values(), reverse=True)[:budget]
    # Deterministic: same input, same tree.
    t2 = build_tree(lp, _ids(d, k), budget)
    assert t2.parent == t.parent and t2.rank == t.rank


def test_batched_wrapper():
    lp = [[[-0.1, -0.2]], [[-0.3, -0.4]]]
    ids = [[[1, 2]], [[3, 4]]]
    trees = build_trees(lp, ids, budget=2)
    assert [tr.token for tr in trees] == [[1, 2], [3, 4]]
