"""DDTree acceptance walk in plain torch (imports only torch).

The contract is the one of SGLang's EAGLE tree verify (``verify_tree_greedy`` and
``tree_speculative_sampling_target_only``), applied to a DDTree verify layout:

- ``candidates`` [bs, T]: verify tokens, index 0 the root (last committed token);
- ``parent`` [bs, T]: parent verify index, -1 for the root; parents precede children
  and siblings are in increasing index order (``ddtree_tree.build_ddtree`` output);
- outputs ``predict`` [bs * T] int32 (at each accepted verify index the token that
  follows it: the accepted child's token, or the bonus at the last accepted node),
  ``accept_index`` [bs, num_steps] int32 (global verify ids ``b * T + i`` of the
  accepted path, root first, -1 padded), ``num_correct`` [bs] int32 (accepted drafts,
  root excluded; accept_lens = num_correct + 1).

Greedy: from the root, follow the child whose token equals the target's argmax at the
current node; stop when none does. The bonus is the target's argmax at the last node.

Sampled (lossless for deterministic drafts with distinct sibling tokens, which DDTree
guarantees): one coin ``u`` per node; the children of the current node, in sibling
order, partition [0, 1) by their target probabilities and the child whose interval
holds ``u`` is accepted (``u < cumulative p``), which draws the next token exactly from
the target distribution restricted to the children. If no child is hit, the bonus is
drawn from the target distribution with the children's tokens removed (renormalised),
i.e. the rest of the same target distribution. Both are the rules of
``tree_speculative_sampling_target_only`` at ``threshold_single = threshold_acc = 1``.

Every function is a fixed sequence of device ops (the walk loops ``num_steps`` times
on the host, never reading a device value), so it needs no host synchronisation and can
be captured in a CUDA graph.

New file of the sgdeploy patch series (feature ``ddtree``; used by the tests and as the written-out rule; not in SGLang
0.5.23), laid over the pristine wheel at this path by the build.
"""

from __future__ import annotations

from typing import Tuple

import torch


def _walk_init(bs: int, t: int, num_steps: int, device):
    base = torch.arange(bs, device=device, dtype=torch.int64) * t
    accept_index = torch.full((bs, num_steps), -1, dtype=torch.int32, device=device)
    accept_index[:, 0] = base.to(torch.int32)
    num_correct = torch.zeros((bs,), dtype=torch.int32, device=device)
    predict = torch.zeros((bs * t,), dtype=torch.int32, device=device)
    cur = torch.zeros((bs,), dtype=torch.int64, device=device)
    alive = torch.ones((bs,), dtype=torch.bool, device=device)
    return base, accept_index, num_correct, predict, cur, alive


