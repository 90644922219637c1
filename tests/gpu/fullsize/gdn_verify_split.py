"""GPU bench: the two GDN kernels of a verify step, each alone, as CUDA-graph replays (issue 23, item 3).

The full-size server's profile (breakdown.py) cannot split the GDN verify honestly: SGLang launches the conv
update, the recurrent verify and the gated norm with programmatic dependent launch (PDL), so each kernel's
recorded time includes its wait for the one before. Here each kernel runs alone, back to back inside one
captured CUDA graph (``triton.testing.do_bench_cudagraph``, the way the server replays its verify graph),
on one TP-1 Qwen3.6-27B GDN layer (H 16, HV 48, K = V = 128, conv width 4, fp32 states, bf16
activations; ``tests/gpu/test_state_forking.py``'s problem and reference), at the verify widths of the
full-size run: T = 16 (DFLASH block 16 as a chain; DDTREE 15 as a tree), 33 (DDTREE 32), 65 (DDTREE 64,
tree and chain) and batch 1 and 6.

Every tree case also runs DDTree's own tree conv (patch 0004, ``kernels/ops/speculative/ddtree/tree_conv.py``: the parents
read, all nodes at once) on fresh copies of the same buffers: its conv output, conv windows and overwritten conv
state must equal upstream's bit for bit (asserted), and it is timed the same way (``ddtree_conv_ms``; also at the
tile widths of ``TREE_CONV_BLOCKS``); ``step_ms_48_layers_ddtree_conv`` is the step's two GDN kernels with it.

With ``--variants``, launch variants of the tree conv update (``BLOCK_N`` x ``num_warps``; upstream launches 256 x 4): each
channel's arithmetic does not depend on them, so every variant's outputs (conv output, conv windows, the
parents it writes) must be bit-identical to upstream's; the bench asserts it, and checks upstream's against
the float64 per-path reference (``tsf.reference``) for one case per width.

    python3 tests/gpu/fullsize/gdn_verify_split.py --out $OUT          (on the lent H200; SGLANG_FORK_ROOT)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import test_state_forking as tsf  # noqa: E402

SMALL = "--small" in sys.argv
CONV_ONLY = "--conv-only" in sys.argv  # the tree cases' conv kernels only (upstream's and DDTree's)  # CPU smoke run under TRITON_INTERPRET=1: tiny heads, short trees
if SMALL:
    tsf.H, tsf.HV, tsf.K, tsf.V, tsf.W = 2, 4, 16, 16, 4
else:
    tsf.H, tsf.HV, tsf.K, tsf.V, tsf.W = 16, 48, 128, 128, 4  # one TP-1 layer of Qwen3.6-27B
LAYERS = 48  # GDN layers of the target: per-step cost = 48 x a layer's
# Budget 64's widths first: the first run (2026-12-01, 420 s) compiled every launch variant at every width and
# ran out of time before T = 65.
CASES = ((5, True), (5, False)) if SMALL else ((65, True), (65, False), (16, False), (16, True), (33, True))
BATCHES = (1, 2) if SMALL else (1, 6)
VARIANTS = ((32, 1),) if SMALL else ((256, 2), (256, 1), (128, 1), (64, 1))
# DDTree's conv: the default launch (None), then (nodes, channels, warps) per program
# (2026-12-01: 4 x 128 x 2, now the default, was the fastest of (8, 64, 2), (16, 128, 4), (32, 64, 4),
# (16, 32, 2), (8, 128, 4), (4, 128, 2) and the first default 16 x 64 x 4 at every T and batch size)
TREE_CONV_BLOCKS = (None, (8, 32, 1)) if SMALL else (None, (2, 128, 1), (2, 256, 2), (1, 256, 2), (8, 64, 2))


class Launch:
    """``kernel[grid](...)`` with BLOCK_N and num_warps replaced (the wrapper looks the kernel up by name)."""

    def __init__(self, kernel, block_n: int, warps: int):
        self.kernel, self.block_n, self.warps = kernel, block_n, warps

    def __getitem__(self, grid):
        block_n = self.block_n

        def fixed_grid(meta):
            return grid({**meta, "BLOCK_N": block_n}) if callable(grid) else grid

        launch = self.kernel[fixed_grid]
        return lambda *a, **kw: launch(*a, **{**kw, "BLOCK_N": block_n, "num_warps": self.warps})


def graph_ms(fn) -> float:
    """Median ms of one call, replayed from a captured CUDA graph (the compile happens before capture).
    Under the Triton interpreter (the CPU smoke run, ``--small``) one timed call instead."""
    fn()
    tsf.sync()
    if tsf.DEV != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)
    import triton

    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def conv_outputs(m, p, tree: bool, launch: tuple[int, int] | None) -> tuple:
    orig = m["conv"]._causal_conv1d_update_kernel
    if launch is not None:
        m["conv"]._causal_conv1d_update_kernel = Launch(orig, *launch)
    try:
        buf = tsf.verify_buffers(p, tree)
        call = tsf.conv_call(m, p, buf, tree)
        t0 = time.perf_counter()
        out = call()
        tsf.sync()
        first_s = time.perf_counter() - t0
        ms = graph_ms(call)
        parents = None if buf["parent"] is None else buf["parent"].clone()
        return out.clone(), buf["inter_conv"].clone(), parents, ms, first_s
    finally:
        m["conv"]._causal_conv1d_update_kernel = orig


def ddtree_conv(m, p, buf: dict, launch: tuple[int, int, int] | None = None):
    """DDTree's tree conv (patch 0004) on the same buffers as ``tsf.conv_call``: it reads the parents."""
    parents = torch.tensor(p.parents, dtype=torch.int64, device=tsf.DEV)
    kw = {} if launch is None else dict(zip(("block_t", "block_n", "num_warps"), launch, strict=True))
    return lambda: m["tree_conv"].ddtree_tree_conv1d_update(
        buf["xt"], buf["conv_pool"], p.conv_w, None, "silu", conv_state_indices=p.slots,
        intermediate_conv_window=buf["inter_conv"], intermediate_state_indices=buf["inter_idx"],
        retrieve_next_token=p.nxt_tok, retrieve_next_sibling=p.nxt_sib, retrieve_parent_token=parents, **kw)


