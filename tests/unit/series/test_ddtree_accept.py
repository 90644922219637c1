"""DDTree acceptance walk (``sglang/srt/speculative/ddtree_accept.py``, a new file of the series).

The module is pure torch. It is imported from where it lives, ``patches/sglang/src/`` (or
from ``SGLANG_WHEEL_ROOT`` when that is set, e.g. an unpacked wheel), and checked against a
plain Python walk written here from the EAGLE kernels' rules:

- greedy: exact equality with the reference walk on random trees;
- sampled: exact equality with the reference walk given the same coins, and the emitted
  tokens follow the target distribution (chi-square on the first two tokens, with a
  negative control that the same test rejects a wrong acceptance rule).

Skipped (with the reason) when torch is missing; tests/gpu/test_ddtree_verify.py runs
the same checks on the H200 at larger sizes.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "patches" / "sglang" / "src"
REL = "sglang/srt/speculative/ddtree_accept.py"


def load_accept(_tmp_root: Path | None = None):
    """The module, from SGLANG_WHEEL_ROOT when set, else from patches/sglang/src."""
    import importlib.util

    path = Path(os.environ.get("SGLANG_WHEEL_ROOT") or SRC) / REL
    spec = importlib.util.spec_from_file_location("ddtree_accept_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def acc(tmp_path_factory):
    return load_accept(tmp_path_factory.mktemp("ddtree_accept"))


# ---------------------------------------------------------------- random trees


def random_tree(rng: random.Random, t: int, vocab: int, max_depth: int):
    """Verify-coordinate tree: parent list (root -1, parent < child), sibling tokens distinct."""
    parent, depth, tokens = [-1], [0], [rng.randrange(vocab)]
    used = {0: set()}
    for i in range(1, t):
        ok = [p for p in range(i) if depth[p] < max_depth and len(used[p]) < vocab]
        while not ok:  # too small a vocabulary for this depth: allow one level more
            max_depth += 1
            ok = [p for p in range(i) if depth[p] < max_depth and len(used[p]) < vocab]
        p = rng.choice(ok)
        tok = rng.choice([v for v in range(vocab) if v not in used[p]])
        used[p].add(tok)
        used[i] = set()
        parent.append(p)
        depth.append(depth[p] + 1)
        tokens.append(tok)
    return parent, tokens, max(depth)


def batch_trees(rng, bs, t, vocab, max_depth):
    trees = [random_tree(rng, t, vocab, max_depth) for _ in range(bs)]
    parent = torch.tensor([tr[0] for tr in trees], dtype=torch.int64)
    cand = torch.tensor([tr[1] for tr in trees], dtype=torch.int64)
    return parent, cand, max(tr[2] for tr in trees) + 1


def children(parent_row, node):
    return [j for j, p in enumerate(parent_row) if p == node]  # sibling order = index order


# ---------------------------------------------------------------- reference walks


def ref_greedy(parent, cand, target, num_steps):
    """Per request, plain Python: the contract of EAGLE's verify_tree_greedy."""
    bs, t = len(parent), len(parent[0])
    predict = [0] * (bs * t)
    accept = [[-1] * num_steps for _ in range(bs)]
    ncorrect = [0] * bs
    for b in range(bs):
        cur = 0
        accept[b][0] = b * t
        for j in range(1, num_steps):
            nxt = next((c for c in children(parent[b], cur) if cand[b][c] == target[b][cur]), None)
            if nxt is None:
                break
            predict[b * t + cur] = target[b][cur]
            accept[b][j] = b * t + nxt
            ncorrect[b] += 1
            cur = nxt
        predict[b * t + cur] = target[b][cur]
    return predict, accept, ncorrect


def ref_sampled(parent, cand, probs, coins, coins_final, num_steps):
    """Per request, plain Python, float64: tree_speculative_sampling_target_only's rule."""
    bs, t = len(parent), len(parent[0])
    predict = [0] * (bs * t)
    accept = [[-1] * num_steps for _ in range(bs)]
    ncorrect = [0] * bs
    for b in range(bs):
        cur = 0
        accept[b][0] = b * t
        tried = []
        for j in range(1, num_steps):
            acc_p, nxt, tried = 0.0, None, []
            u = coins[b][cur]
            for c in children(parent[b], cur):
                p = probs[b][cur][cand[b][c]]
                acc_p += p
                if p > 0 and u < acc_p:
                    nxt = c
                    break
                tried.append(cand[b][c])
            if nxt is None:
                break
            predict[b * t + cur] = cand[b][nxt]
            accept[b][j] = b * t + nxt
            ncorrect[b] += 1
            cur = nxt
            tried = []
        row = [0.0 if v in tried else p for v, p in enumerate(probs[b][cur])]
        total = sum(row)
        x, run, pick = coins_final[b] * total, 0.0, len(row) - 1
        for v, p in enumerate(row):
            run += p
            if run > x:
                pick = v
                break
        predict[b * t + cur] = pick
    return predict, accept, ncorrect


