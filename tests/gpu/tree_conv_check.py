"""DDTree's tree conv (patch 0004, ``kernels/ops/speculative/ddtree/tree_conv.py``) against SGLang 0.5.23's own tree conv, bit for bit.

Both kernels get the same random draft trees (topological order, root 0, deep and bushy, and a
chain), the same inputs, conv-state pool, conv windows buffer and indices (T past one 16-node tile of DDTree's kernel too); upstream's
``causal_conv1d_update`` gets the first-child / next-sibling links, DDTree's the parents. Every output
must be equal to the last bit: the conv output, every node's conv window, the overwritten conv
state, and nothing else written (a padded row, ``pad_slot_id``, is left alone by both). Widths 2-4,
bias or none, int32 (CUDA-graph buffers) and int64 (DDTree's own) parents, T from 2 up.

Plain torch + Triton (no pytest), so it runs in build/cpu-venv under ``TRITON_INTERPRET=1``
(tests/unit/series/test_tree_conv_cpu.py, fp16: numpy has no bf16) and on the lent H200 at full size in
bf16 (tests/gpu/fullsize/gdn_verify_split.py). Kernels come from ``sglang_loader.ROOTS``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_loader  # noqa: E402
from draft_trees import links, random_parents  # noqa: E402

KERNEL_MODULE = "sglang.kernels.ops.speculative.ddtree.tree_conv"  # the kernel (patch 0004's new file)
SELECT_MODULE = "sglang.srt.speculative.ddtree_tree_conv"  # its host side: select_tree_conv


def kernels(roots=None):
    """(upstream conv module, DDTree's tree conv kernel module)."""
    roots = roots or sglang_loader.ROOTS
    sglang_loader.stub_jit_utils()
    up = sglang_loader.load_module(roots, "sglang.kernels.ops.mamba.causal_conv1d_triton")
    mine = sglang_loader.load_module(roots, KERNEL_MODULE)
    return up, mine


def selector(roots=None):
    """The module of ``select_tree_conv`` (the switch of diff 0004)."""
    return sglang_loader.load_module(roots or sglang_loader.ROOTS, SELECT_MODULE)


def run_pair(up, mine, *, bs: int, T: int, dim: int, width: int, bias: bool, link_dtype, act, seed: int,
             device: str, chain: bool = False) -> dict:
    """Both kernels on one random problem; returns {"equal": {...}, "T": ..} (equal: every output bitwise)."""
    gen = torch.Generator().manual_seed(seed)
    parents = [random_parents(T, gen, window=4, chain=chain) for _ in range(bs)]
    nt, ns = zip(*(links(p) for p in parents), strict=True)
    n_lines = bs + 3
    x = torch.randn(bs, T, dim, generator=gen).to(device, act)
    w = (torch.randn(dim, width, generator=gen) * 0.5).to(device, act)
    b = (torch.randn(dim, generator=gen) * 0.1).to(device, act) if bias else None
    pool = torch.randn(n_lines, dim, width - 1, generator=gen).to(device, act)
    slots = (torch.randperm(n_lines - 1, generator=gen)[:bs] + 1).to(device, torch.int32)
    if bs > 1:
        slots[bs // 2] = up.PAD_SLOT_ID  # a padded row: both kernels skip it
    inter_idx = torch.randperm(bs + 1, generator=gen)[:bs].to(device, torch.int32)
    nxt_tok = torch.tensor(nt, dtype=link_dtype, device=device)
    nxt_sib = torch.tensor(ns, dtype=link_dtype, device=device)
    par = torch.tensor(parents, dtype=link_dtype, device=device)

    def call(fn, **links_kw):
        st = pool.clone()
        win = torch.full((bs + 1, T, dim, width - 1), 7.0, dtype=act, device=device)
        out = fn(x.transpose(1, 2), st, w, b, "silu", conv_state_indices=slots, intermediate_conv_window=win,
                 intermediate_state_indices=inter_idx, **links_kw)
        return out, st, win

    o_up, st_up, win_up = call(up.causal_conv1d_update, retrieve_next_token=nxt_tok, retrieve_next_sibling=nxt_sib,
                               retrieve_parent_token=torch.empty_like(nxt_tok))
    o_me, st_me, win_me = call(mine.ddtree_tree_conv1d_update, retrieve_next_token=nxt_tok,
                               retrieve_next_sibling=nxt_sib, retrieve_parent_token=par)
    live = (slots != up.PAD_SLOT_ID).cpu()
    rows = torch.arange(bs)[live]
    return {
        "bs": bs, "T": T, "dim": dim, "width": width, "bias": bias, "chain": chain,
        "links": str(link_dtype).replace("torch.", ""),
        "equal": {
            # The output of a padded row is never written (torch.empty_like): compare live rows only.
            "out": bool(torch.equal(o_up[rows.to(device)], o_me[rows.to(device)])),
            "conv_state": bool(torch.equal(st_up, st_me)),
            "windows": bool(torch.equal(win_up, win_me)),
        },
    }


def cases(small: bool):
    """(kwargs of run_pair) covering widths, bias, link dtypes, chains and the verify widths."""
    dim = 48 if small else 10240
    sizes = (2, 5, 9, 17, 40) if small else (16, 33, 65)
    out = []
    seed = 0
    for T in sizes:
        for width in ((2, 3, 4) if small else (4,)):
            for bias, link_dtype in ((False, torch.int64), (True, torch.int32)):
                seed += 1
                out.append(dict(bs=3, T=T, dim=dim, width=width, bias=bias, link_dtype=link_dtype, seed=seed))
    out.append(dict(bs=2, T=sizes[-1], dim=dim, width=4, bias=False, link_dtype=torch.int64, seed=99, chain=True))
    return out


def check_all(small: bool, device: str, act) -> list[dict]:
    up, mine = kernels()
    # Outside a server (no runtime context) the switch of diff 0004 gives this kernel, the default.
    assert selector().select_tree_conv(up.causal_conv1d_update) is mine.ddtree_tree_conv1d_update
    return [run_pair(up, mine, act=act, device=device, **kw) for kw in cases(small)]


if __name__ == "__main__":
    import json

    interp = os.environ.get("TRITON_INTERPRET") == "1"
    rows = check_all(small=interp, device="cpu" if interp else "cuda", act=torch.float16 if interp else torch.bfloat16)
    print(json.dumps(rows))
    sys.exit(0 if all(all(r["equal"].values()) for r in rows) else 1)