def _first_true(mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(any, index of the first True) along dim 1."""
    found = mask.any(dim=1)
    first = torch.argmax(mask.to(torch.int8), dim=1)
    return found, first


def greedy_accept(
    candidates: torch.Tensor,
    parent: torch.Tensor,
    target_predict: torch.Tensor,
    num_steps: int,
):
    """Greedy tree walk. ``target_predict`` [bs, T]: the target's argmax at each node.
    ``num_steps`` = max tree depth + 1 (the width of ``accept_index``)."""
    bs, t = candidates.shape
    device = candidates.device
    base, accept_index, num_correct, predict, cur, alive = _walk_init(bs, t, num_steps, device)
    parent = parent.to(torch.int64)
    cand = candidates.to(torch.int64)
    tgt_all = target_predict.to(torch.int64).view(bs, t)
    for j in range(1, num_steps):
        tgt = tgt_all.gather(1, cur[:, None])  # [bs, 1]
        hit = (parent == cur[:, None]) & (cand == tgt) & alive[:, None]
        found, nxt = _first_true(hit)
        pos = base + cur
        predict[pos] = torch.where(found, tgt[:, 0], predict[pos].to(torch.int64)).to(torch.int32)
        accept_index[:, j] = torch.where(found, base + nxt, torch.full_like(base, -1)).to(torch.int32)
        num_correct += found.to(torch.int32)
        cur = torch.where(found, nxt, cur)
        alive &= found
    predict[base + cur] = tgt_all.gather(1, cur[:, None])[:, 0].to(torch.int32)
    return predict, accept_index, num_correct


def sibling_cumulative(p_node: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
    """[bs, T]: for node j, the sum of ``p_node`` over j's siblings of index <= j."""
    t = parent.shape[1]
    idx = torch.arange(t, device=parent.device)
    same = (parent[:, :, None] == parent[:, None, :]) & (idx[None, None, :] <= idx[None, :, None])
    return torch.einsum("bjk,bk->bj", same.to(p_node.dtype), p_node)


def sampled_accept(
    candidates: torch.Tensor,
    parent: torch.Tensor,
    target_probs: torch.Tensor,
    coins: torch.Tensor,
    coins_final: torch.Tensor,
    num_steps: int,
):
    """Tree speculative sampling (target only). ``target_probs`` [bs, T, V]: the target
    distribution (after temperature / top-k / top-p) at each node; ``coins`` [bs, T] and
    ``coins_final`` [bs] uniform in [0, 1)."""
    bs, t = candidates.shape
    device = candidates.device
    base, accept_index, num_correct, predict, cur, alive = _walk_init(bs, t, num_steps, device)
    parent = parent.to(torch.int64)
    cand = candidates.to(torch.int64)
    rows = torch.arange(bs, device=device)
    # Probability of each node's token under its parent's distribution (root: unused).
    p_node = target_probs[rows[:, None], parent.clamp(min=0), cand]
    cum = sibling_cumulative(p_node, parent)
    for j in range(1, num_steps):
        u = coins.gather(1, cur[:, None])  # [bs, 1]
        hit = (parent == cur[:, None]) & alive[:, None] & (p_node > 0) & (u < cum)
        found, nxt = _first_true(hit)
        pos = base + cur
        tok = cand.gather(1, nxt[:, None])[:, 0]
        predict[pos] = torch.where(found, tok, predict[pos].to(torch.int64)).to(torch.int32)
        accept_index[:, j] = torch.where(found, base + nxt, torch.full_like(base, -1)).to(torch.int32)
        num_correct += found.to(torch.int32)
        cur = torch.where(found, nxt, cur)
        alive &= found
    # Bonus: the last node's target distribution without its children's tokens (all
    # of them were tried when the walk stopped there; none exist at a leaf).
    probs = target_probs[rows, cur].to(torch.float32)  # [bs, V]
    child = parent == cur[:, None]
    removed = torch.zeros_like(probs)
    removed.scatter_add_(1, cand, child.to(probs.dtype))
    residual = torch.where(removed > 0, torch.zeros_like(probs), probs)
    total = residual.sum(dim=1, keepdim=True)
    residual = torch.where(total > 0, residual, probs)  # float round-off guard
    total = residual.sum(dim=1, keepdim=True)
    cdf = torch.cumsum(residual, dim=1)
    thresh = (coins_final.to(torch.float32)[:, None] * total).contiguous()
    bonus = torch.searchsorted(cdf.contiguous(), thresh, right=True)[:, 0]
    bonus = bonus.clamp(max=probs.shape[1] - 1)
    predict[base + cur] = bonus.to(torch.int32)
    return predict, accept_index, num_correct


def accepted_node_index(accept_index: torch.Tensor, accept_lens: torch.Tensor, t: int) -> torch.Tensor:
    """Verify index (0 = root) of each request's last accepted node."""
    last = (accept_lens.to(torch.int64) - 1).clamp(min=0)
    node = torch.gather(accept_index.to(torch.int64), 1, last[:, None]).squeeze(1)
    return torch.remainder(node.clamp(min=0), t)


def compact_to_front(x: torch.Tensor, accept_index: torch.Tensor, t: int) -> torch.Tensor:
    """Copy of ``x`` ([bs * T, ...], verify-indexed) with each request's accepted path
    moved to the front of its T block (what EAGLE's ``_compact_accept_to_front`` does)."""
    bs, s1 = accept_index.shape
    safe = accept_index.to(torch.int64).clamp(min=0).reshape(-1)
    out = x.clone()
    out.view(bs, t, *x.shape[1:])[:, :s1] = x[safe].view(bs, s1, *x.shape[1:])
    return out


def accepted_tokens(predict: torch.Tensor, accept_index: torch.Tensor) -> torch.Tensor:
    """[bs, num_steps]: the emitted tokens in order (accepted drafts, then the bonus);
    entries past accept_lens are meaningless."""
    return predict[accept_index.to(torch.int64).clamp(min=0)]


def bonus_tokens(predict: torch.Tensor, accept_index: torch.Tensor, accept_lens: torch.Tensor) -> torch.Tensor:
    """[bs] int64: the token after the last accepted node (the next root)."""
    last = (accept_lens.to(torch.int64) - 1).clamp(min=0)
    node = torch.gather(accept_index.to(torch.int64), 1, last[:, None]).squeeze(1)
    return predict[node.clamp(min=0)].to(torch.int64)
