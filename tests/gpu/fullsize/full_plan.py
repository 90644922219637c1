"""The servers of the full-size step-cost run (issue 23), their flags and their predicted GPU memory.

Every server is one of the project's configs rendered by ``sgdeploy.render.launch_args`` with the
overrides applied to the config first (as tests/gpu/e2e/plan.py does): the Qwen3.6-27B-shaped configs made
by models.py (folders on the GPU machine, ``--load-format dummy``), a port per server, and
``serving.extra_args`` = ``FULL_ARGS`` (each explained there). Speculative overrides per server give the
grid: forking off (``state_forking: false``, ``reproduce_state_leak: true``, the full release) and the torch
top-k (``fused_topk: false``). ``ddtree-sched`` (issue 38) is DDTREE 32 with the budget schedule ``1:32,6:15``
(``speculative.budget_schedule``) and patch 0005's verify graphs at every scheduled width
(``SGLANG_DDTREE_SCHEDULE_GRAPHS=1``, opt-in: the e2e plan's ``GRAPHS_ON``): at the measured batch sizes it runs
budget 32 at 1 and 15 at 6 and 8, so ``sched_check.py`` compares its step with ``ddtree-b32``'s and
``ddtree-b15``'s.

Memory (``predict_bytes``): bf16 weights of both models + the KV pools + the recurrent-state pool + the
speculative intermediate buffers (``sgdeploy.budget.forking_buffer_bytes``: the SSM states and conv windows
per verify position, at the largest scheduled budget where a schedule is set: the server sizes them for it;
DFLASH has the same SSM buffer at its 16 positions, its conv windows deduplicated) +
``RESERVE_GIB`` for activations, CUDA graphs and the CUDA context. ``max_running_requests`` is the largest
of 8 and below whose prediction fits one GPU (``GPU_GIB``): budget 64 cannot run 8 requests on one H200 in
bf16 (buffers 83.9 GiB + weights 53.3 GiB), so its batch-8 point is measured at the largest batch that fits.

    python tests/gpu/fullsize/full_plan.py [--out .gpu-e2e/plan-fullsize.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
# sgdeploy imports the sgdeploy.host collection's module_utils as the installed package does; run from a
# checkout without the package (the GPU machine's python3), they come from collections/ (pyproject.toml).
for p in (str(REPO), str(REPO / "collections"), str(HERE), str(HERE.parent / "e2e")):
    if p not in sys.path:
        sys.path.insert(0, p)

import models  # noqa: E402
import plan as e2e_plan  # noqa: E402  (tests/gpu/e2e/plan.py: wheel keys, the device root)
import waves  # noqa: E402  (re-exported: full_plan.waves.waves)

from sgdeploy import budget, render, spec  # noqa: E402

GIB = 1 << 30
DEVICE_ROOT = f"{e2e_plan.DEVICE_ROOT}/fullsize"
MODELS = f"{DEVICE_ROOT}/models"
BASE_PORT = 32000
PORT_STEP = 10
MAX_RUNNING = 8
BATCHES = (1, 6, 8)  # 6: the largest batch budget 64 fits (below), so every server has a point beside it
MAX_TOTAL_TOKENS = 16_384
MAMBA_CACHE = 16
GPU_GIB = 139.8  # one H200 as torch reports it (143 771 MiB)
GPU_RESERVE_GIB = waves.GPU_RESERVE_GIB
RESERVE_GIB = 6.0  # per server: activations, CUDA graphs, cuBLAS workspace, CUDA context
FULL = ("ddtree", "fork", "topk")
SCHEDULE = ((1, 32), (6, 15))  # ddtree-sched: budget 32 at 1-5 running requests, 15 from 6

FULL_ARGS = (
    "--load-format", "dummy",           # random weights: no checkpoint, config.json only
    "--skip-tokenizer-init",            # token ids in and out; the tokenizer is never loaded
    "--page-size", "1",                 # DDTree requires it; the same for AR and DFLASH
    "--sampling-backend", "pytorch",    # no real flashinfer on the GPU machine (the e2e stand-in)
    "--context-length", "4096",         # prompts 256 + 128 new tokens; caps the per-request tables
    "--cuda-graph-max-bs-decode", str(MAX_RUNNING),  # decode/verify graphs for batch 1..8 only
    "--cuda-graph-bs-decode", *(str(b) for b in BATCHES),  # and only at the measured sizes (a shorter start)
    "--disable-prefill-cuda-graph",     # only decode steps are measured; breakable prefill graphs cost the start
    "--max-total-tokens", str(MAX_TOTAL_TOKENS),     # a small KV pool: 8 x 384 tokens is all a run needs
    "--max-mamba-cache-size", str(MAMBA_CACHE),      # a small recurrent-state pool (147 MiB a slot)
    "--disable-radix-cache",            # random prompts share nothing; the Rust tree fails here (e2e F4)
    "--decode-log-interval", "1",       # the step timer (SGLANG_RECORD_STEP_TIME) samples every step
    "--log-level", "info",
)
DRAFT_ARGS = ("--speculative-draft-load-format", "dummy")  # the drafter's weights random too (its own switch)
ENV = {"SGLANG_RECORD_STEP_TIME": "1"}  # /get_server_info: internal_states[0].step_time_dict


@dataclass(frozen=True)
class Server:
    name: str
    config: str
    budget: int | None = None
    topk_cap: int | None = None
    speculative: dict = field(default_factory=dict)  # extra speculative overrides
    features: tuple[str, ...] | None = None
    extra: tuple[str, ...] = ()  # server flags the configs have no field for (after FULL_ARGS)
    tags: tuple[str, ...] = ()
    budget_schedule: tuple[tuple[int, int], ...] = ()  # speculative.budget_schedule: (min_batch, budget) entries
    env: tuple[tuple[str, str], ...] = ()  # added to the server's environment (not a config field)


# In order of importance: a run that stops early still has the first ones.
SERVERS = (
    Server("ar", "ar"),
    Server("dflash-b16", "dflash-b16", tags=("profile",)),
    Server("ddtree-b15", "ddtree-b15", 15, 8, tags=("profile",)),
    Server("ddtree-b64", "ddtree-b64", 64, 8, tags=("profile",)),
    # Issue 38 item 3: the budget schedule at the 27B shape, budget 32 at batch 1 and 15 at 6 and 8 (the measured
    # sizes), with the verify graphs at both widths. Before ddtree-b32: on one H200 a call runs ddtree-b15, this and
    # (if the deadline allows) ddtree-b32 in that order, so a cold machine still measures the schedule beside the
    # fixed budget of its larger batches; a crash or hang (e2e F7) costs only its own wave.
    Server("ddtree-sched", "ddtree-b32", 32, 8, budget_schedule=SCHEDULE, env=(e2e_plan.GRAPHS_ON,)),
    Server("ddtree-b32", "ddtree-b32", 32, 8),
    Server("ddtree-b64-nofork", "ddtree-b64", 64, 8, {"state_forking": False, "reproduce_state_leak": True},
           features=FULL),
    Server("ddtree-b64-torchtopk", "ddtree-b64", 64, 8, {"fused_topk": False}, features=FULL),
    # Patch 0004's switch: the same release with 0.5.23's tree conv, for the side-by-side step cost.
    Server("ddtree-b64-upstreamconv", "ddtree-b64", 64, 8, features=FULL,
           extra=("--speculative-ddtree-tree-conv", "upstream")),
    # The same at budget 15, where the kernels alone gain least (T = 16): does 0004 cost anything there?
    Server("ddtree-b15-upstreamconv", "ddtree-b15", 15, 8, features=FULL,
           extra=("--speculative-ddtree-tree-conv", "upstream")),
)

TARGET_SHAPE = budget.QWEN3_6_27B


def kv_bytes_per_token(spec_on: bool) -> int:
    full_layers = models.LAYERS // models.FULL_ATTENTION_INTERVAL
    target = full_layers * 2 * models.KV_HEADS * models.HEAD_DIM * 2
    drafter = models.DRAFT_LAYERS * 2 * models.DRAFT_KV_HEADS * models.DRAFT_HEAD_DIM * 2 if spec_on else 0
    return target + drafter


def spec_positions(algorithm: str, budget_: int | None, block_size: int) -> int:
    """Verify positions T whose intermediate states the server keeps: budget + 1 (DDTREE), the block (DFLASH)."""
    if algorithm == "DDTREE":
        return int(budget_) + 1
    if algorithm == "DFLASH":
        return block_size
    return 0


def predict_bytes(algorithm: str, budget_: int | None, max_running: int, block_size: int = 16) -> dict[str, int]:
    counts = models.parameter_counts()
    spec_on = algorithm != "NONE"
    t = spec_positions(algorithm, budget_, block_size)
    parts = {
        "weights": 2 * (counts["target"] + (counts["drafter"] if spec_on else 0)),
        "kv": MAX_TOTAL_TOKENS * kv_bytes_per_token(spec_on),
        "mamba_pool": (MAMBA_CACHE + 1) * TARGET_SHAPE.node_bytes(),
        "spec_buffers": budget.forking_buffer_bytes(TARGET_SHAPE, t - 1, max_running) if t else 0,
        "reserve": int(RESERVE_GIB * GIB),
    }
    parts["total"] = sum(parts.values())
    return parts


def fit_running(algorithm: str, budget_: int | None, gpu_gib: float = GPU_GIB) -> int:
    """The largest max_running_requests <= MAX_RUNNING whose prediction fits one GPU (0: none does)."""
    room = (gpu_gib - GPU_RESERVE_GIB) * GIB
    for r in range(MAX_RUNNING, 0, -1):
        if predict_bytes(algorithm, budget_, r)["total"] <= room:
            return r
    return 0


def sized_budget(sp: spec.Speculative) -> int | None:
    """The budget the server sizes its buffers for: the largest scheduled one where a schedule is set (the
    config's rule makes it equal to ``speculative.budget``; taken from the schedule all the same)."""
    if sp.budget_schedule:
        return max(b for _, b in sp.budget_schedule)
    return sp.budget


def _overrides(server: Server, config: spec.Config, port: int, max_running: int) -> dict:
    sp = dict(server.speculative)
    if server.budget_schedule:
        sp["budget_schedule"] = [{"min_batch": m, "budget": b} for m, b in server.budget_schedule]
    out = e2e_plan.model_overrides(config, MODELS, server.budget, server.topk_cap, sp)
    out["serving"] = {"port": port, "nccl_port": port + 1, "mem_fraction_static": 0.88,
                      "max_running_requests": max_running,
                      "extra_args": [*FULL_ARGS, *(DRAFT_ARGS if config.speculative.algorithm != "NONE" else ()),
                                     *server.extra],
                      "forking_memory_gib": None, "env": {**dict(config.serving.env), **ENV}}
    return out


def harness_config(server: Server, port: int, max_running: int) -> spec.Config:
    path = spec.resolve(server.config)
    base = spec.load(path)
    merged = spec.deep_merge(spec.load_merged(path, path.parent), _overrides(server, base, port, max_running))
    return spec.validate(merged, path, f"fullsize-{server.name}")


def server_entry(server: Server, index: int, gpu_gib: float = GPU_GIB) -> dict:
    port = BASE_PORT + PORT_STEP * index
    probe = harness_config(server, port, MAX_RUNNING)
    sp = probe.speculative
    sized = sized_budget(sp)
    running = fit_running(sp.algorithm, sized, gpu_gib)
    if running < 1:
        raise SystemExit(f"server {server.name}: does not fit one GPU of {gpu_gib} GiB even at 1 request")
    config = harness_config(server, port, running)
    args = render.launch_args(config, render.HostSettings(release_label="fullsize", bind_address="127.0.0.1"))
    features = tuple(server.features) if server.features is not None else config.patch_features
    mem = predict_bytes(sp.algorithm, sized, running, sp.block_size or 16)
    t = spec_positions(sp.algorithm, sized, sp.block_size or 16)
    return {
        "name": server.name, "config": server.config, "port": port, "algorithm": sp.algorithm,
        "budget": sp.budget, "topk_cap": sp.topk_cap, "state_forking": sp.state_forking,
        "fused_topk": sp.fused_topk, "block_size": sp.block_size, "verify_positions": t,
        "max_running": running, "batches": sorted({min(b, running) for b in BATCHES}),
        "features": list(features), "wheel": e2e_plan.wheel_key(features), "tags": list(server.tags),
        "budget_schedule": [list(e) for e in sp.budget_schedule] if sp.budget_schedule else None,
        "args": args, "env": {**dict(config.serving.env), **dict(server.env)}, "predicted_bytes": mem,
        "predicted_forking_gib": round(mem["spec_buffers"] / GIB, 3),
    }


def build(gpu_gib: float = GPU_GIB) -> dict:
    servers = [server_entry(s, i, gpu_gib) for i, s in enumerate(SERVERS)]
    return {"set": "fullsize", "servers": servers, "wheels": sorted({s["wheel"] for s in servers}),
            "models": MODELS, "full_args": list(FULL_ARGS), "gpu_gib": gpu_gib,
            "reserve_gib": RESERVE_GIB, "gpu_reserve_gib": GPU_RESERVE_GIB}


def describe(entry: dict) -> str:
    p = entry["predicted_bytes"]
    return (f"{entry['name']:<22} running {entry['max_running']} batches {entry['batches']} predicted "
            f"{p['total'] / GIB:6.1f} GiB (buffers {entry['predicted_forking_gib']} GiB)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the plan there (default: print it)")
    ap.add_argument("--gpu-gib", type=float, default=GPU_GIB, help=f"one GPU's memory (default {GPU_GIB})")
    args = ap.parse_args(argv)
    try:
        built = build(args.gpu_gib)
    except spec.ConfigError as err:
        raise SystemExit(f"full_plan: {err}") from None
    if args.out is None:
        print(json.dumps(built, indent=1))
        return 0
    args.out.write_text(json.dumps(built, indent=1) + "\n")
    print("\n".join(describe(e) for e in built["servers"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
