"""Random draft trees for the GPU kernel checks (plain Python + torch, no pytest: the CPU interpreter runs import it).

``random_parents`` gives a tree in topological order (parent < child), root 0 with parent -1, each node's
parent drawn from the ``window`` nodes before it (deep and bushy, like DDTree's best-first trees), or a chain;
``links`` gives the first-child / next-sibling links SGLang's tree kernels take (-1 = none, children in index
order). Used by test_state_forking.py and tree_conv_check.py.
"""

from __future__ import annotations

import torch


def random_parents(T: int, gen: torch.Generator, window: int = 6, chain: bool = False) -> list[int]:
    parents = [-1]
    for i in range(1, T):
        parents.append(i - 1 if chain else int(torch.randint(max(0, i - window), i, (1,), generator=gen)))
    return parents


def links(parents: list[int]) -> tuple[list[int], list[int]]:
    T = len(parents)
    first, nxt, last_child = [-1] * T, [-1] * T, [-1] * T
    for i in range(1, T):
        p = parents[i]
        if first[p] < 0:
            first[p] = i
        else:
            nxt[last_child[p]] = i
        last_child[p] = i
    return first, nxt
