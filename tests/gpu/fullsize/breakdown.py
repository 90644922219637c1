"""The parts of a speculative decode step from a torch profiler trace (SGLang's ``/start_profile`` output,
chrome trace JSON, optionally gzipped), on the CPU. Pure Python.

    python tests/gpu/fullsize/breakdown.py TRACE.json.gz [...] [--json]

Steps: the ranges ``STEP_RANGES`` (the DDTree step from e2e_hook, the DFLASH decode step from full_hook).
Each GPU event (``kernel``, ``gpu_memcpy``, ``gpu_memset``) is tied to the host call that launched it by
``args.correlation`` (``cudaLaunchKernel``, ``cudaGraphLaunch``, ...: every kernel of a replayed CUDA graph
carries its graph launch's correlation); the launch's timestamp on its thread places the kernel in the
innermost full_hook range around it and in a step. Per step, device time (the sum of GPU event durations,
in microseconds) per part:

| part | kernels launched inside |
| --- | --- |
| ``draft`` | ``sgdeploy_full::draft`` (the DFlash drafter's block forward) |
| ``topk`` | ``sgdeploy_full::topk`` (per-depth top-k over the lm_head) |
| ``tree_mask`` | ``sgdeploy_full::tree`` or ``sgdeploy_full::mask`` (build_ddtree, the verify mask/metadata) |
| ``verify_attention`` | ``sgdeploy_full::target_forward``, name matching ``ATTENTION`` |
| ``verify_gdn`` | ``sgdeploy_full::target_forward``, name matching ``GDN`` (conv + recurrent tree kernels) |
| ``verify_rest`` | ``sgdeploy_full::target_forward``, every other kernel (GEMMs, norms, lm_head, metadata copies) |
| ``commit`` | ``sgdeploy_full::verify`` outside the target forward (sampling, tree walk, compaction), ``fork_commit``, ``draft_kv`` |
| ``other`` | inside the step, in none of the above (verify window, KV plans, next draft input) |

``ddtree_only`` = topk + tree_mask + fork_commit (the parts a DFLASH step does not have; the forking
metadata copied before the graph replay sits in ``verify_rest`` and is listed by name in ``top_kernels``).
``step_gpu_us``: first kernel start to last kernel end of the step's GPU events.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from trace_check import load_trace as load  # noqa: E402  (tests/gpu/e2e: a chrome trace, gzipped or not)

STEP_RANGES = ("sgdeploy_e2e::ddtree_decode_step", "sgdeploy_full::dflash_decode")
# The same DDTree step as the profiler's Python-stack event (SGLang's /start_profile records with_stack): the
# step when the e2e range is missing (the first full-size run, 2026-12-01: full_hook's import finder took
# ddtree_decode before e2e_hook's, so the e2e range was never installed).
STEP_FUNCTIONS = re.compile(r"speculative/ddtree_decode\.py\(\d+\): forward_decode$")
PREFIX = "sgdeploy_full::"
RANGE_PART = {"draft": "draft", "topk": "topk", "tree": "tree_mask", "mask": "tree_mask", "verify": "commit",
              "fork_commit": "commit", "draft_kv": "commit", "target_forward": "verify"}
GDN = ("delta_rule", "gated_delta", "causal_conv1d", "conv1d", "tree_conv", "gdn", "fused_recurrent",
       "sigmoid_gating", "chunk_scaled_dot", "l2norm")  # tree_conv: patch 0004's _ddtree_tree_conv_kernel
ATTENTION = ("_fwd_kernel", "fwd_grouped", "attention", "attn", "flash", "decode_att", "extend_att")
PARTS = ("draft", "topk", "tree_mask", "verify_attention", "verify_gdn", "verify_rest", "commit", "other")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def kernel_kind(name: str) -> str:
    low = name.lower()
    if any(k in low for k in GDN):
        return "verify_gdn"
    if any(k in low for k in ATTENTION):
        return "verify_attention"
    return "verify_rest"


def _innermost(ranges: list[tuple[float, float, str]], ts: float) -> str | None:
    best = None
    for a, b, name in ranges:
        if a <= ts <= b and (best is None or a >= best[0]):
            best = (a, b, name)
    return None if best is None else best[2]


def attribute(trace: dict) -> list[dict]:
    """One record per decode step: device microseconds per part, the step's GPU span, its kernels."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    steps: dict[tuple, list[tuple[float, float]]] = {}
    ranges: dict[tuple, list[tuple[float, float, str]]] = {}
    py_steps: dict[tuple, list[tuple[float, float]]] = {}
    for e in events:
        name, key = str(e.get("name", "")), (e.get("pid"), e.get("tid"))
        if e.get("cat") not in ("user_annotation", "cpu_op", "python_function"):
            continue
        a, b = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        if e.get("cat") == "python_function":
            if STEP_FUNCTIONS.search(name):
                py_steps.setdefault(key, []).append((a, b))
        elif name in STEP_RANGES:
            steps.setdefault(key, []).append((a, b))
        elif name.startswith(PREFIX):
            ranges.setdefault(key, []).append((a, b, name[len(PREFIX):]))
    if not steps:
        steps = py_steps
    launches = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in LAUNCH_CATS and corr is not None:
            launches[corr] = e
    order = [(k, a, b) for k, v in steps.items() for a, b in v]
    order.sort(key=lambda x: x[1])
    index = {(k, a): i for i, (k, a, _) in enumerate(order)}
    out = [{"parts": dict.fromkeys(PARTS, 0.0), "first": None, "last": None, "kernels": {}} for _ in order]
    for e in events:
        if e.get("cat") not in GPU_CATS:
            continue
        call = launches.get((e.get("args") or {}).get("correlation"))
        if call is None:
            continue
        key, ts = (call.get("pid"), call.get("tid")), float(call["ts"])
        step = next(((k, a) for k, a, b in order if k == key and a <= ts <= b), None)
        if step is None:
            continue
        rec = out[index[step]]
        inner = _innermost(ranges.get(key, []), ts)
        part = RANGE_PART.get(inner.removesuffix("_decode").removesuffix("_extend"), "other") if inner else "other"
        name = str(e.get("name", ""))
        if part == "verify":
            part = kernel_kind(name)
        dur = float(e.get("dur", 0))
        rec["parts"][part] += dur
        start, end = float(e["ts"]), float(e["ts"]) + dur
        rec["first"] = start if rec["first"] is None else min(rec["first"], start)
        rec["last"] = end if rec["last"] is None else max(rec["last"], end)
        rec["kernels"][(part, name)] = rec["kernels"].get((part, name), 0.0) + dur
        if inner == "fork_commit":
            rec["parts"].setdefault("fork_commit", 0.0)
            rec["parts"]["fork_commit"] += dur
    for rec in out:
        rec["step_gpu_us"] = (rec["last"] - rec["first"]) if rec["first"] is not None else 0.0
        rec["device_us"] = sum(v for k, v in rec["parts"].items() if k in PARTS)
    return [r for r in out if r["device_us"] > 0]