def greedy_targets(rng, parent, cand, vocab, p_follow=0.8):
    """Target argmax per node: a child's token with probability p_follow, else random."""
    bs, t = parent.shape
    out = []
    for b in range(bs):
        row = []
        for i in range(t):
            ch = children(parent[b].tolist(), i)
            if ch and rng.random() < p_follow:
                row.append(int(cand[b, rng.choice(ch)]))
            else:
                row.append(rng.randrange(vocab))
        out.append(row)
    return torch.tensor(out, dtype=torch.int64)


def check_greedy(acc, rng, bs, t, vocab, max_depth, device="cpu"):
    parent, cand, steps = batch_trees(rng, bs, t, vocab, max_depth)
    target = greedy_targets(rng, parent, cand, vocab)
    want = ref_greedy(parent.tolist(), cand.tolist(), target.tolist(), steps)
    got = acc.greedy_accept(cand.to(device), parent.to(device), target.to(device), steps)
    got = [x.cpu() for x in got]
    assert got[0].tolist() == want[0]
    assert got[1].tolist() == want[1]
    assert got[2].tolist() == want[2]
    return int(got[2].sum())


def test_greedy_matches_reference_walk(acc):
    rng = random.Random(7)
    total = 0
    for _ in range(60):
        bs = rng.choice([1, 2, 3, 8, 17])
        t = rng.choice([1, 2, 3, 5, 9, 16, 33])
        max_depth = rng.choice([1, 2, 4, 15])
        total += check_greedy(acc, rng, bs, t, vocab=rng.choice([4, 50]), max_depth=max_depth)
    assert total > 100  # the walks go deep, not just the root


def test_greedy_hand_checked(acc):
    # root(5) -> a(7) -> c(9); root -> b(8)
    parent = torch.tensor([[-1, 0, 0, 1]])
    cand = torch.tensor([[5, 7, 8, 9]])
    target = torch.tensor([[8, 1, 2, 3]])  # root predicts 8: accept b (index 2), bonus = target[b] = 2
    predict, accept, n = acc.greedy_accept(cand, parent, target, 3)
    assert accept.tolist() == [[0, 2, -1]] and n.tolist() == [1]
    assert predict.tolist() == [8, 0, 2, 0]
    assert acc.bonus_tokens(predict, accept, n + 1).tolist() == [2]
    assert acc.accepted_node_index(accept, n + 1, 4).tolist() == [2]
    target = torch.tensor([[7, 9, 2, 4]])  # root -> a -> c, bonus target[c] = 4
    predict, accept, n = acc.greedy_accept(cand, parent, target, 3)
    assert accept.tolist() == [[0, 1, 3]] and n.tolist() == [2]
    assert acc.accepted_tokens(predict, accept).tolist() == [[7, 9, 4]]
    x = torch.arange(4) * 10
    assert acc.compact_to_front(x, accept, 4).tolist() == [0, 10, 30, 30]


def random_probs(gen, bs, t, vocab, sharp):
    logits = torch.randn(bs, t, vocab, generator=gen, dtype=torch.float64) * sharp
    return torch.softmax(logits, dim=-1)


def test_sampled_matches_reference_walk(acc):
    rng = random.Random(11)
    gen = torch.Generator().manual_seed(11)
    for _ in range(40):
        bs, t, vocab = rng.choice([1, 4, 9]), rng.choice([1, 2, 5, 12]), rng.choice([3, 6, 20])
        parent, cand, steps = batch_trees(rng, bs, t, vocab, rng.choice([1, 3, 6]))
        probs = random_probs(gen, bs, t, vocab, sharp=rng.choice([0.5, 3.0]))
        # Put most target mass on the tree's tokens so walks go deep.
        coins = torch.rand(bs, t, generator=gen, dtype=torch.float64)
        coins_final = torch.rand(bs, generator=gen, dtype=torch.float64)
        want = ref_sampled(parent.tolist(), cand.tolist(), probs.tolist(), coins.tolist(), coins_final.tolist(), steps)
        got = acc.sampled_accept(cand, parent, probs, coins, coins_final, steps)
        # float64 inputs: the only float differences are summation order, far below
        # the coin spacing of these few cases; equality is exact here.
        assert got[1].tolist() == want[1]
        assert got[2].tolist() == want[2]
        assert got[0].tolist() == want[0]


