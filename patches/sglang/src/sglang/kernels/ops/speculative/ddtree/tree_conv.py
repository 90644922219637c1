"""DDTree tree conv update: the verify's causal conv over a draft tree, given its parents (patch 0004).

What: ``ddtree_tree_conv1d_update`` does what 0.5.23's ``causal_conv1d_update`` does for a tree verify
(``retrieve_next_token`` / ``retrieve_next_sibling`` set), output for output and byte for byte: every
node's conv runs over itself and its ancestors (then the request's conv state once the root is passed),
the per-node conv windows are written for the commit, and the conv state is overwritten with the last
``width - 1`` verify inputs, as upstream does. It differs in how it finds the ancestors: upstream
rebuilds every node's parent inside the kernel from first-child / next-sibling links, one node after the
other (``tl.static_range(seqlen)``, each step several reductions over the whole tree, in a grid of
``dim / 256`` programs per request); this kernel reads the parents DDTree already has
(``DDTreeVerifyInput.retrieve_parent_token``, verify coordinates, root -1; the hybrid backend hands them
over, diff 0004; ``--speculative-ddtree-tree-conv upstream`` keeps upstream's) and computes the nodes
independently: one program per request and 128 channels reads the
conv state once, overwrites it, then loops over the nodes 4 at a time. The launch (4 nodes x 128 channels,
2 warps) is the fastest of seven timed on the H200 at every verify width and batch size measured
(gdn_verify_split.py --conv-only, 2026-12-01; docs/benchmarks.md).

Why: in the full-size server (docs/benchmarks.md, issue 23) the upstream tree conv grew faster than
linearly with the verify width (0.013 ms per layer at 16 nodes, 0.034 ms at 33, batch 1, H200, CUDA-graph
replay; 48 GDN layers a step) and was the largest part of what budget 64's step costs above DFLASH 16's.
The recurrent kernel still takes ``retrieve_parent_token`` as before; here it is an input, not an output.

Contract: ``x`` [batch, dim, T] (a transposed [batch, T, dim] view, as gdn_backend passes it), the conv
state pool [lines, dim, width - 1], ``retrieve_parent_token`` [batch, T] (int32 or int64; node i's parent
p must satisfy 0 <= p < i for i > 0; entry 0 is not read; anything else, e.g. a CUDA-graph capture's
zeros or stale padding rows, is read as the root, so no address leaves the tensors). Rows whose conv
state index is ``pad_slot_id`` are skipped, like upstream. Widths 2 to 4.

Where: with upstream's speculative kernels (``sglang/kernels/ops/speculative/``, DDTree's in ``ddtree/``);
the host side that picks it, ``select_tree_conv``, is ``sglang/srt/speculative/ddtree_tree_conv.py``.

Upstream: not in SGLang 0.5.23. New file of the sgdeploy patch series (feature ``fork``), laid over the
pristine wheel at this path by the build. Checked against upstream's kernel bit for bit on random trees
(tests/gpu/fullsize/gdn_verify_split.py on the H200, tests/unit/series/test_tree_conv_cpu.py under the
Triton interpreter).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

PAD_SLOT_ID = -1


@triton.jit
def _ancestor_x(x_base, stride_x_token, conv_col0, conv_col1, conv_col2, a, mask_tf, KERNEL_WIDTH: tl.constexpr):
    """The input of (virtual) node ``a`` per row: x[a] for a >= 0, else conv state column width - 1 + a."""
    xv = tl.load(x_base[None, :] + (tl.maximum(a, 0) * stride_x_token)[:, None],
                 mask=mask_tf & (a >= 0)[:, None], other=0.0)
    if KERNEL_WIDTH == 2:
        sv = conv_col0[None, :]
    elif KERNEL_WIDTH == 3:
        sv = tl.where((a == -1)[:, None], conv_col1[None, :], conv_col0[None, :])
    else:
        sv = tl.where((a == -1)[:, None], conv_col2[None, :],
                      tl.where((a == -2)[:, None], conv_col1[None, :], conv_col0[None, :]))
    return xv, sv


@triton.jit
def _parent_of(parent_base, stride_pt, a, mask_t):
    """Parent of every (virtual) node ``a``: its tree parent for a > 0 (clamped into 0 .. a - 1), else a - 1."""
    p = tl.load(parent_base + tl.maximum(a, 0) * stride_pt, mask=mask_t & (a > 0), other=0).to(tl.int32)
    p = tl.where((p >= 0) & (p < a), p, 0)
    return tl.where(a > 0, p, a - 1)


@triton.jit()
def _ddtree_tree_conv_kernel(
    x_ptr, w_ptr, bias_ptr, conv_state_ptr, conv_state_indices_ptr, inter_ptr, inter_idx_ptr,
    parent_ptr, o_ptr,
    dim, seqlen,
    stride_x_seq, stride_x_dim, stride_x_token,
    stride_w_dim, stride_w_width,
    stride_cs_seq, stride_cs_dim, stride_cs_tok,
    stride_inter_seq, stride_inter_step, stride_inter_dim, stride_inter_win,
    stride_p_seq, stride_p_tok,
    stride_o_seq, stride_o_dim, stride_o_token,
    pad_slot_id: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    KERNEL_WIDTH: tl.constexpr,
    SILU_ACTIVATION: tl.constexpr,
    SAVE_INTERMEDIATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_GDC: tl.constexpr = False,
):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    idx_seq = tl.program_id(0)
    feats = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_f = feats < dim
    coord = tl.load(conv_state_indices_ptr + idx_seq).to(tl.int64)
    if coord == pad_slot_id:
        return
    state_len = KERNEL_WIDTH - 1

    # The request's conv state (its last width - 1 committed inputs), before it is overwritten below.
    cs_base = conv_state_ptr + coord * stride_cs_seq + feats * stride_cs_dim
    conv_col0 = tl.load(cs_base, mask_f, 0.0)
    conv_col1 = conv_col0
    conv_col2 = conv_col0
    if KERNEL_WIDTH >= 3:
        conv_col1 = tl.load(cs_base + 1 * stride_cs_tok, mask_f, 0.0)
    if KERNEL_WIDTH >= 4:
        conv_col2 = tl.load(cs_base + 2 * stride_cs_tok, mask_f, 0.0)
    # The new conv state, as upstream writes it: the last width - 1 inputs of the verify (older state
    # columns first when the verify is shorter than the state).
    x_base = x_ptr + idx_seq * stride_x_seq + feats * stride_x_dim
    new0 = conv_col0
    new1 = conv_col0
    new2 = conv_col0
    for t in tl.static_range(KERNEL_WIDTH - 1):
        src = t + seqlen
        if src < state_len:
            val = tl.load(cs_base + src * stride_cs_tok, mask_f, 0.0).to(conv_state_ptr.dtype.element_ty)
        else:
            val = tl.load(x_base + (src - state_len) * stride_x_token, mask_f, 0.0).to(
                conv_state_ptr.dtype.element_ty)
        if t == 0:
            new0 = val
        elif t == 1:
            new1 = val
        else:
            new2 = val
    tl.debug_barrier()  # every thread has read the old state before any thread writes the new one
    tl.store(cs_base, new0, mask_f)
    if KERNEL_WIDTH >= 3:
        tl.store(cs_base + 1 * stride_cs_tok, new1, mask_f)
    if KERNEL_WIDTH >= 4:
        tl.store(cs_base + 2 * stride_cs_tok, new2, mask_f)

    # Weights: column width-1 multiplies the node itself, width-2 its parent, ... (upstream's order).
    w_base = w_ptr + feats * stride_w_dim
    w_self = tl.load(w_base + (KERNEL_WIDTH - 1) * stride_w_width, mask_f, 0.0)
    w_up1 = tl.load(w_base + (KERNEL_WIDTH - 2) * stride_w_width, mask_f, 0.0)
    w_up2 = w_up1
    w_up3 = w_up1
    if KERNEL_WIDTH >= 3:
        w_up2 = tl.load(w_base + (KERNEL_WIDTH - 3) * stride_w_width, mask_f, 0.0)
    if KERNEL_WIDTH >= 4:
        w_up3 = tl.load(w_base + (KERNEL_WIDTH - 4) * stride_w_width, mask_f, 0.0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + feats, mask=mask_f, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    parent_base = parent_ptr + idx_seq * stride_p_seq
    if SAVE_INTERMEDIATE:
        icoord = tl.load(inter_idx_ptr + idx_seq).to(tl.int64)
        inter_seq = inter_ptr + icoord * stride_inter_seq + (feats * stride_inter_dim)[None, :]
    o_seq = o_ptr + idx_seq * stride_o_seq + (feats * stride_o_dim)[None, :]

    # BLOCK_T nodes at a time, every node independent of the others once its ancestors are known.
    for t0 in range(0, seqlen, BLOCK_T):
        tok = t0 + tl.arange(0, BLOCK_T)
        mask_t = tok < seqlen
        mask_tf = mask_t[:, None] & mask_f[None, :]
        acc = tl.broadcast_to(bias[None, :], (BLOCK_T, BLOCK_N))
        a = tok
        for j in tl.static_range(KERNEL_WIDTH):
            if j == 0:
                w_col = w_self
            elif j == 1:
                w_col = w_up1
            elif j == 2:
                w_col = w_up2
            else:
                w_col = w_up3
            xv, sv = _ancestor_x(x_base, stride_x_token, conv_col0, conv_col1, conv_col2, a, mask_tf,
                                 KERNEL_WIDTH)
            from_x = (a >= 0)[:, None]
            acc += tl.where(from_x, xv * w_col[None, :], sv * w_col[None, :])
            if SAVE_INTERMEDIATE:
                if KERNEL_WIDTH - j - 2 >= 0:  # window slot width-2 holds the node itself, width-3 its parent, ...
                    tl.store(inter_seq + (tok * stride_inter_step)[:, None] + (KERNEL_WIDTH - j - 2) * stride_inter_win,
                             tl.where(from_x, xv, sv), mask=mask_tf)
            if j + 1 < KERNEL_WIDTH:
                a = _parent_of(parent_base, stride_p_tok, a, mask_t)
        if SILU_ACTIVATION:
            acc = acc / (1 + tl.exp(-acc))
        tl.store(o_seq + (tok * stride_o_token)[:, None], acc, mask=mask_tf)


def _pdl_kwargs() -> dict:
    try:
        from sglang.kernels.jit.utils import is_arch_support_pdl
    except ImportError:  # the CPU interpreter's loader
        return {}
    return {"USE_GDC": True, "launch_pdl": True} if is_arch_support_pdl() else {}


def ddtree_tree_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation=None,
    conv_state_indices: Optional[torch.Tensor] = None,
    intermediate_conv_window: Optional[torch.Tensor] = None,
    intermediate_state_indices: Optional[torch.Tensor] = None,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    block_t: int = 4,
    block_n: int = 128,
    num_warps: int = 2,
) -> torch.Tensor:
    """``causal_conv1d_update`` for a DDTree tree verify (same arguments as gdn_backend's call; the links
    are not read, ``retrieve_parent_token`` is). Returns the conv output shaped like ``x``."""
    del retrieve_next_token, retrieve_next_sibling  # upstream derives parents from them; DDTree has them
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation {activation!r}: DDTree's tree conv supports silu, swish or none")
    if retrieve_parent_token is None or conv_state_indices is None:
        raise ValueError("ddtree_tree_conv1d_update needs retrieve_parent_token and conv_state_indices")
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    if not 2 <= width <= 4:
        raise ValueError(f"conv width {width}: DDTree's tree conv supports widths 2 to 4")
    if conv_state.shape[-1] < width - 1:
        raise ValueError(f"conv state length {conv_state.shape[-1]} < width - 1 = {width - 1}")
    out = torch.empty_like(x)
    inter = intermediate_conv_window
    inter_strides = inter.stride() if inter is not None else (0, 0, 0, 0)
    grid = (batch, triton.cdiv(dim, block_n))
    _ddtree_tree_conv_kernel[grid](
        x, weight, bias, conv_state, conv_state_indices,
        inter if inter is not None else x,
        intermediate_state_indices if intermediate_state_indices is not None else conv_state_indices,
        retrieve_parent_token, out,
        dim, seqlen,
        *x.stride(), *weight.stride(), *conv_state.stride(), *inter_strides,
        *retrieve_parent_token.stride(), *out.stride(),
        pad_slot_id=pad_slot_id,
        HAS_BIAS=bias is not None,
        KERNEL_WIDTH=width,
        SILU_ACTIVATION=activation in ("silu", "swish"),
        SAVE_INTERMEDIATE=inter is not None,
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        num_warps=num_warps,
        **_pdl_kwargs(),
    )
    return out
