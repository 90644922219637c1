"""Fused per-depth top-k log-probabilities over a (vocab-parallel) lm_head.

Why: DDTree needs, for
every draft depth of every request, the top-K token ids and log-probabilities of the drafter's
distribution. Projecting through the full lm_head per depth costs one pass over a ~2.5 GB head
per depth (15 per step). Here the head is read once for all rows, in two steps:
  1. logits: fp32 logits of all rows, with the online log-sum-exp of each vocabulary slice and
     the maximum of each SEG-column segment computed on the way (small N: one Triton kernel
     that streams the head; large N on Hopper and newer: a persistent TMA matmul that does
     both in its epilogue, on Hopper warp-specialised in Gluon (a TMA producer and two
     consumer warpgroups in ping-pong, so one's epilogue overlaps the other's wgmmas);
     otherwise cuBLAS fp32 logits, then a Triton pass over them);
  2. selection (one program per row): the K segments with the largest maxima hold the row's
     top K (K segment maxima are K distinct elements, so the K-th largest element is at least
     the K-th largest segment maximum, and a segment below it holds nothing larger), so the
     top K of those K x SEG candidates is the answer: bitonic top-Ks of int64 keys (value,
     then the lower id; the segments optionally found through groups of segments by the same
     argument), no data-dependent loop, and no running top-K in the streaming step.
Under tensor parallelism each rank does the same over its shard and only K values, K ids and
one LSE per row cross ranks. No host syncs and shape-only allocation sizes, so the call can be
captured in a CUDA graph (compile it once, eagerly, before capture).

Needs torch and triton >= 3.6 (tl.topk; Gluon for the ping-pong kernel). Entry points:
fused_depth_topk (one call does it all), fused_local_topk (one shard's partial: log-probs,
global ids, lse) and merge_topk_partials (merge of shard partials; also the single-GPU test of
the TP merge).

Where: with upstream's speculative kernels (``sglang/kernels/ops/speculative/``, DDTree's in
``ddtree/``); ``sglang/srt/speculative/ddtree_topk.py`` (host side) decides when it runs.

New file of the sgdeploy patch series (feature ``topk``; not in SGLang 0.5.23), laid over the
pristine wheel at this path; ``--speculative-ddtree-topk fused`` (the default) selects it.
"""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (triton >= 3.4); without them the cuBLAS path serves large N
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None
try:  # Gluon (triton >= 3.5): the warp-specialised ping-pong kernel on Hopper
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.language.nvidia.hopper import tma as gtma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    # TMA load into shared memory: async_copy_global_to_shared up to Triton 3.6, async_load after
    _gl_tma_load = gtma.async_load if hasattr(gtma, "async_load") else gtma.async_copy_global_to_shared
except Exception:  # pragma: no cover  (older triton: the Triton TMA kernel serves Hopper)
    gluon = None

_LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * _LOG2E)
_LN2 = tl.constexpr(0.6931471805599453)  # log(x) = log2(x) * _LN2


@triton.jit
def _load_chunk(h_row, w_ptr, cols, ks, rmask, cmask, H, stride_wv, EVEN_K: tl.constexpr):
    w_row = w_ptr + cols[:, None].to(tl.int64) * stride_wv
    if EVEN_K:
        a = tl.load(h_row + ks[None, :], mask=rmask[:, None], other=0.0)
        b = tl.load(w_row + ks[None, :], mask=cmask[:, None], other=0.0)
    else:
        kmask = ks < H
        a = tl.load(h_row + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_row + ks[None, :], mask=cmask[:, None] & kmask[None, :], other=0.0)
    return a, b


@triton.jit
def _fused_logits_kernel(
    h_ptr,  # [N, H] hidden (bf16/fp16)
    w_ptr,  # [V, H] lm_head rows of this chunk (same dtype)
    x_ptr,  # [N, V] fp32 logits out
    mx_ptr,  # [N, T] fp32 max of each BV-column tile out (SEG = BV)
    pl_ptr,  # [N, S] fp32 log-sum-exp of each vocabulary slice out
    N,
    V,
    H,
    T,  # number of vocab tiles = cdiv(V, BV)
    S,  # number of vocab slices
    stride_hn,
    stride_wv,
    stride_xn,
    stride_mn,
    BN: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    WRITE: tl.constexpr,  # False only to time the log-sum-exp part alone
):
    """Stream the head once: [BN, BV] logits tiles in fp32 (tensor cores), each row's online
    log-sum-exp over the program's vocabulary slice, and (WRITE) the logits and tile maxima.
    The tile loop and the hidden-dimension loop are one flat loop whose tile epilogue is a
    branch, so the software pipeline keeps loading across tile boundaries (a nested loop
    drained it at every tile: 20 us more at batch 1 on an H200)."""
    rb = tl.program_id(0)  # row block (fastest: programs sharing a vocab slice run together)
    sp = tl.program_id(1)  # vocab slice
    t0 = (sp * T) // S
    t1 = ((sp + 1) * T) // S
    rows = rb * BN + tl.arange(0, BN)
    rmask = rows < N
    rows64 = rows.to(tl.int64)
    cidx = tl.arange(0, BV)
    koffs = tl.arange(0, BK)
    m = tl.full((BN,), -1.0e30, tl.float32)  # running max (finite: no inf - inf)
    s = tl.zeros((BN,), tl.float32)  # running sum of exp(x - m)
    h_row = h_ptr + rows64[:, None] * stride_hn
    kt = tl.cdiv(H, BK)
    acc = tl.zeros((BN, BV), tl.float32)
    t = t0  # one past the current tile (advanced when kk wraps to 0)
    kk = -1
    for _ in range(0, (t1 - t0) * kt):
        kk = tl.where(kk == kt - 1, 0, kk + 1)
        t = tl.where(kk == 0, t + 1, t)
        cols = (t - 1) * BV + cidx
        cmask = cols < V
        ks = kk * BK + koffs
        a, b = _load_chunk(h_row, w_ptr, cols, ks, rmask, cmask, H, stride_wv, EVEN_K)
        acc = tl.dot(a, tl.trans(b), acc)
        if kk == kt - 1:
            x = tl.where(cmask[None, :], acc, float("-inf"))
            tmax = tl.max(x, axis=1)
            m_new = tl.maximum(m, tmax)
            p = tl.exp2((x - m_new[:, None]) * _LOG2E)
            s = s * tl.exp2((m - m_new) * _LOG2E) + tl.sum(p, axis=1)
            m = m_new
            if WRITE:
                tl.store(x_ptr + rows64[:, None] * stride_xn + cols[None, :], acc,
                         mask=rmask[:, None] & cmask[None, :])
                tl.store(mx_ptr + rows64 * stride_mn + (t - 1), tmax, mask=rmask)
            acc = tl.zeros((BN, BV), tl.float32)
    lse = m + tl.log2(s) * _LN2
    tl.store(pl_ptr + rows64 * S + sp, lse, mask=rmask)


