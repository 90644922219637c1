"""Benchmark of the fused per-depth top-k kernel (patch 0003), all five timings in one run.

Shape: hidden 5120, vocabulary 248320 (bf16 lm_head, 2.54 GB), 15 draft depths, K 8 and 16,
batch 1, 8 and 64 (N = batch x 15 rows). For each: (a) the per-depth loop it replaces
(15 x matmul + log_softmax + topk), (b) batched torch (one matmul + log_softmax + topk),
(c) the fused kernel (eager, and replayed from a CUDA graph), (d) the floor: lm_head bytes at
the device-to-device copy bandwidth measured in this run, (e) the matmul alone.
Medians of triton.testing.do_bench (L2 flushed between calls).

    python tests/gpu/bench_fused_topk.py OUT_DIR [--configs]   # --configs also times variants
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_fused_topk import load_kernel_module  # noqa: E402

H, V, D = 5120, 248320, 15
BATCHES = (1, 8, 64)
KS = (8, 16)

# Launch-geometry variants timed with --configs (the shipped default is always timed too).
VARIANTS = {
    1: [dict(BN=16, BV=64, BK=128, num_warps=4, num_stages=4, waves=2),
        dict(BN=16, BV=128, BK=128, num_warps=4, num_stages=4, waves=1)],
    8: [dict(BN=128, BV=128, BK=64, num_warps=8, num_stages=3, waves=1)],
    64: [dict(BN=128, BV=128, BK=64, num_warps=8, num_stages=3, waves=1)],
}


def med(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def main(out_dir: str, try_configs: bool):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mod = load_kernel_module()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    w = (torch.randn(V, H, device=dev) * (3.0 / H**0.5)).to(torch.bfloat16)
    wbytes = w.numel() * w.element_size()

    # (d) copy bandwidth on a buffer of the head's size: read + write counted.
    dst = torch.empty_like(w)
    t_copy = med(lambda: dst.copy_(w))
    copy_bw = 2 * wbytes / (t_copy * 1e-3)
    floor_ms = wbytes / copy_bw * 1e3


    rows = []
    variants = []
    for batch in BATCHES:
        n = batch * D
        hid = torch.randn(n, H, device=dev).to(torch.bfloat16)
        hid_d = hid.view(batch, D, H)
        t_mm = med(lambda: torch.matmul(hid, w.T))
        for k in KS:
            def loop():
                for d in range(D):
                    lg = torch.matmul(hid_d[:, d], w.T)
                    torch.topk(torch.log_softmax(lg.float(), dim=-1), k, dim=-1)

            def batched():
                lg = torch.matmul(hid, w.T)
                return torch.topk(torch.log_softmax(lg.float(), dim=-1), k, dim=-1)

            def fused():
                return mod.fused_depth_topk(hid, w, k)

            t_loop = med(loop, rep=100)
            t_bat = med(batched)
            t_fused = med(fused)
            # CUDA graph replay of the fused call (how the draft graph would run it).
            fused()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fused()
            t_graph = med(g.replay)
            ker = mod.LAST_LAUNCH.get("split")  # the default config's compiled kernel
            cfg = mod.default_config(n, V, H, dev)
            s = mod._num_splits(n, V, cfg)
            row = dict(batch=batch, n=n, k=k, loop_ms=t_loop, batched_ms=t_bat, fused_ms=t_fused,
                       fused_graph_ms=t_graph, floor_ms=floor_ms, matmul_ms=t_mm,
                       fused_over_floor=t_fused / floor_ms, fused_over_matmul=t_fused / t_mm,
                       loop_over_fused=t_loop / t_fused, batched_over_fused=t_bat / t_fused,
                       config={**{kk: vv for kk, vv in cfg.items()}, "S": s})
            # Time of the same kernel without the running top-K (LSE only): the top-K's cost.
            row["fused_lse_only_ms"] = med(lambda: mod.fused_depth_topk(hid, w, k,
                                                                        config={"do_topk": False}))
            rows.append(row)
            print(json.dumps(row), flush=True)
            if ker is not None:
                try:
                    ptx = ker.asm.get("ptx", "")
                    row["kernel"] = dict(regs=ker.n_regs, spills=ker.n_spills,
                                         shared=ker.metadata.shared, wgmma="wgmma.mma_async" in ptx,
                                         mma_sync="mma.sync" in ptx, cp_async="cp.async" in ptx)
                except Exception as exc:
                    row["kernel"] = repr(exc)[:200]
                print("kernel", batch, k, row["kernel"], flush=True)
            if try_configs and (k == KS[0] or batch == 1):
                for c in VARIANTS[batch]:
                    kinfo = None
                    try:
                        t = med(lambda: mod.fused_depth_topk(hid, w, k, config=c))
                        kv = mod.LAST_LAUNCH.get("split")
                        kinfo = dict(regs=kv.n_regs, spills=kv.n_spills, shared=kv.metadata.shared)
                    except Exception as exc:  # a variant may not fit (shared memory)
                        t = None
                        print("variant failed", c, repr(exc)[:200], flush=True)
                    variants.append(dict(batch=batch, k=k, config=c, ms=t, kernel=kinfo))
                    print("variant", batch, k, c, t, kinfo, flush=True)

    info = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        command="python tests/gpu/bench_fused_topk.py $OUT" + (" --configs" if try_configs else ""),
        lm_head_bytes=wbytes, copy_ms=t_copy, copy_GBps=copy_bw / 1e9, floor_ms=floor_ms,
        rows=rows, variants=variants,
    )
    (out / "bench_fused_topk.json").write_text(json.dumps(info, indent=1))

    print(f"\ncopy {copy_bw / 1e9:.0f} GB/s, floor {floor_ms:.3f} ms ({info['device']})")
    print("batch  k | loop    batched  fused   graph   floor   matmul  | fused/floor fused/matmul lse-only")
    for r in rows:
        print(f"{r['batch']:5d} {r['k']:2d} | {r['loop_ms']:7.3f} {r['batched_ms']:7.3f} "
              f"{r['fused_ms']:7.3f} {r['fused_graph_ms']:7.3f} {r['floor_ms']:7.3f} "
              f"{r['matmul_ms']:7.3f} | {r['fused_over_floor']:6.2f}x {r['fused_over_matmul']:6.2f}x"
              f" {r['fused_lse_only_ms']:7.3f}")
    if variants:
        for b in BATCHES:
            for k in KS:
                vs = [x for x in variants if x["batch"] == b and x["k"] == k and x["ms"]]
                if vs:
                    best = min(vs, key=lambda x: x["ms"])
                    print(f"best variant b{b} k{k}: {best['ms']:.3f} ms {best['config']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/bench", "--configs" in sys.argv)