def summarise(trace: dict, top: int = 12) -> dict:
    recs = attribute(trace)
    if not recs:
        return {"steps": 0, "verdict": "no decode step with GPU work in the trace"}
    med = {p: round(statistics.median(r["parts"].get(p, 0.0) for r in recs), 2) for p in (*PARTS, "fork_commit")}
    device = statistics.median(r["device_us"] for r in recs)
    ddtree_only = statistics.median(
        r["parts"]["topk"] + r["parts"]["tree_mask"] + r["parts"].get("fork_commit", 0.0) for r in recs)
    kernels: dict = {}
    for r in recs:
        for (part, name), us in r["kernels"].items():
            kernels[(part, name)] = kernels.get((part, name), 0.0) + us / len(recs)
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])[:top]
    return {
        "steps": len(recs),
        "device_us_median": round(device, 2),
        "step_gpu_us_median": round(statistics.median(r["step_gpu_us"] for r in recs), 2),
        "parts_us_median": med,
        "parts_share": {p: round(v / device, 4) if device else None for p, v in med.items()},
        "ddtree_only_us_median": round(ddtree_only, 2),
        "ddtree_only_share": round(ddtree_only / device, 4) if device else None,
        "top_kernels": [{"part": p, "name": n[:120], "us_per_step": round(us, 2)} for (p, n), us in ranked],
    }


def table(name: str, s: dict) -> str:
    if not s.get("steps"):
        return f"{name}: {s.get('verdict')}"
    rows = [f"{name}: {s['steps']} steps, device {s['device_us_median']} us/step (median), GPU span "
            f"{s['step_gpu_us_median']} us; DDTree-only parts {s['ddtree_only_us_median']} us "
            f"({100 * (s['ddtree_only_share'] or 0):.2f}%)", "| part | us / step | share |", "| --- | ---: | ---: |"]
    for p in (*PARTS, "fork_commit"):
        rows.append(f"| {p} | {s['parts_us_median'][p]} | {100 * (s['parts_share'][p] or 0):.2f}% |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = {}
    for t in args.traces:
        try:
            out[t.name] = summarise(load(t))
        except (OSError, ValueError, EOFError) as err:
            print(f"breakdown: {t}: cannot read the trace: {err}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print("\n\n".join(table(k, v) for k, v in out.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