@triton.jit
def _lse_segmax_pass_kernel(
    x_ptr,  # [N, C] fp32 logits of one vocabulary chunk (from cuBLAS)
    mx_ptr,  # [N, G] fp32 max of each SEG-column segment out
    pl_ptr,  # [N, S] fp32 log-sum-exp of each slice out
    C,
    T,  # number of BV-column tiles = cdiv(C, BV)
    S,  # slices per row
    G,  # segments = cdiv(C, SEG)
    stride_xn,
    stride_mn,
    BV: tl.constexpr,
    SEG: tl.constexpr,
    WRITE: tl.constexpr,
):
    """One (row, slice) per program: the slice's log-sum-exp and segment maxima. The next tile
    is loaded before the current one is reduced (register double-buffering), and the sum of
    exponentials is kept per column, so a tile costs one block reduction (its segment maxima)."""
    row = tl.program_id(0)
    sp = tl.program_id(1)
    t0 = (sp * T) // S
    t1 = ((sp + 1) * T) // S
    NSEG: tl.constexpr = BV // SEG
    cidx = tl.arange(0, BV)
    gidx = tl.arange(0, NSEG)
    x_row = x_ptr + row.to(tl.int64) * stride_xn
    m = -1.0e30
    sv = tl.zeros((BV,), tl.float32)  # sum of exp(x - m) per column of every tile so far
    c_end = tl.minimum(C, t1 * BV)  # end of this slice's columns
    c0 = t0 * BV + cidx
    x_nxt = tl.load(x_row + c0, mask=c0 < c_end, other=float("-inf"))
    for t in range(t0, t1):
        x = x_nxt
        cn = (t + 1) * BV + cidx
        x_nxt = tl.load(x_row + cn, mask=cn < c_end, other=float("-inf"))
        segm = tl.max(tl.reshape(x, (NSEG, SEG)), axis=1)
        m_new = tl.maximum(m, tl.max(segm, axis=0))
        sv = sv * tl.exp2((m - m_new) * _LOG2E) + tl.exp2((x - m_new) * _LOG2E)
        m = m_new
        if WRITE:
            g = t * NSEG + gidx
            tl.store(mx_ptr + row.to(tl.int64) * stride_mn + g, segm, mask=g < G)
    lse = m + tl.log2(tl.sum(sv, axis=0)) * _LN2
    tl.store(pl_ptr + row.to(tl.int64) * S + sp, lse)


@triton.jit
def _tma_logits_kernel(
    a_desc,  # TMA descriptor of hidden [N, H], blocks [BM, BK]
    b_desc,  # TMA descriptor of this chunk's lm_head rows [C, H], blocks [BN, BK]
    x_desc,  # TMA descriptor of the fp32 logits out [N, C], blocks [BM, BN]
    mx_ptr,  # [N, G] fp32 max of each SEG-column segment out
    pl_ptr,  # [N, T] fp32 log-sum-exp of each BN-column tile out
    N,
    C,
    H,
    G,
    T,  # column tiles = cdiv(C, BN)
    stride_mn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SEG: tl.constexpr,
    NUM_PROGS: tl.constexpr,
    WRITE: tl.constexpr,
):
    """Persistent matmul with the pass as its epilogue (Hopper and newer): each program walks
    BM x BN tiles, all row tiles of one column tile next to each other (the weight tile is read
    from HBM once, then from L2); operands arrive by TMA into a software pipeline that runs
    across tile boundaries. A tile's epilogue stores its fp32 logits by TMA (asynchronous: the
    next tile's loads are already in flight) plus, per row, its segment maxima and its
    log-sum-exp, so the logits are never read back for the LSE. Rows and columns beyond N and C
    are zero-filled by TMA on load, clipped on store, and masked to -inf in the reductions."""
    start = tl.program_id(0)
    num_m = tl.cdiv(N, BM)
    k_tiles = tl.cdiv(H, BK)
    num_tiles = num_m * T
    NS: tl.constexpr = BN // SEG
    tile_c = start - NUM_PROGS  # the epilogue's tile counter, kept apart as in Triton's tutorial
    for tile in tl.range(start, num_tiles, NUM_PROGS, flatten=True):
        pm = tile % num_m
        pn = tile // num_m
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pm * BM, ki * BK])
            b = b_desc.load([pn * BN, ki * BK])
            acc = tl.dot(a, b.T, acc)
        tile_c += NUM_PROGS
        pm = tile_c % num_m
        pn = tile_c // num_m
        if WRITE:
            x_desc.store([pm * BM, pn * BN], acc)
        rows = pm * BM + tl.arange(0, BM)
        rmask = rows < N
        rows64 = rows.to(tl.int64)
        cols = pn * BN + tl.arange(0, BN)
        x = tl.where((cols < C)[None, :], acc, float("-inf"))
        if NS == 1:
            tmax = tl.max(x, axis=1)
            if WRITE:
                tl.store(mx_ptr + rows64 * stride_mn + pn, tmax, mask=rmask)
        else:
            segm = tl.max(tl.reshape(x, (BM, NS, SEG)), axis=2)
            tmax = tl.max(segm, axis=1)
            if WRITE:
                g = pn * NS + tl.arange(0, NS)
                tl.store(mx_ptr + rows64[:, None] * stride_mn + g[None, :], segm,
                         mask=rmask[:, None] & (g < G)[None, :])
        s = tl.sum(tl.exp2((x - tmax[:, None]) * _LOG2E), axis=1)
        tl.store(pl_ptr + rows64 * T + pn, tmax + tl.log2(s) * _LN2, mask=rmask)