def chi_square_first_two(acc, parent, cand, probs, n, gen, walk=None, device="cpu"):
    """Chi-square statistic and degrees of freedom of the (t1, t2) emitted-token pairs
    against the target's joint p_root(t1) * p_{t1}(t2) (t2 only where t1 is a tree
    child of the root; otherwise the pair is (t1, end))."""
    t, vocab = parent.shape[1], probs.shape[-1]
    walk = walk or acc.sampled_accept
    P = parent.expand(n, t).contiguous().to(device)
    C = cand.expand(n, t).contiguous().to(device)
    Q = probs.to(torch.float32).expand(n, t, vocab).contiguous().to(device)
    coins = torch.rand(n, t, generator=gen).to(device)
    coins_final = torch.rand(n, generator=gen).to(device)
    steps = 3
    predict, accept, ncorrect = walk(C, P, Q, coins, coins_final, steps)
    toks = acc.accepted_tokens(predict, accept).cpu()
    lens = (ncorrect + 1).cpu()
    t1 = toks[:, 0]
    t2 = torch.where(lens >= 2, toks[:, 1], torch.full_like(t1, vocab))  # vocab = "end"
    counts = torch.bincount(t1.to(torch.int64) * (vocab + 1) + t2.to(torch.int64), minlength=vocab * (vocab + 1))
    # expected: pairs through a root child continue with that child's distribution
    root_children = {int(cand[0, c]): c for c in children(parent[0].tolist(), 0)}
    p = probs[0].to(torch.float64)
    expect = torch.zeros(vocab, vocab + 1, dtype=torch.float64)
    for a in range(vocab):
        if a in root_children:
            expect[a, :vocab] = p[0, a] * p[root_children[a]]
        else:
            expect[a, vocab] = p[0, a]
    expect = expect.reshape(-1) * n
    keep = expect > 5  # chi-square validity; pool the rest
    obs = counts.to(torch.float64)
    stat = float((((obs - expect) ** 2) / expect)[keep].sum())
    rest_e, rest_o = float(expect[~keep].sum()), float(obs[~keep].sum())
    df = int(keep.sum()) - 1
    if rest_e > 0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        df += 1
    return stat, df


def chi_square_limit(df: int) -> float:
    """Wilson-Hilferty upper quantile at z = 5 (p about 3e-7): a false alarm is negligible."""
    z = 5.0
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def wrong_walk(acc):
    """Negative control: each sibling gets its own coin test u < p (not cumulative).
    It over-rejects later siblings, so the bonus takes too much mass."""

    def walk(C, P, Q, coins, coins_final, steps):
        bs, t = C.shape
        rows = torch.arange(bs, device=C.device)
        p_node = Q[rows[:, None], P.clamp(min=0), C]
        fake_cum = p_node  # instead of the sibling prefix sum
        orig = acc.sibling_cumulative
        try:
            acc.sibling_cumulative = lambda p, parent: fake_cum
            return acc.sampled_accept(C, P, Q, coins, coins_final, steps)
        finally:
            acc.sibling_cumulative = orig

    return walk


def sampling_case(seed, vocab=6, t=7):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    # Root with three children (tokens 0, 1, 2), child 0 with two children, child 1 with one.
    parent = torch.tensor([[-1, 0, 0, 0, 1, 1, 2]])[:, :t]
    cand = torch.tensor([[rng.randrange(vocab), 0, 1, 2, 3, 4, 5]])[:, :t]
    probs = random_probs(gen, 1, t, vocab, sharp=1.0)
    return parent, cand, probs, gen


def test_sampled_distribution_is_target(acc):
    parent, cand, probs, gen = sampling_case(3)
    stat, df = chi_square_first_two(acc, parent, cand, probs, n=60_000, gen=gen)
    assert stat < chi_square_limit(df), (stat, df, chi_square_limit(df))


def test_distribution_test_rejects_a_wrong_rule(acc):
    parent, cand, probs, gen = sampling_case(3)
    stat, df = chi_square_first_two(acc, parent, cand, probs, n=60_000, gen=gen, walk=wrong_walk(acc))
    assert stat > chi_square_limit(df), (stat, df)