def ddtree_conv_row(m, p) -> dict:
    """DDTree's conv against upstream's on fresh buffers (one call each: output, windows and the overwritten conv
    state bit for bit), then its time per launch (default tile, and the tile widths in TREE_CONV_BLOCKS)."""
    up, mine = tsf.verify_buffers(p, True), tsf.verify_buffers(p, True)
    o_up, o_me = tsf.conv_call(m, p, up, True)(), ddtree_conv(m, p, mine)()
    tsf.sync()
    same = {"out": torch.equal(o_up, o_me), "windows": torch.equal(up["inter_conv"], mine["inter_conv"]),
            "conv_state": torch.equal(up["conv_pool"], mine["conv_pool"])}
    assert all(same.values()), (p.T, p.bs, same)  # bit for bit, no tolerance
    times = {"x".join(map(str, launch)) if launch else "default": graph_ms(
        ddtree_conv(m, p, tsf.verify_buffers(p, True), launch)) for launch in TREE_CONV_BLOCKS}
    return {"ddtree_conv_ms": times["default"], "ddtree_conv_bit_identical": same, "ddtree_conv_blocks": times}


def case(m, T: int, tree: bool, bs: int, check_reference: bool, variants: bool) -> dict:
    p = tsf.make_problem(bs, T, seed=1000 * T + bs)
    if not tree:  # a chain: the kernels get no links; the reference walks the chain
        p.parents = [[i - 1 for i in range(T)] for _ in range(bs)]
    out, windows, parents, conv_ms, first_s = conv_outputs(m, p, tree, None)
    row = {"T": T, "tree": tree, "bs": bs, "conv_ms": conv_ms, "conv_first_call_s": round(first_s, 1)}
    if tree:
        row.update(ddtree_conv_row(m, p))
    if CONV_ONLY:
        return row
    buf = tsf.verify_buffers(p, tree)
    mixed = tsf.conv_call(m, p, buf, tree)().transpose(1, 2).reshape(bs * T, p.dim)
    row["recurrent_ms"] = graph_ms(tsf.recurrent_call(m, p, buf, mixed))
    # The floor of the recurrent verify's own traffic: writing its intermediate states once (bs x T states).
    row["state_write_floor_ms"] = graph_ms(lambda: buf["inter_ssm"][:bs].zero_())
    row["state_write_gib"] = round(buf["inter_ssm"][:bs].numel() * 4 / 2**30, 4)
    row["step_ms_48_layers"] = round(LAYERS * (row["conv_ms"] + row["recurrent_ms"]), 3)
    if tree:
        row["step_ms_48_layers_ddtree_conv"] = round(LAYERS * (row["ddtree_conv_ms"] + row["recurrent_ms"]), 3)
    if check_reference:
        ref_conv, ref_out, _, ref_win = tsf.reference(p)
        got = out.transpose(1, 2).reshape(bs, T, p.dim)
        conv_err = float(tsf.rel_err(got, ref_conv).max())
        o = tsf.recurrent_call(m, p, buf, mixed)().view(bs, T, tsf.HV, tsf.V)
        out_err = float(tsf.rel_err(o, ref_out).max())
        row["max_rel_err"] = {"conv": conv_err, "out": out_err}
        tol_scale = 2 if tsf.DEV != "cuda" else 1  # the interpreter runs fp16 activations
        assert conv_err < tsf.CONV_TOL * tol_scale, (T, tree, bs, conv_err)  # bf16 conv output: 2^-8 relative
        assert out_err < tsf.OUT_TOL * tol_scale, (T, tree, bs, out_err)  # bf16 q/k/v and output, fp32 state
    if tree and variants:
        row["variants"] = {}
        for launch in VARIANTS:
            o2, w2, p2, ms, _ = conv_outputs(m, p, tree, launch)
            same = torch.equal(o2, out) and torch.equal(w2, windows) and torch.equal(p2, parents)
            row["variants"][f"{launch[0]}x{launch[1]}"] = {"conv_ms": ms, "bit_identical": same}
            assert same, (T, bs, launch)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--small", action="store_true", help="the CPU smoke run (TRITON_INTERPRET=1)")
    ap.add_argument("--variants", action="store_true",
                    help="also time the conv launch variants (each compiles anew; 2026-12-01 none was better "
                         "at every batch size)")
    ap.add_argument("--conv-only", action="store_true",
                    help="tree cases only, the two conv kernels only (no recurrent verify, no reference)")
    ap.add_argument("--deadline-s", type=float, default=400.0, help="stop starting cases after this many seconds")
    args = ap.parse_args()
    t_start = time.time()
    m = tsf.load_sglang()
    import importlib

    m["tree_conv"] = importlib.import_module("sglang.kernels.ops.speculative.ddtree.tree_conv")
    info = {"device": torch.cuda.get_device_name(0) if tsf.DEV == "cuda" else "cpu (Triton interpreter)", "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "shape": "Qwen3.6-27B GDN layer, TP1: H=16 HV=48 K=V=128 W=4, fp32 state, bf16 act",
            "timing": "triton.testing.do_bench_cudagraph median (CUDA-graph replay), one kernel alone"}
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for T, tree in (c for c in CASES if c[1] or not CONV_ONLY):
        for bs in BATCHES:
            if time.time() - t_start > args.deadline_s:
                rows.append({"T": T, "tree": tree, "bs": bs, "skipped": "deadline"})
                continue
            r = case(m, T, tree, bs, check_reference=(bs == 1 and not CONV_ONLY), variants=args.variants)
            rows.append(r)
            print(json.dumps(r), flush=True)
            (args.out / "gdn_verify_split.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    print("| T | tree | batch | conv ms | DDTree conv ms (best launch) | recurrent ms | state-write floor ms "
          "| x 48 layers ms | x 48, DDTree conv |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def cell(r, key, fmt):
        return format(r[key], fmt) if key in r else ""

    for r in rows:
        if "skipped" in r:
            continue
        best = min(r.get("ddtree_conv_blocks", {}).items(), key=lambda kv: kv[1], default=None)
        dd = f"{r['ddtree_conv_ms']:.4f} ({best[0]} {best[1]:.4f})" if best else ""
        print(f"| {r['T']} | {r['tree']} | {r['bs']} | {r['conv_ms']:.4f} | {dd} | {cell(r, 'recurrent_ms', '.4f')} | "
              f"{cell(r, 'state_write_floor_ms', '.4f')} | {cell(r, 'step_ms_48_layers', '.2f')} | "
              f"{cell(r, 'step_ms_48_layers_ddtree_conv', '.2f')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
