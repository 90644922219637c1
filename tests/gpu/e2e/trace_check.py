"""Host synchronisation inside a DDTree decode step, from a torch profiler chrome trace (SGLang's
``/start_profile`` output, ``*.trace.json.gz``). Pure Python.

A decode step is a ``user_annotation`` event named ``e2e_hook.RANGE_NAME`` (the harness's hook wraps
``ddtree_decode.forward_decode`` in it). Inside each step, on the same process and thread, it counts:

- device-to-host copies: ``gpu_memcpy`` events whose name says DtoH, attributed to the step through
  the runtime call they correlate with (``args.correlation``);
- synchronising runtime calls: ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, and blocking ``cudaMemcpy`` (without Async);
- ``aten::item`` / ``aten::_local_scalar_dense`` that read a device tensor: a copy or synchronising runtime
  call (``cudaMemcpy*``, ``*Synchronize``) runs inside the op. The same ops on a host tensor (for example
  ``int(batch.seq_lens_cpu.sum())``) launch no runtime call: they are listed as ``host_tensor_reads`` and are
  not a synchronisation (the H200 run with overlap scheduling off, 2026-12-01: 3 per step, no copy, no sync).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

RANGE_NAME = "sgdeploy_e2e::ddtree_decode_step"
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")
HOST_READ_OPS = ("aten::item", "aten::_local_scalar_dense")


def load_trace(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def check(trace: dict, range_name: str = RANGE_NAME) -> dict:
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    steps = [e for e in events if e.get("name") == range_name and e.get("cat") in ("user_annotation", "cpu_op")]
    by_thread: dict[tuple, list[tuple[float, float]]] = {}
    for s in steps:
        by_thread.setdefault((s.get("pid"), s.get("tid")), []).append((float(s["ts"]), float(s["ts"]) + float(s["dur"])))

    def inside(e) -> bool:
        ts = float(e.get("ts", 0))
        return any(a <= ts <= b for a, b in by_thread.get((e.get("pid"), e.get("tid")), ()))

    runtime = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") == "cuda_runtime" and corr is not None:
            runtime[corr] = e
    device_calls: dict[tuple, list[float]] = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and (str(e.get("name", "")).startswith("cudaMemcpy")
                                               or "Synchronize" in str(e.get("name", ""))):
            device_calls.setdefault((e.get("pid"), e.get("tid")), []).append(float(e.get("ts", 0)))

    def reads_device(e) -> bool:
        a = float(e.get("ts", 0))
        b = a + float(e.get("dur", 0))
        return any(a <= t <= b for t in device_calls.get((e.get("pid"), e.get("tid")), ()))

    found: Counter = Counter()
    host_reads: Counter = Counter()
    examples: list[str] = []
    for e in events:
        cat, name = e.get("cat"), str(e.get("name", ""))
        hit = None
        if cat == "gpu_memcpy" and ("DtoH" in name or "Device -> Pinned" in name or "Device -> Pageable" in name):
            call = runtime.get((e.get("args") or {}).get("correlation"))
            if call is not None and inside(call):
                hit = f"DtoH copy ({name})"
        elif cat == "cuda_runtime" and name in SYNC_CALLS and inside(e):
            hit = name
        elif cat == "cpu_op" and name in HOST_READ_OPS and inside(e):
            if reads_device(e):
                hit = name
            else:
                host_reads[name] += 1
        if hit:
            found[hit] += 1
            if len(examples) < 10:
                examples.append(f"{hit} at ts {e.get('ts')}")
    return {
        "decode_steps": len(steps),
        "threads": len(by_thread),
        "host_syncs": sum(found.values()),
        "by_kind": dict(found),
        "host_tensor_reads": dict(host_reads),
        "examples": examples,
        "verdict": ("no decode step in the trace" if not steps
                    else "no host sync inside a decode step" if not found
                    else f"{sum(found.values())} host syncs inside {len(steps)} decode steps"),
    }
