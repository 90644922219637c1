"""Plain-Python reference for the DDTree draft-tree builder.

This is the specification that the GPU builder in the patched SGLang
(``sglang/srt/speculative/ddtree_tree.py``, its kernels in
``sglang/kernels/ops/speculative/ddtree/tree.py``) is tested against. It has no
dependencies beyond the standard library.

Inputs per request: for each draft depth d = 1..D the top-K log-probabilities
of the drafter's distribution at that position, sorted in descending order, and
the matching token ids. A candidate node is a path of ranks (r1, ..., rd); its
score is the sum of the chosen log-probabilities, accumulated in float32 in
path order (parent score + own log-probability), exactly as the kernel does.

Best-first rule: start with the single candidate (0) at depth 1; repeatedly
take the best candidate, append it as the next node (its index is the order of
selection, so a parent always precedes its children) and offer its next sibling
(rank + 1 at the same depth, if rank + 1 < K) and its first child (rank 0 at
depth + 1, if depth < D). Stop after ``budget`` nodes or when no candidate is
left.

Tie-break (fixed, identical in the kernel): among candidates of equal score the
one whose parent was selected earlier wins (smaller parent node index, the root
counting as -1). The frontier never holds two candidates with the same parent
(a parent's next child is only offered once its previous child was taken), so
this order is total and does not depend on how the frontier is stored.
"""

from __future__ import annotations

import heapq
import math
import struct
from dataclasses import dataclass, field

ROOT = -1


def f32(x: float) -> float:
    """Round a Python float to the nearest float32 value."""
    if math.isinf(x) or math.isnan(x):
        return x
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass
class Tree:
    """One request's tree. Node i (0-based, selection order); parents use -1 for the root."""

    parent: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    token: list[int] = field(default_factory=list)
    score: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.parent)

    def path(self, i: int) -> tuple[int, ...]:
        """Rank path (r1, ..., rd) of node i."""
        ranks = []
        while i != ROOT:
            ranks.append(self.rank[i])
            i = self.parent[i]
        return tuple(reversed(ranks))

    # Verify coordinates: index 0 is the root, node i is i + 1.
    def verify_parent(self) -> list[int]:
        return [-1] + [p + 1 for p in self.parent]

    def next_token(self) -> list[int]:
        """First child of each verify index (-1 = none)."""
        out = [-1] * (len(self) + 1)
        for i in reversed(range(len(self))):
            if self.rank[i] == 0:
                out[self.parent[i] + 1] = i + 1
        return out

    def next_sibling(self) -> list[int]:
        """Next sibling (next rank under the same parent) of each verify index (-1 = none)."""
        out = [-1] * (len(self) + 1)
        by_parent: dict[int, list[int]] = {}
        for i, p in enumerate(self.parent):
            by_parent.setdefault(p, []).append(i)
        for kids in by_parent.values():
            kids.sort(key=lambda i: self.rank[i])
            for a, b in zip(kids, kids[1:], strict=False):
                out[a + 1] = b + 1
        return out

    def ancestor_mask(self) -> list[list[bool]]:
        """[n+1][n+1]: row i may attend to column j (j is i, or an ancestor of i; the root for all)."""
        n = len(self) + 1
        vp = self.verify_parent()
        rows = []
        for i in range(n):
            row = [False] * n
            j = i
            while j != -1:
                row[j] = True
                j = vp[j]
            rows.append(row)
        return rows


def build_tree(logprobs: list[list[float]], ids: list[list[int]], budget: int) -> Tree:
    """Build one request's tree. ``logprobs``/``ids``: D lists of K values, sorted descending."""
    depth_count = len(logprobs)
    if budget < 1:
        raise ValueError("budget must be >= 1")
    if depth_count == 0:
        return Tree()
    k = len(logprobs[0])
    lp = [[f32(v) for v in row] for row in logprobs]
    for row in lp:
        if len(row) != k:
            raise ValueError("every depth needs the same number of candidates")
        if any(a < b for a, b in zip(row, row[1:], strict=False)):
            raise ValueError("log-probabilities must be sorted in descending order")
    tree = Tree()
    # Heap entries: (-score, parent, depth, rank, parent_score). Parent is unique in the frontier.
    heap = [(-lp[0][0], ROOT, 1, 0, 0.0)]
    while heap and len(tree) < budget:
        neg, parent, depth, rank, parent_score = heapq.heappop(heap)
        score = -neg
        node = len(tree)
        tree.parent.append(parent)
        tree.depth.append(depth)
        tree.rank.append(rank)
        tree.token.append(int(ids[depth - 1][rank]))
        tree.score.append(score)
        if rank + 1 < k:
            s = f32(parent_score + lp[depth - 1][rank + 1])
            heapq.heappush(heap, (-s, parent, depth, rank + 1, parent_score))
        if depth < depth_count:
            s = f32(score + lp[depth][0])
            heapq.heappush(heap, (-s, node, depth + 1, 0, score))
    return tree


def build_trees(logprobs, ids, budget: int) -> list[Tree]:
    """Batched form: ``logprobs``/``ids`` are [bs][D][K] nested sequences."""
    return [build_tree(lp, i, budget) for lp, i in zip(logprobs, ids, strict=True)]


def max_nodes(depth_count: int, k: int) -> int:
    """How many distinct nodes a tree of D depths and K candidates per depth can hold."""
    return sum(k**d for d in range(1, depth_count + 1))
