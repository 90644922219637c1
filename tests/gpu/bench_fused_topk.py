"""Benchmark of the fused per-depth top-k kernel (patch 0003), all five timings in one run.

Shape: hidden 5120, vocabulary 248320 (bf16 lm_head, 2.54 GB), 15 draft depths, K 8 and 16,
batch 1, 8, 16 and 64 (N = batch x 15 rows). For each: (a) the per-depth loop it replaces
(15 x matmul + log_softmax + topk), (b) batched torch (one matmul + log_softmax + topk),
(c) fused_depth_topk with its default dispatch (logits from the Triton kernel for small N, from
cuBLAS + the Triton pass from CUBLAS_MIN_ROWS rows, from the persistent TMA kernel with the pass
as its epilogue from TMA_MIN_ROWS rows (warp-specialised ping-pong on Hopper), then the per-row
selection; eager, and replayed from a CUDA graph), (d) the floor: lm_head bytes at the
device-to-device copy bandwidth measured in this run, (e) the matmul alone: plain bf16 `hidden @ W.T` (cuBLAS, bf16 out), the reference of the
batch-64 target. For information, the cuBLAS matmul with fp32 output (the first half of the
large-N path). Medians of triton.testing.do_bench (L2 flushed between calls). The ratios the
targets are judged on are paired: 61 back-to-back pairs of single calls (the fused call and
the matmul; separately, the fused call and the head copy that gives the floor), L2 flushed
before each call, order alternating; the ratio reported is the median of the 61 per-pair
ratios, with its interquartile range (the H200's matmul time drifts by several percent between
seconds; medians taken apart, or alternating 200 ms blocks, inherit that drift). The CUDA-graph
replay is paired with the matmul the same way.
--configs also times variants (the other paths; other geometries) and probes the dispatch
thresholds: Triton against cuBLAS at N = 30, 60, 90, 120; cuBLAS against the ping-pong TMA kernel
at N = 240, 480, 720, 960.

    python tests/gpu/bench_fused_topk.py OUT_DIR [--configs]   # --configs also times variants
"""

from __future__ import annotations

import datetime
import json
import pathlib
import statistics
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_fused_topk import load_kernel_module  # noqa: E402

H, V, D = 5120, 248320, 15
BATCHES = (1, 8, 16, 64)
KS = (8, 16)

# Variants timed with --configs (the shipped default is always timed too): the other paths,
# other geometries of the cuBLAS path's pass (the default: 1024-column tiles on 2 warps, rows
# split into slices until about 4 programs per SM; PS forces the slices per row), at batch 64
# the Triton TMA kernel (Blackwell's path), the ping-pong kernel (Hopper's default) without the
# selection's group level (SUP 1) and in L2-sized chunks (8192 columns: 31 MB of fp32 logits at
# N = 960), and the selection's optional compaction of candidates (CAP 64).
VARIANTS = {
    1: [dict(num_stages=3), dict(num_stages=6)],
    8: [dict(path="triton"), dict(path="cublas", BV=2048, num_warps=4), dict(path="cublas", PS=1), dict(CAP=64)],
    16: [dict(path="triton"), dict(path="tma"), dict(path="pingpong")],
    64: [dict(path="cublas"), dict(path="tma"), dict(path="tma", CAP=64), dict(path="pingpong", SUP=1),
         dict(path="pingpong", VC=8192), dict(CAP=64)],
}


