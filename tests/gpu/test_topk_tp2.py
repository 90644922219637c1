"""The per-depth top-k of DDTree under tensor parallelism 2, on two real ranks (issue 25).

Two processes (torch.multiprocessing), one rank each, joined by torch.distributed (NCCL on two GPUs, or gloo on
the CPU). On fresh random inputs each case builds a lm_head, shards it by vocabulary the way SGLang 0.5.23's
``VocabParallelEmbedding`` does (``_get_indices``: the vocabulary padded to 64, or to 64 x tp where that does
not divide; rank r holds rows [r * V_padded / tp, (r + 1) * V_padded / tp), the real ones first, padding after),
gives each rank a ``shard_indices`` with ``org_vocab_start_index`` / ``num_org_elements`` (what the series'
``ddtree_topk._vocab_slice`` reads) and a small tp_group (``TpGroup``: ``world_size`` and
``all_gather(tensor, dim)`` over torch.distributed, the two members of SGLang's GroupCoordinator that
``ddtree_topk`` and ``fused_depth_topk`` use), and calls the series' ``depth_topk_logprobs`` with
``fused=True`` (CUDA only; the fused kernel's merge) and ``fused=False`` (the batched torch path's merge).
Rank 0 then checks, against the same call on the whole head with no tp_group (TP 1):

- log-probabilities within ``TP_TOL`` = 1e-4 nats, and the same ids except ties (a different id at a rank must
  carry, in the TP-1 answer, a log-prob within 1e-4 of the TP-1 one there: reordered equal values, or an
  equal value at the k-th place);
- against float64 (fused_topk_ref.reference): the single-GPU tests' rule for the path (``f64_tol``): the
  fused kernel 1e-3 (fused_topk_ref.LP_TOL), the torch path on a bf16/fp16 head 0.1 (its logits are rounded to
  the head's dtype, tests/gpu/test_fused_topk.py test_ddtree_dispatch), on a float32 head 1e-4; the measured
  error is recorded either way;
- that the fused kernel ran exactly when asked (``fused=True`` on CUDA) and that padding rows (poisoned so they
  would win) never appear.

Then it times the top-k step, TP 2 (both ranks, the collective included) against TP 1 (rank 0 alone), as CUDA
graph replays where capture works and eagerly always (CUDA events; wall clock on the CPU); each timing says
which. Results: ``OUT/topk_tp2.json``; exit status 1 when a check failed.

    python3 tests/gpu/test_topk_tp2.py --out DIR                              # two GPUs, NCCL
    python3 tests/gpu/test_topk_tp2.py --out DIR --backend gloo --device cpu  # CPU, small shapes
    ... --backend gloo --device cpu --interpret    # and the fused kernel's TP merge under Triton's interpreter

``--fault`` (test equipment for tests/unit/series/test_topk_tp2_cpu.py) gives the ranks a deliberately wrong shim, so
the unit test can show the checks catch a broken merge: ``offset`` (every rank says its shard starts at id 0),
``padding`` (the shard's padding rows counted as vocabulary), ``local`` (all_gather returns this rank's own
tensor world_size times). NVLink multicast stays off (NCCL_NVLS_ENABLE=0, set here for both ranks).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

try:
    import torch
except ImportError:  # collected by pytest where there is no torch: nothing to run (this is a script)
    if __name__ == "__main__":
        raise
    import pytest

    pytest.skip("needs torch (a script: python3 tests/gpu/test_topk_tp2.py --out DIR)", allow_module_level=True)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from fused_topk_ref import LP_TOL, reference  # noqa: E402
from sglang_loader import ROOTS, load_module  # noqa: E402

TP = 2
TP_TOL = 1e-4  # TP 2 against TP 1: log-probs (nats), and the tie window for a different id (issue 25)
PAD_TO = 64  # SGLang's DEFAULT_VOCAB_PADDING_SIZE
DEPTHS = 15  # draft depths per request (block size 16)
FAULTS = ("offset", "padding", "local")
# Multicast off for NCCL, PyTorch and NVSHMEM (the device notes: it can take the host's GPUs out of service).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# (name, vocab V, hidden H, rows N, k, timed). GPU: the Qwen3.6-27B head (248320 x 5120) at batch 1, 8, 64
# (15 depths each: the Triton kernel, cuBLAS + pass, the TMA/ping-pong kernel), and a vocabulary that is not
# a multiple of 64 (rank 1 holds 14 padding rows). CPU: small, with padding on rank 1.
GPU_CASES = [
    *[(f"qwen b{b} k{k}", 248320, 5120, DEPTHS * b, k, k == 16) for b in (1, 8, 64) for k in (8, 16)],
    ("padded V151666 b8 k16", 151666, 2048, DEPTHS * 8, 16, False),
]
CPU_CASES = [
    ("small V1001 k8", 1001, 64, DEPTHS * 2, 8, True),
    ("small V3000 k16", 3000, 96, DEPTHS, 16, False),
]
# --edge: the e2e harness's tiny models (vocabulary 16) at TP 2. SGLang pads 16 to 64, so rank 0 holds ids 0-15
# and rank 1 32 padding rows and no real one: ddtree_topk's local k (min(k, rows)) is 0 there, 8 on rank 0, and
# the ranks' all_gathers disagree in size. Seen on the CPU (gloo, 2026-12-01): rank 1 times out in the gather.
EDGE_CASES = [("tiny V16 k8 (rank 1 holds no vocabulary)", 16, 64, DEPTHS * 2, 8, False)]


def shard_indices(vocab: int, rank: int, tp: int) -> SimpleNamespace:
    """SGLang's VocabParallelEmbedding layout of the original vocabulary (no added tokens)."""
    pad = PAD_TO * tp if ((vocab + PAD_TO - 1) // PAD_TO * PAD_TO) % tp else PAD_TO
    padded = (vocab + pad - 1) // pad * pad
    per = padded // tp
    start, end = min(rank * per, vocab), min((rank + 1) * per, vocab)
    return SimpleNamespace(org_vocab_start_index=start, org_vocab_end_index=end, num_org_elements=end - start,
                           num_elements_padded=per, num_org_elements_padded=per,
                           padded_org_vocab_start_index=rank * per)


class TpGroup:
    """The part of SGLang's GroupCoordinator that the top-k uses: world_size, and all_gather(x, dim) =
    every rank's x concatenated along dim in rank order."""

    def __init__(self, fault: str | None = None):
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.fault = fault

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        x = x.contiguous()
        if self.fault == "local":  # deliberately wrong: no exchange
            return torch.cat([x] * self.world_size, dim=dim)
        out = torch.empty((self.world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        with warnings.catch_warnings():  # torch 2.13 renames it all_gather_single; 2.11 has only this
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(out, x)
        return torch.cat(out.view(self.world_size, *x.shape).unbind(0), dim=dim)


def make_head(weight: torch.Tensor, vocab: int, rank: int, tp: int, poison: torch.Tensor, fault: str | None):
    """This rank's lm_head: rows of its shard, its padding rows set to ``poison`` (a row that would win)."""
    si = shard_indices(vocab, rank, tp)
    part = poison.expand(si.num_elements_padded, -1).clone()
    part[: si.num_org_elements] = weight[si.org_vocab_start_index : si.org_vocab_end_index]
    if fault == "offset":
        si = SimpleNamespace(**{**vars(si), "org_vocab_start_index": 0})
    if fault == "padding":
        si = SimpleNamespace(**{**vars(si), "num_org_elements": si.num_elements_padded})
    head = SimpleNamespace(weight=torch.nn.Parameter(part, requires_grad=False), shard_indices=si,
                           org_vocab_size=vocab, tp_size=tp)
    return head, si


def f64_tol(fused: bool, dtype: torch.dtype) -> float:
    """The single-GPU rule for the path against float64 (see the module docstring)."""
    if fused:
        return LP_TOL
    return 1e-4 if dtype == torch.float32 else 0.1


def check_f64(lp, ids, hidden, w64, k, vocab, tol):
    """lp/ids against float64: log-prob error <= tol; a different id must tie (float64 gap <= tol)."""
    ref_vals, ref_ids, ref_lp = reference(hidden, w64, k)
    assert lp.shape == (hidden.shape[0], k) and ids.shape == lp.shape, (tuple(lp.shape), tuple(ids.shape))
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64, (lp.dtype, ids.dtype)
    assert torch.isfinite(lp).all(), "non-finite log-probs"
    assert ((ids >= 0) & (ids < vocab)).all(), f"id out of range [0, {vocab}): {ids.min().item()}..{ids.max().item()}"
    srt = ids.sort(dim=-1).values
    assert (srt[:, 1:] != srt[:, :-1]).all(), "duplicate id in a row"
    err = (lp.double() - ref_vals).abs().max().item()
    # Log-probs against float64 within the path's rule (f64_tol: 1e-3 fused, 0.1 torch on bf16, 1e-4 on fp32).
    assert err <= tol, f"float64: log-prob error {err:.3g} > {tol}"
    diff = ids != ref_ids
    gap = (ref_lp.gather(1, ids) - ref_vals).abs()[diff]
    worst = gap.max().item() if gap.numel() else 0.0
    assert worst <= tol, f"float64: id mismatch that is not a tie: gap {worst:.3g} > {tol}"
    return {"f64_max_abs_lp_err": err, "f64_tol": tol, "f64_within_1e-4": err <= 1e-4,
            "f64_id_mismatches_tied": int(diff.sum())}


def check_tp1(lp, ids, lp1, ids1):
    """TP 2 (lp, ids) against TP 1 (lp1, ids1): log-probs within TP_TOL; every id of TP 2 carries in TP 1 the
    same log-prob within TP_TOL (an id TP 1 does not list must tie TP 1's k-th value)."""
    err = (lp - lp1).abs().max().item()
    # Log-probs, rank by rank, TP 2 against TP 1: within TP_TOL = 1e-4 nats (issue 25).
    assert err <= TP_TOL, f"TP 1: log-prob difference {err:.3g} > {TP_TOL}"
    match = ids[:, :, None] == ids1[:, None, :]
    in_tp1 = match.any(-1)
    lp_in_tp1 = torch.where(match, lp1[:, None, :], torch.zeros_like(lp1[:, None, :])).sum(-1)
    gap = torch.where(in_tp1, (lp - lp_in_tp1).abs(), (lp - lp1[:, -1:]).abs())
    worst = gap.max().item()
    # Same ids except ties: a different id's TP-1 log-prob (or TP 1's k-th) within TP_TOL = 1e-4 nats.
    assert worst <= TP_TOL, f"TP 1: id mismatch that is not a tie: gap {worst:.3g} > {TP_TOL}"
    return {"tp1_max_abs_lp_diff": err, "tp1_id_mismatches": int((ids != ids1).sum()),
            "tp1_ids_not_in_tp1": int((~in_tp1).sum()), "tp1_worst_tie_gap": worst}


# --- timing -------------------------------------------------------------------------------------------------

def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time_eager(fn, dev, reps):
    for _ in range(3):
        fn()
    _sync(dev)
    if dev.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e6 / reps


def _capture(fn, dev):
    """A CUDA graph of fn (warmed up on a side stream first), or the reason it could not be captured."""
    try:
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(dev).wait_stream(s)
        torch.cuda.synchronize(dev)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize(dev)
        return g, None
    except Exception as exc:  # recorded; the eager time stands
        return None, f"{type(exc).__name__}: {exc}"[:300]


def time_step(fn, dev, reps, collective: bool):
    """{"eager_us": ..., "graph_us": ... or None, "graph_error": ...}. collective: every rank runs fn together
    (TP 2); the graph is replayed only when every rank captured it."""
    out = {"eager_us": _time_eager(fn, dev, reps), "eager_timer": "cuda events" if dev.type == "cuda" else
           "wall clock (CPU)"}
    if dev.type != "cuda":
        out.update(graph_us=None, graph_error="no CUDA graphs on the CPU")
        return out
    g, err = _capture(fn, dev)
    if collective:
        ok = torch.tensor([0 if g is None else 1], device=dev)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item() == 0 and g is not None:
            g, err = None, "another rank could not capture"
    out["graph_error"] = err
    out["graph_us"] = _time_eager(g.replay, dev, reps) if g is not None else None
    return out


# --- the ranks ----------------------------------------------------------------------------------------------

def _bcast(t: torch.Tensor) -> torch.Tensor:
    dist.broadcast(t, src=0)
    return t


# The interpreter's tiles (tests/unit/series/test_fused_topk_cpu.py's TRITON): small, so that a shard has several.
INTERPRET_CONFIG = {"path": "triton", "BN": 16, "BV": 128, "BK": 32, "num_warps": 4, "num_stages": 1}


def interpreted_fused(rank, group, w, hidden, head, si, vocab, k) -> dict:
    """--interpret (CPU): the fused kernel's own TP merge (fused_depth_topk with this rank's shard and the
    tp_group: one packed all_gather along dim 0) under Triton's interpreter, in fp16 (the interpreter has no
    bf16). depth_topk_logprobs takes the fused path only for CUDA tensors, so the kernel module is called
    directly with the arguments depth_topk_logprobs passes it."""
    kmod = load_module(ROOTS, "sglang.kernels.ops.speculative.ddtree.fused_depth_topk")
    w16, h16 = w.to(torch.float16), hidden.to(torch.float16)
    start, rows = int(si.org_vocab_start_index), int(si.num_org_elements)
    lp, ids = kmod.fused_depth_topk(h16, head.weight.to(torch.float16), k, vocab_size=rows, vocab_start=start,
                                    tp_group=group, config=INTERPRET_CONFIG)
    if rank != 0:
        return {}
    lp1, ids1 = kmod.fused_depth_topk(h16, w16, k, config=INTERPRET_CONFIG)
    rec, errors = {"dtype": "torch.float16", "fused_kernel": True}, []
    for key, fn in (("tp1", lambda: check_tp1(lp, ids, lp1, ids1)),
                    ("f64", lambda: check_f64(lp, ids, h16, w16.double(), k, vocab, LP_TOL)),
                    ("tp1_f64", lambda: check_f64(lp1, ids1, h16, w16.double(), k, vocab, LP_TOL))):
        try:
            rec[key] = fn()
        except AssertionError as exc:
            errors.append(f"{key}: {exc}")
    return {**rec, "ok": not errors, "error": "; ".join(errors) or None}


def run_rank(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(NO_MULTICAST)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernel module imports it)
    dev = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP,
                            timeout=datetime.timedelta(seconds=args.timeout))
    dd = load_module(ROOTS, "sglang.srt.speculative.ddtree_topk")
    fused_calls = []
    if dev.type == "cuda":  # count the fused kernel's calls (the dispatch must take it for fused=True)
        kmod = load_module(ROOTS, "sglang.kernels.ops.speculative.ddtree.fused_depth_topk")
        orig = kmod.fused_depth_topk
        kmod.fused_depth_topk = lambda *a, **kw: (fused_calls.append(1), orig(*a, **kw))[1]
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    group = TpGroup(args.fault)
    cases = (CPU_CASES if dev.type == "cpu" else GPU_CASES) + (EDGE_CASES if args.edge else [])
    if args.cases:
        cases = [c for c in cases if c[0] in args.cases]
    results, timings = [], []
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    for name, vocab, h, n, k, timed in cases:
        # Fresh inputs on rank 0, the same on every rank (TP replicates the draft hidden states).
        w = (torch.randn(vocab, h, device=dev, generator=gen) * (3.0 / h**0.5)).to(dtype)
        hidden = torch.randn(n, h, device=dev, generator=gen).to(dtype)
        w, hidden = _bcast(w), _bcast(hidden)
        poison = (hidden[0].float() * (8.0 / h**0.5)).to(dtype)  # a padding row that would top row 0
        head, si = make_head(w, vocab, rank, TP, poison, args.fault)
        full = SimpleNamespace(weight=torch.nn.Parameter(w, requires_grad=False), org_vocab_size=vocab)
        w64 = w.double() if rank == 0 else None
        for fused in (True, False):
            label = f"{name} {'fused' if fused else 'torch'}"
            if fused and dev.type != "cuda":
                if args.interpret:
                    rec = interpreted_fused(rank, group, w, hidden, head, si, vocab, k)
                    results.append({"case": f"{label} (Triton interpreter)", **rec}) if rank == 0 else None
                elif rank == 0:
                    results.append({"case": label, "skipped": "the fused kernel runs on CUDA only"})
                dist.barrier()
                continue
            rec = {"case": label, "vocab": vocab, "hidden": h, "rows": n, "k": k, "dtype": str(dtype),
                   "shard_rank0": [0, shard_indices(vocab, 0, TP).num_org_elements],
                   "shard_rank1": [shard_indices(vocab, 1, TP).org_vocab_start_index,
                                   shard_indices(vocab, 1, TP).num_org_elements]}
            fused_calls.clear()
            lp, ids = dd.depth_topk_logprobs(hidden, head, k, tp_group=group, fused=fused)
            used_tp2 = bool(fused_calls)
            if rank == 0:
                fused_calls.clear()
                lp1, ids1 = dd.depth_topk_logprobs(hidden, full, k, fused=fused)
                used_tp1 = bool(fused_calls)
                rec["fused_kernel"] = used_tp2
                tol, errors = f64_tol(fused, dtype), []

                def kernel_used(want=fused and dev.type == "cuda"):
                    assert used_tp2 == want and used_tp1 == want, \
                        f"fused kernel used: TP 2 {used_tp2}, TP 1 {used_tp1}; expected {want}"
                    return {}

                for key, fn in (("dispatch", kernel_used), ("tp1", lambda: check_tp1(lp, ids, lp1, ids1)),
                                ("f64", lambda: check_f64(lp, ids, hidden, w64, k, vocab, tol)),
                                ("tp1_f64", lambda: check_f64(lp1, ids1, hidden, w64, k, vocab, tol))):
                    try:
                        rec[key] = fn()
                    except AssertionError as exc:  # every check reported, then the case fails
                        errors.append(f"{key}: {exc}")
                rec.update(ok=not errors, error="; ".join(errors) or None)
                results.append(rec)
            dist.barrier()
            if timed and not args.no_timing:
                t2 = time_step(lambda: dd.depth_topk_logprobs(hidden, head, k, tp_group=group, fused=fused),
                               dev, args.reps, collective=True)
                dist.barrier()
                t1 = None
                if rank == 0:
                    t1 = time_step(lambda: dd.depth_topk_logprobs(hidden, full, k, fused=fused), dev, args.reps,
                                   collective=False)
                    timings.append({"case": label, "rows": n, "k": k, "reps": args.reps, "tp2": t2, "tp1": t1})
                dist.barrier()
        w = hidden = head = full = w64 = None  # free before the next case's inputs
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 0:
        info = {"what": "DDTree per-depth top-k, TP 2 against TP 1 and float64 (tests/gpu/test_topk_tp2.py)",
                "backend": args.backend, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "torch": torch.__version__, "world_size": TP, "fault": args.fault, "seed": args.seed,
                "tp_tol": TP_TOL, "fused_f64_tol": LP_TOL, "env": {k: os.environ.get(k) for k in NO_MULTICAST},
                "results": results, "timings": timings,
                "passed": sum(1 for r in results if r.get("ok")),
                "failed": sum(1 for r in results if r.get("ok") is False)}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "topk_tp2.json").write_text(json.dumps(info, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def _worker(rank: int, args: argparse.Namespace, port: int) -> None:
    try:
        run_rank(rank, args, port)
    except Exception:
        traceback.print_exc()
        raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary(info: dict) -> str:
    lines = [f"{info['passed']} passed, {info['failed']} failed ({info['backend']}, {info['device']})"]
    for r in info["results"]:
        if "skipped" in r:
            lines.append(f"SKIP {r['case']}: {r['skipped']}")
        elif r["ok"]:
            t, f = r["tp1"], r["f64"]
            lines.append(f"PASS {r['case']}: TP1 diff {t['tp1_max_abs_lp_diff']:.2e}, ids differ "
                         f"{t['tp1_id_mismatches']}, f64 err {f['f64_max_abs_lp_err']:.2e} (tol {f['f64_tol']:g})")
        else:
            lines.append(f"FAIL {r['case']}: {r['error']}")
    for t in info["timings"]:
        for tp in ("tp1", "tp2"):
            x = t[tp]
            graph = f"graph {x['graph_us']:.1f} us" if x["graph_us"] is not None else f"graph: {x['graph_error']}"
            lines.append(f"TIME {t['case']} {tp}: eager {x['eager_us']:.1f} us ({x['eager_timer']}), {graph}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for topk_tp2.json")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--fault", choices=FAULTS, help="test equipment: a deliberately wrong shim")
    ap.add_argument("--cases", nargs="*", help="only these case names")
    ap.add_argument("--reps", type=int, default=50, help="timed calls per timing")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--interpret", action="store_true",
                    help="CPU: also the fused kernel's TP merge under Triton's interpreter (slow; small shapes)")
    ap.add_argument("--edge", action="store_true", help="add the vocabulary-16 case (rank 1 empty; see EDGE_CASES)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=300, help="seconds a collective may wait")
    args = ap.parse_args(argv)
    if args.device == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < TP):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        print(f"test_topk_tp2: --device cuda needs {TP} CUDA GPUs, this machine has {n} "
              "(for a CPU run: --backend gloo --device cpu)", file=sys.stderr)
        return 2
    if args.interpret and args.device != "cpu":
        print("test_topk_tp2: --interpret is for --device cpu (on GPUs the fused kernel runs itself)", file=sys.stderr)
        return 2
    if args.device == "cpu" and args.backend != "gloo":
        print("test_topk_tp2: --device cpu needs --backend gloo", file=sys.stderr)
        return 2
    os.environ.update(NO_MULTICAST)
    out = args.out / "topk_tp2.json"
    out.unlink(missing_ok=True)
    try:
        mp.spawn(_worker, args=(args, _free_port()), nprocs=TP, join=True)
    except mp.ProcessRaisedException as exc:  # the rank's traceback is above (stderr)
        last = str(exc).strip().splitlines()[-1]
        print(f"test_topk_tp2: rank {exc.error_index} failed: {last}", file=sys.stderr)
        return 1
    info = json.loads(out.read_text())
    print(summary(info))
    return 0 if info["failed"] == 0 and info["passed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
