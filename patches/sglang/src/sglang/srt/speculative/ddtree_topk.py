"""Per-depth top-k log-probabilities for DDTree: the one entry point.

``depth_topk_logprobs(hidden, lm_head, k, tp_group=None)`` projects the draft
hidden states of every depth and every request (``hidden`` [N, H]) through the
target lm_head in one batched matmul, takes a local top-k and a local
log-sum-exp per vocabulary shard, gathers only K values, K ids and one LSE per
row across tensor parallelism, and merges them: never the dense [N, vocab]
logits. Returns ``(logprobs [N, k] float32, ids [N, k] int64)`` sorted
descending. With ``fused=True`` (``--speculative-ddtree-topk fused``, the
default) a dense bf16/fp16 CUDA head goes through the fused kernel of
``sglang/kernels/ops/speculative/ddtree/fused_depth_topk.py`` (one pass over
the head, no logits in memory); every other head, and
``--speculative-ddtree-topk torch``, takes the batched torch path.

New file of the sgdeploy patch series (not in SGLang 0.5.23): added for DDTree
(series feature ``ddtree``; the fused kernel is feature ``topk``), laid over the
pristine wheel at this path by the build.
"""

from __future__ import annotations

from typing import Tuple

import torch


def _vocab_slice(lm_head, tp_size: int) -> Tuple[int, int]:
    """(first global id of this shard, number of real (unpadded) rows in it)."""
    weight = lm_head.weight
    shard = getattr(lm_head, "shard_indices", None)
    if tp_size > 1 and shard is not None:
        return int(shard.org_vocab_start_index), int(shard.num_org_elements)
    org = getattr(lm_head, "org_vocab_size", None)
    return 0, int(org) if org is not None else int(weight.shape[0])


def _fewest_rows(lm_head, tp_size: int, rows: int) -> int:
    """The fewest real vocabulary rows any rank's shard holds: the last rank's (SGLang splits the padded
    original vocabulary evenly, ``num_org_elements_padded`` rows a rank). Every rank computes the same
    number, so every rank takes the same path and gathers the same shapes. 0 when the head does not say."""
    if tp_size == 1:
        return rows
    shard = getattr(lm_head, "shard_indices", None)
    org = getattr(lm_head, "org_vocab_size", None)
    per = getattr(shard, "num_org_elements_padded", None) if shard is not None else None
    if org is None or per is None:
        return 0
    return max(0, min(int(per), int(org) - (tp_size - 1) * int(per)))


def _fused_ok(hidden: torch.Tensor, weight: torch.Tensor, k: int) -> bool:
    """The fused kernel takes dense bf16/fp16 CUDA heads (not quantized weight types)."""
    return (hidden.is_cuda and weight.dtype in (torch.bfloat16, torch.float16)
            and type(weight) in (torch.Tensor, torch.nn.Parameter) and 0 < k <= weight.shape[0])


def depth_topk_logprobs(
    hidden: torch.Tensor,
    lm_head,
    k: int,
    tp_group=None,
    fused: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities and ids of softmax(hidden @ lm_head.weight.T) per row.

    ``fused``: use the fused kernel where it applies (``--speculative-ddtree-topk``).
    """
    tp_size = 1 if tp_group is None else int(getattr(tp_group, "world_size", 1))
    start, rows = _vocab_slice(lm_head, tp_size)
    weight = lm_head.weight[:rows]
    # The same choice on every rank (a rank whose shard is short of k rows would otherwise take the other
    # path and gather another shape: the e2e tiny models, vocabulary 16 at TP 2, leave rank 1 none).
    if fused and _fused_ok(hidden, weight, k) and _fewest_rows(lm_head, tp_size, rows) >= k:
        from sglang.kernels.ops.speculative.ddtree.fused_depth_topk import fused_depth_topk

        return fused_depth_topk(hidden, lm_head.weight, int(k), vocab_size=rows,
                                vocab_start=start, tp_group=tp_group if tp_size > 1 else None)
    logits = torch.matmul(hidden.to(weight.dtype), weight.t()).float()  # [N, V_local]
    k_local = min(int(k), rows)
    vals, ids = torch.topk(logits, k_local, dim=-1)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, 1] (-inf for a shard without rows)
    ids = ids.to(torch.int64) + start
    if tp_size > 1 and k_local < int(k):  # every rank gathers k columns: pad a short shard with -inf
        pad = int(k) - k_local
        vals = torch.cat([vals, vals.new_full((vals.shape[0], pad), float("-inf"))], dim=-1)
        ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), start)], dim=-1)
    if tp_size > 1:
        vals = tp_group.all_gather(vals.contiguous(), dim=-1)  # [N, tp * k]
        ids = tp_group.all_gather(ids.contiguous(), dim=-1)
        lse = torch.logsumexp(tp_group.all_gather(lse.contiguous(), dim=-1), dim=-1, keepdim=True)
        vals, sel = torch.topk(vals, min(int(k), vals.shape[-1]), dim=-1)
        ids = torch.gather(ids, -1, sel)
    return vals - lse, ids