def med(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def paired(fn_a, fn_b, pairs=61):
    """`pairs` back-to-back timings of one call of fn_a and one of fn_b (CUDA events, L2 flushed
    before each call as do_bench does; the order alternates from pair to pair): (median of a,
    median of b, median of the per-pair ratios a/b, (first, third) quartile of those ratios).
    Adjacent single calls see the same clocks: the H200's matmul time drifts by several percent
    between seconds, which moves both alike."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(5):
        fn_a(), fn_b()
    events = []
    for i in range(pairs):
        times = {}
        for name, fn in ((("a", fn_a), ("b", fn_b)) if i % 2 == 0 else (("b", fn_b), ("a", fn_a))):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times[name] = (start, end)
        events.append(times)
    torch.cuda.synchronize()
    a = [t["a"][0].elapsed_time(t["a"][1]) for t in events]
    b = [t["b"][0].elapsed_time(t["b"][1]) for t in events]
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    q = statistics.quantiles(ratios, n=4)
    return statistics.median(a), statistics.median(b), statistics.median(ratios), (q[0], q[2])


def main(out_dir: str, try_configs: bool):  # noqa: C901 - one flat benchmark script, step by step
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
        def matmul():
            return torch.matmul(hid, w.T)

        t_mm32 = None
        if mod._has_mm_out_dtype():
            l32 = torch.empty((n, V), dtype=torch.float32, device=dev)
            t_mm32 = med(lambda: torch.mm(hid, w.T, out_dtype=torch.float32, out=l32))
            del l32
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
            t_fused, t_mm, r_mm, iqr_mm = paired(fused, matmul)
            # The floor is half a copy of the head (read + write): paired with the fused call too.
            _, t_cp, r_cp, iqr_cp = paired(fused, lambda: dst.copy_(w))
            r_floor = r_cp * 2
            # CUDA graph replay of the fused call (how the draft graph would run it).
            fused()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fused()
            # paired too: an unpaired do_bench median of the replay read up to 12% above the
            # eager call on one machine (drift), where paired the two are equal (run22)
            t_graph, _, r_graph, _ = paired(g.replay, matmul)
            cfg = mod.default_config(n, V, H, dev)
            path = cfg.get("path", "triton")
            ker = mod.LAST_LAUNCH.get("split" if path == "triton" else "chunk")  # default's logits kernel
            sel = mod.LAST_LAUNCH.get("select")
            if path == "triton":
                cfg = {**cfg, "S": mod._num_splits(n, V, cfg)}
            row = dict(batch=batch, n=n, k=k, path=path, loop_ms=t_loop, batched_ms=t_bat, fused_ms=t_fused,
                       fused_graph_ms=t_graph, floor_ms=floor_ms, matmul_ms=t_mm, matmul_fp32_ms=t_mm32,
                       fused_over_floor=r_floor, fused_over_matmul=r_mm,
                       fused_over_floor_iqr=[2 * x for x in iqr_cp], fused_over_matmul_iqr=list(iqr_mm),
                       fused_over_floor_of_medians=t_fused / floor_ms, fused_over_matmul_of_medians=t_fused / t_mm,
                       graph_over_matmul=r_graph,
                       loop_over_fused=t_loop / t_fused, batched_over_fused=t_bat / t_fused,
                       config=cfg)
            # Time of the logits step alone (log-sum-exp only: no logits or maxima written, no
            # selection); the difference to fused_ms is what the top-K costs.
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
                    if sel is not None:
                        row["kernel"]["select"] = dict(regs=sel.n_regs, spills=sel.n_spills, shared=sel.metadata.shared)
                except Exception as exc:
                    row["kernel"] = repr(exc)[:200]
                print("kernel", batch, k, row["kernel"], flush=True)
            if try_configs:
                for c in VARIANTS[batch]:
                    kinfo = None
                    try:
                        t, _, r, _ = paired(lambda: mod.fused_depth_topk(hid, w, k, config=c), matmul, pairs=21)
                        kv = mod.LAST_LAUNCH.get("split" if c.get("path", path) == "triton" else "chunk")
                        kinfo = dict(regs=kv.n_regs, spills=kv.n_spills, shared=kv.metadata.shared)
                    except Exception as exc:  # a variant may not fit (shared memory)
                        t = r = None
                        print("variant failed", c, repr(exc)[:200], flush=True)
                    variants.append(dict(batch=batch, k=k, config=c, ms=t, over_matmul=r, kernel=kinfo))
                    print("variant", batch, k, c, t, r, kinfo, flush=True)

    probe = []
    if try_configs:
        # Dispatch thresholds, each pair of paths side by side around its threshold (the default
        # uses cuBLAS from CUBLAS_MIN_ROWS rows and the TMA kernel from TMA_MIN_ROWS).
        for n, pa, pb in [(n, "triton", "cublas") for n in (30, 60, 90, 120)] + \
                         [(n, "cublas", "pingpong") for n in (240, 480, 720, 960)]:
            hid = torch.randn(n, H, device=dev).to(torch.bfloat16)
            for k in KS:
                t_a, t_b, r, _ = paired(lambda: mod.fused_depth_topk(hid, w, k, config={"path": pa}),
                                        lambda: mod.fused_depth_topk(hid, w, k, config={"path": pb}))
                probe.append({"n": n, "k": k, f"{pa}_ms": t_a, f"{pb}_ms": t_b, f"{pa}_over_{pb}": r})
                print("probe", json.dumps(probe[-1]), flush=True)

    info = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        command="python tests/gpu/bench_fused_topk.py $OUT" + (" --configs" if try_configs else ""),
        lm_head_bytes=wbytes, copy_ms=t_copy, copy_GBps=copy_bw / 1e9, floor_ms=floor_ms,
        cublas_min_rows=getattr(mod, "CUBLAS_MIN_ROWS", None), tma_min_rows=getattr(mod, "TMA_MIN_ROWS", None), rows=rows, variants=variants, probe=probe,
    )
    (out / "bench_fused_topk.json").write_text(json.dumps(info, indent=1))

    print(f"\ncopy {copy_bw / 1e9:.0f} GB/s, floor {floor_ms:.3f} ms ({info['device']})")
    print("batch  k path   | loop    batched  fused   graph   floor   matmul  mm-fp32 | fused/floor fused/matmul"
          " graph/matmul lse-only")
    for r in rows:
        mm32 = f"{r['matmul_fp32_ms']:7.3f}" if r["matmul_fp32_ms"] else "      -"
        print(f"{r['batch']:5d} {r['k']:2d} {r['path']:6s} | {r['loop_ms']:7.3f} {r['batched_ms']:7.3f} "
              f"{r['fused_ms']:7.3f} {r['fused_graph_ms']:7.3f} {r['floor_ms']:7.3f} "
              f"{r['matmul_ms']:7.3f} {mm32} | {r['fused_over_floor']:6.3f}x {r['fused_over_matmul']:6.3f}x"
              f" {r['graph_over_matmul']:6.2f}x {r['fused_lse_only_ms']:7.3f}"
              f"  iqr floor {r['fused_over_floor_iqr'][0]:.3f}-{r['fused_over_floor_iqr'][1]:.3f}"
              f" matmul {r['fused_over_matmul_iqr'][0]:.3f}-{r['fused_over_matmul_iqr'][1]:.3f}")
    for x in probe:
        times = ", ".join(f"{key[:-3]} {t:.3f} ms" for key, t in x.items() if key.endswith("_ms"))
        print(f"probe N {x['n']:4d} k{x['k']:2d}: {times}")
    for x in variants:
        if x["ms"]:
            print(f"variant b{x['batch']} k{x['k']}: {x['ms']:.3f} ms ({x['over_matmul']:.2f}x matmul) {x['config']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/bench", "--configs" in sys.argv)
