"""GPU bench: forked (tree) against chain verification, per GDN layer, and forking memory.

One Qwen3.6-27B GDN layer at TP 1 (16 query/key heads, 48 value heads, head dim 128,
conv width 4, float32 states, bf16 activations): the target-verify sequence of
``gdn_backend.forward_extend`` (tree conv update + fused sigmoid-gating delta-rule verify
writing per-node intermediate states) for verify widths T = 16, 32, 64, 128 at batch 1
and 8, with and without the tree links. Buffers are allocated once; only the two kernel
launches are timed (``triton.testing.do_bench``, median). The first call of each shape
is timed separately: it includes Triton's compile of that shape.

The memory table is ``sgdeploy.budget`` (what the server allocates for all 48 layers);
one layer's buffers are also allocated here and their size checked against the rule.

    python3 tests/gpu/bench_state_forking.py --out $OUT   # on the lent H200
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import test_state_forking as tsf  # noqa: E402

from sgdeploy.budget import QWEN3_6_27B, forking_buffer_bytes  # noqa: E402

# One TP-1 layer of Qwen3.6-27B (overrides the test's TP-4 slice).
tsf.H, tsf.HV, tsf.K, tsf.V, tsf.W = 16, 48, 128, 128, 4


def bench_case(m, bs: int, T: int, tree: bool) -> dict:
    import triton

    p = tsf.make_problem(bs, T, seed=T + bs)
    buf = tsf.verify_buffers(p, tree)
    inter_ssm, inter_conv = buf["inter_ssm"], buf["inter_conv"]
    conv = tsf.conv_call(m, p, buf, tree)

    def verify():
        mixed = conv().transpose(1, 2).reshape(bs * T, p.dim)
        return tsf.recurrent_call(m, p, buf, mixed)()

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    verify()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    ms = triton.testing.do_bench(verify, warmup=25, rep=200, return_mode="median")
    layer_bytes = inter_ssm.numel() * 4 + inter_conv.numel() * 2
    return {
        "bs": bs,
        "T": T,
        "mode": "forked" if tree else "chain",
        "median_ms": ms,
        "first_call_s": first_s,
        "layer_buffer_bytes": layer_bytes,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--sizes", default="16,32,64,128")
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    m = tsf.load_sglang()
    rows = []
    for T in sizes:
        for bs in batches:
            for tree in (False, True):
                r = bench_case(m, bs, T, tree)
                # One layer's buffers, rows = bs + 1, against the rule with L = 1.
                one_layer = forking_buffer_bytes(replace(QWEN3_6_27B, recurrent_layers=1), T - 1, bs)
                assert r["layer_buffer_bytes"] == one_layer, (r, one_layer)
                rows.append(r)
                print(json.dumps(r), flush=True)
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "bench_rows.json").write_text(json.dumps(rows, indent=1))
    mem = []
    for budget in (15, 31, 63, 127):
        for running in (1, 4, 8):
            mem.append(
                {
                    "budget": budget,
                    "max_running_requests": running,
                    "gib_all_layers_tp1": forking_buffer_bytes(QWEN3_6_27B, budget, running) / 2**30,
                }
            )
    info = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "shape": "Qwen3.6-27B GDN layer, TP1: H=16 HV=48 K=V=128 W=4, fp32 state, bf16 act",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_state_forking.json").write_text(
        json.dumps({"info": info, "timing": rows, "memory": mem}, indent=1)
    )
    print("| T | bs | chain ms | forked ms | forked/chain | first call chain s | first call forked s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    by = {(r["T"], r["bs"], r["mode"]): r for r in rows}
    for T in sizes:
        for bs in batches:
            c, f = by[(T, bs, "chain")], by[(T, bs, "forked")]
            print(
                f"| {T} | {bs} | {c['median_ms']:.3f} | {f['median_ms']:.3f} |"
                f" {f['median_ms'] / c['median_ms']:.2f} | {c['first_call_s']:.1f} |"
                f" {f['first_call_s']:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
