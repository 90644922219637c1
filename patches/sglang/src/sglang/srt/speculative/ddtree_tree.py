"""DDTree draft-tree construction on the GPU (no host synchronisation).

Input per request: the drafter's per-depth top-K log-probabilities ``[bs, D, K]``
(float32, sorted descending per depth) and token ids ``[bs, D, K]``. Output: the
``budget`` best rank paths, best-first, closed under parent and previous sibling
(Ringel & Romano 2026, "Accelerating Speculative Decoding with Block Diffusion
Draft Trees"), in selection order, so a parent always precedes its children.

Scores are float32 sums along the path (parent score + own log-probability).
Tie-break: among equal scores the candidate whose parent was selected earlier
wins (root = -1). The frontier holds at most one candidate per parent, so the
kernel keeps it in registers indexed by the parent's verify index (root 0, node
i at i + 1) and the tie-break is "smallest slot". ``sgdeploy/ddtree_ref.py`` in
the deployment project is the plain-Python reference of the same rule.

One Triton program per request loops ``budget`` times over the frontier; a
second kernel writes the ancestor mask (both in
``sglang/kernels/ops/speculative/ddtree/tree.py``; this file checks the inputs,
allocates the layout and launches them). Node coordinates (``parents``,
``depths``, ``scores``, ``node_tokens``) index nodes 0..budget-1 with parent -1 =
root; verify coordinates (everything else) put the root at 0 and node i at i+1.
If a request runs out of candidates (only when budget > sum_d K^d), the
remaining nodes are padding: parent root, depth 1, score -inf, token
``pad_token_id``, not linked into ``retrieve_next_token``/``retrieve_next_sibling``,
and ``num_nodes`` tells how many are real.

New file of the sgdeploy patch series (feature ``ddtree``; called by ``ddtree_worker.py`` only; not in SGLang
0.5.23), laid over the pristine wheel at this path by the build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from sglang.kernels.ops.speculative.ddtree.tree import build_tree


@dataclass
class DDTreeLayout:
    """Tree metadata for one verify step, all on the device, batch-first."""

    parents: torch.Tensor  # [bs, B] int64, node coords, -1 = root
    depths: torch.Tensor  # [bs, B] int64, 1..D
    scores: torch.Tensor  # [bs, B] float32
    node_tokens: torch.Tensor  # [bs, B] int64
    num_nodes: torch.Tensor  # [bs] int32
    verify_tokens: torch.Tensor  # [bs, B+1] int64, root token first
    positions: torch.Tensor  # [bs, B+1] int64, root position + depth
    retrieve_parent_token: torch.Tensor  # [bs, B+1] int64, verify coords, root -1
    retrieve_next_token: torch.Tensor  # [bs, B+1] int64, first child, -1 = none
    retrieve_next_sibling: torch.Tensor  # [bs, B+1] int64, next sibling, -1 = none
    tree_mask: torch.Tensor  # [bs, B+1, B+1] bool, row attends to column


def build_ddtree(
    topk_logprobs: torch.Tensor,
    topk_ids: torch.Tensor,
    budget: int,
    root_tokens: Optional[torch.Tensor] = None,
    root_positions: Optional[torch.Tensor] = None,
    pad_token_id: int = 0,
) -> DDTreeLayout:
    """Build the DDTree of every request in two kernel launches, without host syncs.

    ``topk_logprobs``: [bs, D, K] float32 sorted descending; ``topk_ids``: [bs, D, K].
    ``root_tokens``/``root_positions``: [bs] (the last committed token and its position).
    """
    if topk_logprobs.dim() != 3 or topk_ids.shape != topk_logprobs.shape:
        raise ValueError("expected [bs, D, K] log-probabilities and ids of the same shape")
    bs, depth_count, k = topk_logprobs.shape
    if budget < 1 or depth_count < 1 or k < 1:
        raise ValueError("budget, depth and K must be positive")
    if depth_count > 255 or k > 254:
        raise ValueError("DDTree supports at most 255 depths and 254 candidates per depth")
    device = topk_logprobs.device
    lp = topk_logprobs.to(torch.float32).contiguous()
    ids = topk_ids.to(torch.int64).contiguous()
    if root_tokens is None:
        root_tokens = torch.zeros(bs, dtype=torch.int64, device=device)
    if root_positions is None:
        root_positions = torch.zeros(bs, dtype=torch.int64, device=device)
    root_tokens = root_tokens.to(torch.int64).contiguous()
    root_positions = root_positions.to(torch.int64).contiguous()

    t = budget + 1
    i64 = dict(dtype=torch.int64, device=device)
    out = DDTreeLayout(
        parents=torch.empty((bs, budget), **i64),
        depths=torch.empty((bs, budget), **i64),
        scores=torch.empty((bs, budget), dtype=torch.float32, device=device),
        node_tokens=torch.empty((bs, budget), **i64),
        num_nodes=torch.empty((bs,), dtype=torch.int32, device=device),
        verify_tokens=torch.empty((bs, t), **i64),
        positions=torch.empty((bs, t), **i64),
        retrieve_parent_token=torch.empty((bs, t), **i64),
        retrieve_next_token=torch.empty((bs, t), **i64),
        retrieve_next_sibling=torch.empty((bs, t), **i64),
        tree_mask=torch.empty((bs, t, t), dtype=torch.bool, device=device),
    )
    build_tree(lp, ids, root_tokens, root_positions, out, budget, pad_token_id)
    return out
