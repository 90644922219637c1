"""Time the DDTree GPU tree builder (both kernels) at batch 1 and 64, budgets 15/32/64.

D = 15 depths (DFlash block size 16), K = min(8, budget). CUDA events around many
iterations, eager (two launches + output allocation) and replayed from a CUDA graph.
Target: under 50 us at batch 1, budget 64.

    python tests/gpu/bench_ddtree_tree.py      # the module from patches/sglang/src (sglang_loader.ROOTS)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_loader import ROOTS, load_module  # noqa: E402

ITERS = int(os.environ.get("DDTREE_BENCH_ITERS", "2000"))


def _time(fn, iters: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters  # microseconds


def main() -> dict:
    mod = load_module(ROOTS, "sglang.srt.speculative.ddtree_tree")
    rows = []
    depth = 15
    for bs in (1, 64):
        for budget in (15, 32, 64):
            k = min(8, budget)
            lp = torch.randn(bs, depth, k, device="cuda").mul(2).sub(3).clamp(max=0)
            lp = torch.sort(lp, dim=-1, descending=True).values.contiguous()
            ids = torch.randint(0, 150_000, (bs, depth, k), device="cuda")
            root = torch.randint(0, 150_000, (bs,), device="cuda")
            pos = torch.randint(0, 4000, (bs,), device="cuda")

            def run(lp=lp, ids=ids, budget=budget, root=root, pos=pos):
                return mod.build_ddtree(lp, ids, budget, root_tokens=root, root_positions=pos)

            eager = _time(run, ITERS)
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                run()
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(graph):
                run()
            replay = _time(graph.replay, ITERS)
            rows.append(
                {
                    "bs": bs,
                    "budget": budget,
                    "depth": depth,
                    "k": k,
                    "eager_us": round(eager, 2),
                    "graph_us": round(replay, 2),
                }
            )
            print(rows[-1], flush=True)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "iters": ITERS, "rows": rows}


if __name__ == "__main__":
    res = main()
    text = json.dumps(res, indent=1)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, "ddtree_bench.json").write_text(text)
