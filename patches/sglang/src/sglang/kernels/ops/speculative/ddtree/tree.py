"""DDTree's draft-tree kernels: the best-first builder and the ancestor mask (feature ``ddtree``).

What: ``build_tree(lp, ids, root_tokens, root_positions, out, budget, pad_token_id)`` launches
``_ddtree_build_kernel`` (one program per request loops ``budget`` times over the frontier, held in
registers indexed by the parent's verify index) and ``_ddtree_mask_kernel`` (the ancestor mask from the
parents), writing into the tensors of ``out`` (a ``DDTreeLayout``), without a host synchronisation. The
selection rule, the coordinates and the padding are those of ``sglang/srt/speculative/ddtree_tree.py``,
which checks the inputs, allocates the layout and calls this (``build_ddtree``).

Where: with upstream's speculative kernels (``sglang/kernels/ops/speculative/``, DDTree's in ``ddtree/``).

New file of the sgdeploy patch series (feature ``ddtree``; not in SGLang 0.5.23), laid over the pristine
wheel at this path by the build.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ddtree_build_kernel(
    lp_ptr,  # [bs, D, K] float32
    ids_ptr,  # [bs, D, K] int64
    root_tok_ptr,  # [bs] int64
    root_pos_ptr,  # [bs] int64
    parents_ptr,  # [bs, B] int64
    depths_ptr,  # [bs, B] int64
    scores_ptr,  # [bs, B] float32
    node_tok_ptr,  # [bs, B] int64
    num_nodes_ptr,  # [bs] int32
    vtok_ptr,  # [bs, B+1] int64
    pos_ptr,  # [bs, B+1] int64
    vparent_ptr,  # [bs, B+1] int64
    next_tok_ptr,  # [bs, B+1] int64
    next_sib_ptr,  # [bs, B+1] int64
    budget,
    D,
    K,
    pad_token_id,
    BP: tl.constexpr,  # power of two >= budget + 1
    LP: tl.constexpr,  # power of two >= D * K
):
    pid = tl.program_id(0).to(tl.int64)
    neg_inf = float("-inf")
    offs = tl.arange(0, BP)
    loffs = tl.arange(0, LP)

    # The whole [D, K] log-prob table of this request lives in registers.
    lp_tab = tl.load(lp_ptr + pid * D * K + loffs, mask=loffs < D * K, other=neg_inf)

    # Frontier, slot = verify index of the candidate's parent (root 0, node n at n + 1).
    f_valid = offs == 0
    f_score = tl.where(offs == 0, tl.max(tl.where(loffs == 0, lp_tab, neg_inf), 0), neg_inf)
    f_pscore = tl.zeros([BP], dtype=tl.float32)
    # Packed slot fields: depth | rank << 8 | (prev sibling node + 1) << 16.
    f_pack = tl.where(offs == 0, 1, 0).to(tl.int32)

    # Node records (node coords n) and links (verify coords).
    n_parent = tl.full([BP], -1, dtype=tl.int32)
    n_depth = tl.full([BP], 1, dtype=tl.int32)
    n_rank = tl.full([BP], -1, dtype=tl.int32)
    n_score = tl.full([BP], neg_inf, dtype=tl.float32)
    first_child = tl.full([BP], -1, dtype=tl.int32)
    next_sib = tl.full([BP], -1, dtype=tl.int32)
    count = 0

    for n in range(budget):
        m = tl.max(tl.where(f_valid, f_score, neg_inf), 0)
        hit = f_valid & (f_score == m)
        slot = tl.min(tl.where(hit, offs, BP), 0)
        ok = slot < BP
        is_sel = offs == slot
        packed = tl.sum(tl.where(is_sel, f_pack, 0), 0)
        pscore = tl.max(tl.where(is_sel, f_pscore, neg_inf), 0)
        depth = packed & 255
        rank = (packed >> 8) & 255
        prev = (packed >> 16) - 1

        # Record node n.
        at_n = (offs == n) & ok
        n_parent = tl.where(at_n, slot - 1, n_parent)
        n_depth = tl.where(at_n, depth, n_depth)
        n_rank = tl.where(at_n, rank, n_rank)
        n_score = tl.where(at_n, m, n_score)
        count += ok.to(tl.int32)
        first_child = tl.where(ok & (prev < 0) & (offs == slot), n + 1, first_child)
        next_sib = tl.where(ok & (prev >= 0) & (offs == prev + 1), n + 1, next_sib)

        # Next sibling replaces the taken candidate in the same slot.
        sib_idx = (depth - 1) * K + rank + 1
        sib_lp = tl.max(tl.where(loffs == sib_idx, lp_tab, neg_inf), 0)
        has_sib = ok & (rank + 1 < K)
        f_valid = tl.where(is_sel, has_sib, f_valid)
        f_score = tl.where(is_sel & has_sib, pscore + sib_lp, f_score)
        f_pack = tl.where(is_sel, depth | ((rank + 1) << 8) | ((n + 1) << 16), f_pack)

        # First child goes to the slot of node n (verify index n + 1).
        child_lp = tl.max(tl.where(loffs == depth * K, lp_tab, neg_inf), 0)
        has_child = ok & (depth < D)
        at_c = (offs == n + 1) & has_child
        f_valid = f_valid | at_c
        f_score = tl.where(at_c, m + child_lp, f_score)
        f_pscore = tl.where(at_c, m, f_pscore)
        f_pack = tl.where(at_c, depth + 1, f_pack)

    # Tokens and outputs.
    in_b = offs < budget
    real = n_rank >= 0
    row = pid * budget
    tok = tl.load(
        ids_ptr + pid * D * K + (n_depth - 1) * K + n_rank, mask=in_b & real, other=pad_token_id
    )
    tl.store(parents_ptr + row + offs, n_parent.to(tl.int64), mask=in_b)
    tl.store(depths_ptr + row + offs, n_depth.to(tl.int64), mask=in_b)
    tl.store(scores_ptr + row + offs, n_score, mask=in_b)
    tl.store(node_tok_ptr + row + offs, tok, mask=in_b)
    tl.store(num_nodes_ptr + pid, count)

    vrow = pid * (budget + 1)
    root_pos = tl.load(root_pos_ptr + pid)
    root_tok = tl.load(root_tok_ptr + pid)
    tl.store(vtok_ptr + vrow + 1 + offs, tok, mask=in_b)
    tl.store(pos_ptr + vrow + 1 + offs, root_pos + n_depth.to(tl.int64), mask=in_b)
    tl.store(vparent_ptr + vrow + 1 + offs, (n_parent + 1).to(tl.int64), mask=in_b)
    tl.store(vtok_ptr + vrow, root_tok)
    tl.store(pos_ptr + vrow, root_pos)
    tl.store(vparent_ptr + vrow, -1)
    in_v = offs < budget + 1
    tl.store(next_tok_ptr + vrow + offs, first_child.to(tl.int64), mask=in_v)
    tl.store(next_sib_ptr + vrow + offs, next_sib.to(tl.int64), mask=in_v)


@triton.jit
def _ddtree_mask_kernel(
    vparent_ptr,  # [bs, T] int64, verify coords, root -1
    mask_ptr,  # [bs, T, T] bool
    T,
    max_depth,
    ROWS: tl.constexpr,
    BT: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    rows = tile * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BT)
    row_ok = rows < T
    cur = tl.where(row_ok, rows, -1).to(tl.int64)
    acc = tl.zeros([ROWS, BT], dtype=tl.int1)
    for _ in range(max_depth + 1):
        acc = acc | (cols[None, :] == cur[:, None])
        cur = tl.load(vparent_ptr + pid * T + cur, mask=cur >= 0, other=-1)
    out = mask_ptr + pid * T * T + rows[:, None].to(tl.int64) * T + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & (cols[None, :] < T))


def build_tree(
    lp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    root_positions: torch.Tensor,
    out,
    budget: int,
    pad_token_id: int,
) -> None:
    """Fill ``out`` (a ``DDTreeLayout`` of ``bs`` requests, already allocated) from ``lp`` / ``ids``
    ([bs, D, K] float32 sorted descending / int64, contiguous) and the roots ([bs] int64, contiguous)."""
    bs, depth_count, k = lp.shape
    if bs == 0:
        return
    t = budget + 1
    bp = triton.next_power_of_2(t)
    _ddtree_build_kernel[(bs,)](
        lp,
        ids,
        root_tokens,
        root_positions,
        out.parents,
        out.depths,
        out.scores,
        out.node_tokens,
        out.num_nodes,
        out.verify_tokens,
        out.positions,
        out.retrieve_parent_token,
        out.retrieve_next_token,
        out.retrieve_next_sibling,
        budget,
        depth_count,
        k,
        pad_token_id,
        BP=bp,
        LP=triton.next_power_of_2(depth_count * k),
        num_warps=1,
    )
    rows = min(bp, 32)
    _ddtree_mask_kernel[(bs, triton.cdiv(t, rows))](
        out.retrieve_parent_token,
        out.tree_mask,
        t,
        min(depth_count, budget),
        ROWS=rows,
        BT=bp,
        num_warps=4,
    )