if gluon is not None:

    @gluon.jit
    def _pp_producer(a_desc, b_desc, a_bufs, b_bufs, full, empty, N, H, T, BM: gl.constexpr, BN: gl.constexpr,
                     BK: gl.constexpr, STAGES: gl.constexpr, NUM_PROGS: gl.constexpr):
        """The ping-pong kernel's loads: the program's tiles in order, every k-step of a tile into
        the next stage of one TMA ring once its consumer has released it."""
        start = gl.program_id(0)
        num_m = gl.cdiv(N, BM)
        k_tiles = gl.cdiv(H, BK)
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
        pos = 0
        for tile in range(start, num_m * T, NUM_PROGS):
            pm = tile % num_m
            pn = tile // num_m
            for ki in range(k_tiles):
                s = pos % STAGES
                mbarrier.wait(empty.index(s), ((pos // STAGES) & 1) ^ 1)  # the first round passes
                mbarrier.expect(full.index(s), nbytes)
                _gl_tma_load(a_desc, [pm * BM, ki * BK], full.index(s), a_bufs.index(s))
                _gl_tma_load(b_desc, [pn * BN, ki * BK], full.index(s), b_bufs.index(s))
                pos += 1

    @gluon.jit
    def _pp_consumer(c: gl.constexpr, a_bufs, b_bufs, full, empty, order, mx_ptr, pl_ptr, x_ptr, N, C, H, G, T,
                     stride_mn, stride_xn, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, SEG: gl.constexpr,
                     STAGES: gl.constexpr, NUM_PROGS: gl.constexpr, WRITE: gl.constexpr):
        """Consumer c (one warpgroup) takes every other tile of the program: wgmma over the ring's
        stages, then the epilogue (fp32 logits, segment maxima, the tile's log-sum-exp) while the
        other consumer's wgmmas run. The mainloops alternate (order barriers), so a consumer waits
        on a stage at most one phase behind it."""
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BN, 16])
        NS: gl.constexpr = BN // SEG
        start = gl.program_id(0)
        num_m = gl.cdiv(N, BM)
        k_tiles = gl.cdiv(H, BK)
        n_my = gl.cdiv(num_m * T - start, NUM_PROGS)
        lcols = gl.arange(0, BN, layout=gl.SliceLayout(0, mma_layout))
        nt = gl.to_tensor(0)  # this consumer's tiles so far
        for i in range(c, n_my, 2):
            if c == 0:
                mbarrier.wait(order.index(0), (nt - 1) & 1, pred=nt > 0)
            else:
                mbarrier.wait(order.index(1), nt & 1)
            tile = start + i * NUM_PROGS
            pm = tile % num_m
            pn = tile // num_m
            pos0 = i * k_tiles
            acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
            for ki in range(k_tiles):
                pos = pos0 + ki
                s = pos % STAGES
                mbarrier.wait(full.index(s), (pos // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))
                mbarrier.arrive(empty.index((pos + STAGES - 1) % STAGES), pred=ki > 0)  # the previous stage
            mbarrier.arrive(order.index(1 - c))
            nt += 1
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index((pos0 + k_tiles - 1) % STAGES))
            rows = pm * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, mma_layout))
            rmask = rows < N
            rows64 = rows.to(gl.int64)
            cols = pn * BN + lcols
            cmask = cols < C
            x = gl.where(cmask[None, :], acc, float("-inf"))
            tmax = gl.max(x, axis=1)
            if WRITE:
                for j in gl.static_range(NS):
                    segm = gl.max(gl.where(((lcols // SEG) == j)[None, :], x, float("-inf")), axis=1)
                    g = pn * NS + j
                    gl.store(mx_ptr + rows64 * stride_mn + g, segm, mask=rmask & (g < G))
                gl.store(x_ptr + rows64[:, None] * stride_xn + cols[None, :], acc, mask=rmask[:, None] & cmask[None, :])
            ssum = gl.sum(gl.exp2((x - tmax[:, None]) * _LOG2E), axis=1)
            gl.store(pl_ptr + rows64 * T + pn, tmax + gl.log2(ssum) * _LN2, mask=rmask)

    @gluon.jit
    def _pingpong_logits_kernel(a_desc, b_desc, mx_ptr, pl_ptr, x_ptr, N, C, H, G, T, stride_mn, stride_xn,
                                BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, SEG: gl.constexpr,
                                STAGES: gl.constexpr, NUM_PROGS: gl.constexpr, WRITE: gl.constexpr,
                                REGS: gl.constexpr):
        """Persistent warp-specialised matmul with the pass as its epilogue (Hopper: wgmma). The
        same outputs as _tma_logits_kernel; a producer partition feeds one ring of STAGES TMA
        stages, and two consumer warpgroups take alternate tiles, so one's epilogue runs while
        the other's wgmmas keep the tensor cores busy (ping-pong)."""
        dtype: gl.constexpr = a_desc.dtype
        a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(order.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        gl.warp_specialize([
            (_pp_producer, (a_desc, b_desc, a_bufs, b_bufs, full, empty, N, H, T, BM, BN, BK, STAGES, NUM_PROGS)),
            (_pp_consumer, (0, a_bufs, b_bufs, full, empty, order, mx_ptr, pl_ptr, x_ptr, N, C, H, G, T, stride_mn,
                            stride_xn, BM, BN, BK, SEG, STAGES, NUM_PROGS, WRITE)),
            (_pp_consumer, (1, a_bufs, b_bufs, full, empty, order, mx_ptr, pl_ptr, x_ptr, N, C, H, G, T, stride_mn,
                            stride_xn, BM, BN, BK, SEG, STAGES, NUM_PROGS, WRITE)),
        ], [4, 4], [REGS, REGS])


@triton.jit
def _desc_key(v, idx):
    """int64 keys whose descending order is: larger value first, then the lower index."""
    bits = v.to(tl.int32, bitcast=True)
    key32 = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (key32.to(tl.int64) << 32) | (0x7FFFFFFF - idx).to(tl.int64)


@triton.jit
def _key_value(key):
    """The fp32 value packed into a _desc_key key."""
    hi = (key >> 32).to(tl.int32)
    return (hi ^ ((hi >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _key_index(key):
    """The index packed into a _desc_key key."""
    return 0x7FFFFFFF - (key & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def _lse_of_parts(plse, pmask):
    """log-sum-exp of a row's partial log-sum-exps (entries outside pmask ignored)."""
    pmax = tl.max(plse, axis=0)
    return pmax + tl.log2(tl.sum(tl.where(pmask, tl.exp2((plse - pmax) * _LOG2E), 0.0), axis=0)) * _LN2


@triton.jit
def _select_topk_kernel(
    x_ptr,  # [N, C] fp32 logits of one vocabulary chunk
    mx_ptr,  # [N, G] fp32 maximum of each SEG-column segment
    pl_ptr,  # [N, S] fp32 log-sum-exp of each slice of the chunk
    olp_ptr,  # out: log-probs relative to the chunk's log-sum-exp, descending
    oid_ptr,  # out: int64 global ids
    olse_ptr,  # out: the chunk's log-sum-exp
    cs_ptr,  # [N, CAP] int64 scratch: the compacted candidates (unused if CAP == 0)
    C,
    G,
    S,
    id0,  # global id of the chunk's first column
    stride_xn,
    stride_mn,
    stride_on,
    stride_ln,
    K: tl.constexpr,
    KP: tl.constexpr,  # power of two >= max(K, 2)
    SEG: tl.constexpr,
    GB: tl.constexpr,  # power of two >= max(G, KP)
    SB: tl.constexpr,  # power of two >= S
    SUP: tl.constexpr,  # segments per group (1: no group level)
    NG: tl.constexpr,  # power of two >= max(cdiv(G, SUP), KP)
    CAP: tl.constexpr,  # power of two >= KP: compacted candidates (0: sort all K x SEG)
):
    """One row per program: the K segments with the largest maxima (lower segment first among
    equal maxima), then the top K of their K x SEG logits (lower id first among equal values).
    Exact: an element outside those segments is at most the K-th segment maximum, which is at
    most the K-th largest element. With SUP > 1 the segments are found in two levels: the K
    groups of SUP consecutive segments with the largest maxima, then the best K of their K x SUP
    segments (the same argument, one level up; groups are ranges of ids, so the lower group
    holds the lower ids): sorts of G / SUP and K x SUP keys instead of one of G. With CAP, only
    the candidates at least as large as the K-th largest segment maximum can be in the top K
    (the K segment maxima are K elements at least that large); when at most CAP of the K x SEG
    are, they are compacted (through cs_ptr) and sorted alone, else all are sorted."""
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    sidx = tl.arange(0, SB)
    smask = sidx < S
    lse = _lse_of_parts(tl.load(pl_ptr + row64 * S + sidx, mask=smask, other=float("-inf")), smask)

    mrow = mx_ptr + row64 * stride_mn
    if SUP == 1:
        g = tl.arange(0, GB)
        segm = tl.load(mrow + g, mask=g < G, other=float("-inf"))
        tseg = tl.topk(_desc_key(segm, g), KP)
    else:
        gi = tl.arange(0, NG)
        g_all = gi[:, None] * SUP + tl.arange(0, SUP)[None, :]
        grpm = tl.max(tl.load(mrow + g_all, mask=g_all < G, other=float("-inf")), axis=1)
        grp = _key_index(tl.topk(_desc_key(grpm, gi), KP))
        g2 = grp[:, None] * SUP + tl.arange(0, SUP)[None, :]  # padding groups give ids >= G
        segm2 = tl.load(mrow + g2, mask=g2 < G, other=float("-inf"))
        tseg = tl.topk(tl.reshape(_desc_key(segm2, g2), (KP * SUP,)), KP)
    seg = _key_index(tseg)
    cols = seg[:, None] * SEG + tl.arange(0, SEG)[None, :]
    cmask = (seg < G)[:, None] & (cols < C)
    vals = tl.load(x_ptr + row64 * stride_xn + cols, mask=cmask, other=float("-inf"))
    keys = tl.reshape(_desc_key(vals, cols), (KP * SEG,))
    o = tl.arange(0, KP)
    omask = o < K
    if CAP == 0:
        top = tl.topk(keys, KP)
    else:
        tau = tl.min(tl.where(omask, _key_value(tseg), float("inf")), axis=0)  # K-th segment maximum
        flag = tl.reshape(vals >= tau, (KP * SEG,))
        cnt = tl.sum(flag.to(tl.int32), axis=0)
        if cnt <= CAP:
            pos = tl.cumsum(flag.to(tl.int32), axis=0) - 1
            slot = tl.arange(0, CAP)
            crow = cs_ptr + row64 * CAP
            lowest = _desc_key(tl.full((CAP,), float("-inf"), tl.float32), tl.full((CAP,), 0x7FFFFFFF, tl.int32))
            tl.store(crow + slot, lowest, mask=slot >= cnt)  # padding: below every candidate
            tl.store(crow + pos, keys, mask=flag)
            tl.debug_barrier()
            top = tl.topk(tl.load(crow + slot), KP)
        else:
            top = tl.topk(keys, KP)
    val = _key_value(top)
    col = _key_index(top)
    tl.store(olp_ptr + row64 * stride_on + o, val - lse, mask=omask)
    tl.store(oid_ptr + row64 * stride_on + o, col.to(tl.int64) + id0, mask=omask)
    tl.store(olse_ptr + row64 * stride_ln, lse)


@triton.jit
def _merge_topk_kernel(
    pv_ptr,  # [N, S, KP] fp32 partial values (raw logits, or log-probs if IS_LP)
    pi_ptr,  # [N, S, KP] int partial global ids
    pl_ptr,  # [N, S] fp32 partial log-sum-exp
    olp_ptr,  # [N, K] fp32 out log-probs, descending
    oid_ptr,  # [N, K] int64 out ids
    olse_ptr,  # [N] fp32 out log-sum-exp
    S,
    KP_IN,
    stride_pv_n,
    stride_pv_s,
    stride_pl_n,
    K: tl.constexpr,
    KO: tl.constexpr,  # power of two >= K
    SB: tl.constexpr,  # power of two >= S
    KB: tl.constexpr,  # power of two >= KP_IN
    IS_LP: tl.constexpr,
):
    row = tl.program_id(0)
    sidx = tl.arange(0, SB)
    kidx = tl.arange(0, KB)
    smask = sidx < S
    plse = tl.load(pl_ptr + row * stride_pl_n + sidx, mask=smask, other=float("-inf"))
    lse = _lse_of_parts(plse, smask)

    m2 = smask[:, None] & (kidx[None, :] < KP_IN)
    offs = row * stride_pv_n + sidx[:, None] * stride_pv_s + kidx[None, :]
    v = tl.load(pv_ptr + offs, mask=m2, other=float("-inf"))
    if IS_LP:
        v = v + plse[:, None]
    # One _desc_key per candidate (the value, then the inverted flat position), so a single max
    # reduction per round gives the value and the position, and equal values resolve to the
    # lower position (split-major: the lower vocab slice).
    key = tl.reshape(_desc_key(v, sidx[:, None] * KB + kidx[None, :]), (SB * KB,))
    oidx = tl.arange(0, KO)
    out_key = tl.zeros((KO,), tl.int64)
    for j in tl.static_range(K):
        kmax = tl.max(key, axis=0)
        out_key = tl.where(oidx == j, kmax, out_key)
        key = tl.where(key == kmax, -9223372036854775807, key)
    val = _key_value(out_key)
    pos = _key_index(out_key)
    omask = oidx < K
    ids = tl.load(pi_ptr + row * stride_pv_n + (pos // KB) * stride_pv_s + (pos % KB), mask=omask)
    tl.store(olp_ptr + row * K + oidx, val - lse, mask=omask)
    tl.store(oid_ptr + row * K + oidx, ids.to(tl.int64), mask=omask)
    tl.store(olse_ptr + row, lse)


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


_SM_COUNT = {}
LAST_LAUNCH = {}  # the last compiled kernels (registers, spills, PTX), for the benchmark


def _sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


# Rows from which the logits come from cuBLAS (+ the Triton pass) instead of the Triton
# kernel. Measured on an H200 (docs/fused-topk.md): the Triton kernel streams the head at the
# copy-bandwidth floor at batch 1 (N = 15); from about N = 60 cuBLAS is faster.
CUBLAS_MIN_ROWS = 64
# The most fp32 logits one chunk holds (1 GiB: the whole 248 320-column shard up to N = 1081;
# L2-sized chunks measured 3-10% slower in total), and the most segments a row's selection
# sorts (a chunk has at most MAX_SEGMENTS x SEG columns).
CHUNK_BYTES = 1 << 30
MAX_SEGMENTS = 4096
# Rows from which the logits come from the persistent TMA kernel with the pass as its epilogue
# (Hopper and newer, 16-byte aligned bf16/fp16 operands) instead of cuBLAS + the pass. On an
# H200 the ping-pong kernel is 9.6% faster at N = 960, 5.8% at 480 and level at 240 and 720 (the
# Triton TMA kernel: 2-3% faster at 960, 5-16% slower below; docs/fused-topk.md).
TMA_MIN_ROWS = 896
_MM_OUT_DTYPE = {}
_TMA_DEVICE = {}
_PINGPONG_DEVICE = {}
_GL_DTYPE = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _tma_device(device: torch.device) -> bool:
    """Hopper or newer, with the shared memory the TMA kernel's stages take (about 224 KB of the
    227 KB a block may opt into on H100/H200/B200), and Triton's host-side tensor descriptors."""
    if TensorDescriptor is None or device.type != "cuda":
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _TMA_DEVICE:
        props = torch.cuda.get_device_properties(idx)
        smem = getattr(props, "shared_memory_per_block_optin", 0)
        _TMA_DEVICE[idx] = props.major >= 9 and smem >= 227 * 1024
    return _TMA_DEVICE[idx]


def _pingpong_device(device: torch.device) -> bool:
    """The ping-pong kernel's wgmma is Hopper's (compute capability 9.x); it needs Gluon and the
    TMA kernel's shared memory (5 stages of 40 KB). Blackwell takes the Triton TMA kernel. Gluon's
    API still moves between Triton releases, so the kernel is compiled once here (nothing is
    launched); if this Triton cannot build it, Hopper takes the Triton TMA kernel, with a warning."""
    if gluon is None or not _tma_device(device):
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PINGPONG_DEVICE:
        ok = torch.cuda.get_device_properties(idx).major == 9
        if ok:
            dev = torch.device("cuda", idx)
            cfg = default_config(TMA_MIN_ROWS, 256, 64, dev, path="pingpong")
            h = torch.zeros((64, 64), dtype=torch.bfloat16, device=dev)
            w = torch.zeros((256, 64), dtype=torch.bfloat16, device=dev)
            x = torch.empty((64, 256), dtype=torch.float32, device=dev)
            try:
                _pingpong_launch(h, w, x, torch.empty((64, 2), dtype=torch.float32, device=dev), cfg, True, warmup=True)
            except Exception as exc:  # an incompatible Triton/Gluon: fall back rather than fail the draft step
                warnings.warn(f"fused_depth_topk: the ping-pong kernel does not compile with triton "
                              f"{triton.__version__} ({exc!r:.300}); large batches use the Triton TMA kernel",
                              stacklevel=2)
                ok = False
        _PINGPONG_DEVICE[idx] = ok
    return _PINGPONG_DEVICE[idx]


def _pingpong_launch(hidden, w, x, mx, cfg, write, warmup=False):
    """The ping-pong kernel over one chunk (see _chunk_logits); warmup compiles without launching.
    Returns the per-tile LSEs [N, T]."""
    n, c = x.shape
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    t = triton.cdiv(c, bn)
    pl = torch.empty((n, t), dtype=torch.float32, device=hidden.device)
    dt = getattr(gl, _GL_DTYPE[hidden.dtype])
    a_desc = GluonTensorDescriptor.from_tensor(hidden, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], dt))
    b_desc = GluonTensorDescriptor.from_tensor(w, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], dt))
    progs = max(1, min(cfg["sms"], triton.cdiv(n, bm) * t))
    args = (a_desc, b_desc, mx, pl, x, n, c, hidden.shape[1], mx.shape[1], t, mx.stride(0), x.stride(0))
    meta = dict(BM=bm, BN=bn, BK=bk, SEG=cfg["SEG"], STAGES=cfg["STAGES"], NUM_PROGS=progs, WRITE=write,
                REGS=cfg["REGS"], num_warps=4)
    if warmup:
        _pingpong_logits_kernel.warmup(*args, grid=(progs,), **meta)
    else:
        LAST_LAUNCH["chunk"] = _pingpong_logits_kernel[(progs,)](*args, **meta)
    return pl


def _tma_operands(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and row strides, and bf16/fp16 operands."""
    def ok(t):
        return t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
    return hidden.dtype in (torch.bfloat16, torch.float16) and ok(hidden) and ok(weight)


def _has_mm_out_dtype() -> bool:
    """torch.mm(bf16, bf16, out_dtype=torch.float32): cuBLAS with fp32 output (torch >= 2.8).
    Probed once by a call that does not synchronise (safe even if the first call is captured)."""
    if "ok" not in _MM_OUT_DTYPE:
        try:
            a = torch.ones((2, 8), dtype=torch.bfloat16, device="cuda")
            out = torch.empty((2, 2), dtype=torch.float32, device="cuda")
            torch.mm(a, a.T, out_dtype=torch.float32, out=out)
            _MM_OUT_DTYPE["ok"] = True
        except Exception:  # older torch, or no CUDA: the Triton path only
            _MM_OUT_DTYPE["ok"] = False
    return _MM_OUT_DTYPE["ok"]


def _mm_fp32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out[M, N] fp32 = a[M, K] @ b[K, N] with a, b bf16/fp16 (fp32 accumulation in cuBLAS)."""
    torch.mm(a, b, out_dtype=torch.float32, out=out)


def default_config(
    n: int, v: int, h: int, device: torch.device, path: Optional[str] = None, tma: bool = True
) -> dict:
    """Launch geometry by row count: small N is a memory-bound stream over the head (the Triton
    logits kernel), large N a matmul (from TMA_MIN_ROWS rows on Hopper or newer the persistent
    TMA kernel with the pass as its epilogue, warp-specialised on Hopper, otherwise cuBLAS fp32
    logits + the Triton pass). path forces "triton", "cublas", "tma" or "pingpong"; tma=False
    rules both TMA kernels out (operands they cannot take). Measured on an H200 (docs/fused-topk.md)."""
    sms = _sm_count(device) if device.type == "cuda" else 132
    if n <= 16:
        cfg = dict(BN=16, BV=128, BK=128, num_warps=4, num_stages=4, waves=1)
    elif n <= 32:
        cfg = dict(BN=32, BV=64, BK=128, num_warps=4, num_stages=4, waves=2)
    elif n <= 64:
        cfg = dict(BN=64, BV=64, BK=128, num_warps=4, num_stages=4, waves=2)
    else:
        cfg = dict(BN=128, BV=128, BK=64, num_warps=8, num_stages=3, waves=1)  # smem: 96 KB of stages + the 64 KB tile
    if path is None:
        if n >= TMA_MIN_ROWS and tma and _tma_device(device):
            path = "pingpong" if _pingpong_device(device) else "tma"
        elif n >= CUBLAS_MIN_ROWS and device.type == "cuda" and _has_mm_out_dtype():
            path = "cublas"
        else:
            path = "triton"
    if path == "cublas":
        # The pass reads the fp32 logits once: (row, slice) programs of BV-column tiles with
        # 128-column segments; rows are split into slices until about 4 programs per SM.
        cfg = dict(path="cublas", VC=None, BV=1024, SEG=128, num_warps=2, pass_waves=4)
    if path == "tma":
        # 64-row tiles (960 = 15 x 64: no idle rows at batch 64), 4 stages of 40 KB + the 64 KB
        # output tile in shared memory; one program per SM. The selection finds its segments
        # through groups of 16 (2 048 columns).
        cfg = dict(path="tma", VC=None, BM=64, BN=256, BK=64, SEG=128, num_warps=4, num_stages=4, SUP=16)
    if path == "pingpong":
        # The same tiles on Hopper, warp-specialised: a ring of 5 stages of 40 KB feeds two consumer
        # warpgroups (232 registers each) that take alternate tiles, so one's epilogue (plain
        # stores of the fp32 logits) overlaps the other's wgmmas.
        cfg = dict(path="pingpong", VC=None, BM=64, BN=256, BK=64, SEG=128, STAGES=5, REGS=232, SUP=16)
    cfg.setdefault("SUP", 1)
    # CAP (compacted candidates in the selection): off by default; 64 measured 0.5-1% faster at
    # K 16 with the Triton TMA kernel, within the spread with the ping-pong one (docs/fused-topk.md).
    cfg.setdefault("CAP", 0)
    # Selection: one program per row; few rows leave it latency-bound, where 8 warps sort faster
    # (batch 1: 13 / 20 us at K 8 / 16 against 16 / 21 us on 4 warps).
    cfg["sel_warps"] = 8 if n < 256 else 4
    cfg["sms"] = sms
    return cfg


def _num_splits(n: int, v: int, cfg: dict) -> int:
    """Vocabulary slices of the Triton logits kernel: whole waves only, R * S <= SMs * waves
    (a partial extra wave would double the time)."""
    if "S" in cfg:
        return int(cfg["S"])
    rblocks = triton.cdiv(n, cfg["BN"])
    tiles = triton.cdiv(v, cfg["BV"])
    s = max(1, (cfg["sms"] * cfg["waves"]) // rblocks)
    return max(1, min(s, tiles))


def _pass_slices(n: int, tiles: int, cfg: dict) -> int:
    """Slices per row of the cuBLAS path's pass: enough (row, slice) programs for pass_waves
    per SM (one per row from 528 rows on an H200)."""
    if "PS" in cfg:
        return max(1, min(int(cfg["PS"]), tiles))
    return max(1, min(tiles, triton.cdiv(cfg["sms"] * cfg["pass_waves"], max(n, 1))))


def _chunk_columns(n: int, v: int, seg: int, cfg: dict) -> int:
    """Vocabulary columns per chunk: VC (0: the whole shard), else as many as fit chunk_bytes
    of fp32 logits, a multiple of 256; never more than MAX_SEGMENTS segments."""
    vc = cfg.get("VC")
    if vc is None:
        vc = max(256, cfg.get("chunk_bytes", CHUNK_BYTES) // (4 * max(n, 1)) // 256 * 256)
    return min(int(vc) or v, v, MAX_SEGMENTS * seg)


def _chunk_logits(hidden, w, x, mx, cfg, write):
    """Logits of one chunk into x [N, C] fp32, segment maxima into mx [N, G], and the LSE of
    each vocabulary slice (returned, [N, S]): the TMA kernel, cuBLAS + pass, or the Triton kernel."""
    n, c = x.shape
    dev = hidden.device
    if cfg.get("path") == "pingpong":
        return _pingpong_launch(hidden, w, x, mx, cfg, write)
    if cfg.get("path") == "tma":
        bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
        t = triton.cdiv(c, bn)
        pl = torch.empty((n, t), dtype=torch.float32, device=dev)
        progs = max(1, min(cfg["sms"], triton.cdiv(n, bm) * t))
        LAST_LAUNCH["chunk"] = _tma_logits_kernel[(progs,)](
            TensorDescriptor.from_tensor(hidden, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
            TensorDescriptor.from_tensor(x, [bm, bn]), mx, pl, n, c, hidden.shape[1], mx.shape[1], t, mx.stride(0),
            BM=bm, BN=bn, BK=bk, SEG=cfg["SEG"], NUM_PROGS=progs, WRITE=write,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        return pl
    tiles = triton.cdiv(c, cfg["BV"])
    if cfg.get("path") == "cublas":
        _mm_fp32(hidden, w.T, x)
        ps = _pass_slices(n, tiles, cfg)
        pl = torch.empty((n, ps), dtype=torch.float32, device=dev)
        LAST_LAUNCH["chunk"] = _lse_segmax_pass_kernel[(n, ps)](
            x, mx, pl, c, tiles, ps, mx.shape[1], x.stride(0), mx.stride(0),
            BV=cfg["BV"], SEG=cfg["SEG"], WRITE=write, num_warps=cfg["num_warps"],
        )
        return pl
    h = hidden.shape[1]
    s = _num_splits(n, c, cfg)
    pl = torch.empty((n, s), dtype=torch.float32, device=dev)
    LAST_LAUNCH["split"] = _fused_logits_kernel[(triton.cdiv(n, cfg["BN"]), s)](
        hidden, w, x, mx, pl, n, c, h, tiles, s,
        hidden.stride(0), w.stride(0), x.stride(0), mx.stride(0),
        BN=cfg["BN"], BV=cfg["BV"], BK=cfg["BK"], EVEN_K=(h % cfg["BK"] == 0), WRITE=write,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return pl


def fused_local_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_size: Optional[int] = None,
    vocab_start: int = 0,
    config: Optional[dict] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One shard: (log-probs under this shard [N, k] fp32 descending, global ids [N, k] int64,
    shard log-sum-exp [N] fp32). Only rows < vocab_size of weight count (padding excluded)."""
    assert hidden.dim() == 2 and weight.dim() == 2 and hidden.shape[1] == weight.shape[1]
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    assert weight.stride(1) == 1, "lm_head weight must be row-major"
    n, h = hidden.shape
    v = int(weight.shape[0] if vocab_size is None else vocab_size)
    assert 0 < k <= v and v < 2**31
    tma = _tma_operands(hidden, weight)
    cfg = dict(default_config(n, v, h, hidden.device, path=(config or {}).get("path"), tma=tma))
    if config:
        cfg.update(config)
    if cfg.get("path") == "tma":
        assert TensorDescriptor is not None, "path 'tma' needs triton.tools.tensor_descriptor (triton >= 3.4)"
        assert tma, "path 'tma' needs bf16/fp16 operands with 16-byte aligned bases and row strides"
    if cfg.get("path") == "pingpong":
        assert _pingpong_device(hidden.device), "path 'pingpong' needs Gluon (triton >= 3.5) on a Hopper GPU"
        assert tma, "path 'pingpong' needs bf16/fp16 operands with 16-byte aligned bases and row strides"
    seg = cfg["SEG"] if cfg.get("path") in ("cublas", "tma", "pingpong") else cfg["BV"]
    vc = _chunk_columns(n, v, seg, cfg)
    starts = range(0, v, vc)
    dev = hidden.device
    lp = torch.empty((n, len(starts), k), dtype=torch.float32, device=dev)
    ids = torch.empty((n, len(starts), k), dtype=torch.int64, device=dev)
    lse = torch.empty((n, len(starts)), dtype=torch.float32, device=dev)
    if n == 0:
        return lp[:, 0], ids[:, 0], lse[:, 0]
    # TMA stores need 16-byte aligned rows: the TMA path pads the logits' row stride to 4 columns
    pad = 4 if cfg.get("path") == "tma" else 1
    buf = torch.empty((n * triton.cdiv(vc, pad) * pad,), dtype=torch.float32, device=dev)
    mbuf = torch.empty((n * triton.cdiv(vc, seg),), dtype=torch.float32, device=dev)
    kp = max(2, _next_pow2(k))  # tl.topk takes a power of two; 1 is not handled by triton 3.6
    cap = max(_next_pow2(cfg["CAP"]), kp) if cfg.get("CAP") else 0
    cs = torch.empty((n, max(cap, 1)), dtype=torch.int64, device=dev)  # the selection's scratch
    write = cfg.get("do_topk", True)  # False: the logits step alone (the benchmark's lse-only time)
    for i, c0 in enumerate(starts):
        c = min(v, c0 + vc) - c0
        g = triton.cdiv(c, seg)
        cp = triton.cdiv(c, pad) * pad
        x, mx = buf[: n * cp].view(n, cp)[:, :c], mbuf[: n * g].view(n, g)
        pl = _chunk_logits(hidden, weight[c0 : c0 + c], x, mx, cfg, write)
        if write:
            LAST_LAUNCH["select"] = _select_topk_kernel[(n,)](
                x, mx, pl, lp[:, i], ids[:, i], lse[:, i], cs,
                c, g, pl.shape[1], int(vocab_start) + c0, x.stride(0), mx.stride(0), lp.stride(0), lse.stride(0),
                K=k, KP=kp, SEG=seg, GB=max(kp, _next_pow2(g)), SB=_next_pow2(pl.shape[1]),
                SUP=cfg["SUP"], NG=max(kp, _next_pow2(triton.cdiv(g, cfg["SUP"]))), CAP=cap,
                num_warps=cfg["sel_warps"],
            )
    if len(starts) == 1:
        return lp[:, 0], ids[:, 0], lse[:, 0]
    return merge_topk_partials(lp, ids, lse, k, is_logprob=True)


def merge_topk_partials(
    vals: torch.Tensor,
    ids: torch.Tensor,
    lse: torch.Tensor,
    k: int,
    *,
    is_logprob: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge S partial top-k lists per row: vals/ids [N, S, Kin], lse [N, S] (each part's
    log-sum-exp). vals are log-probs within their part (is_logprob) or raw logits.
    Returns (log-probs [N, k] descending, ids [N, k] int64, lse [N])."""
    n, s, kin = vals.shape
    assert k <= s * kin
    vals = vals.float().contiguous()
    ids = ids.reshape(n, s, kin).contiguous()
    lse = lse.float().reshape(n, s).contiguous()
    out_lp = torch.empty((n, k), dtype=torch.float32, device=vals.device)
    out_id = torch.empty((n, k), dtype=torch.int64, device=vals.device)
    out_lse = torch.empty((n,), dtype=torch.float32, device=vals.device)
    if n == 0:
        return out_lp, out_id, out_lse
    sb, kb = _next_pow2(s), _next_pow2(kin)
    _merge_topk_kernel[(n,)](
        vals, ids, lse, out_lp, out_id, out_lse,
        s, kin, vals.stride(0), vals.stride(1), lse.stride(0),
        K=k, KO=_next_pow2(k), SB=sb, KB=kb, IS_LP=is_logprob,
        num_warps=8 if sb * kb >= 4096 else (4 if sb * kb >= 1024 else 1),
    )
    return out_lp, out_id, out_lse


def _all_gather_rows(x: torch.Tensor, tp_group) -> torch.Tensor:
    """[N, C] per rank -> [tp, N, C]. tp_group: an SGLang GroupCoordinator (has all_gather)
    or a torch.distributed process group."""
    if hasattr(tp_group, "all_gather") and hasattr(tp_group, "world_size"):
        world = tp_group.world_size
        out = tp_group.all_gather(x, dim=0)
    else:
        import torch.distributed as dist

        world = dist.get_world_size(tp_group)
        out = torch.empty((world * x.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=tp_group)
    return out.view(world, x.shape[0], x.shape[1])


def fused_depth_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_size: Optional[int] = None,
    vocab_start: int = 0,
    tp_group=None,
    config: Optional[dict] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities of softmax(hidden @ weight.T) over the full (all-shard)
    vocabulary: hidden [N, H] (all depths of all requests), weight [V_local, H] ->
    (log-probs [N, k] fp32 descending, ids [N, k] int64 global)."""
    lp, ids, lse = fused_local_topk(
        hidden, weight, k, vocab_size=vocab_size, vocab_start=vocab_start, config=config
    )
    world = 1
    if tp_group is not None:
        world = getattr(tp_group, "world_size", None)
        if world is None:
            import torch.distributed as dist

            world = dist.get_world_size(tp_group)
    if world == 1:
        return lp, ids
    if weight.shape[0] * world < 2**24:
        # One collective: K log-probs, K ids (exact in fp32 below 2**24) and the LSE per row.
        packed = torch.cat([lp, ids.to(torch.float32), lse[:, None]], dim=1)
        g = _all_gather_rows(packed, tp_group).permute(1, 0, 2)  # [N, tp, 2k+1]
        g_lp, g_id, g_lse = g[:, :, :k], g[:, :, k : 2 * k].to(torch.int64), g[:, :, 2 * k]
    else:
        g = _all_gather_rows(torch.cat([lp, lse[:, None]], dim=1), tp_group).permute(1, 0, 2)
        g_lp, g_lse = g[:, :, :k], g[:, :, k]
        g_id = _all_gather_rows(ids, tp_group).permute(1, 0, 2)
    out_lp, out_id, _ = merge_topk_partials(g_lp, g_id, g_lse, k, is_logprob=True)
    return out_lp, out_id
