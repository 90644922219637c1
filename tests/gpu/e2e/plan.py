"""The servers of the end-to-end harness, with the flags the project renders for their configs.

Every server is one of the project's configs (``configs/*.yml``) rendered by ``sgdeploy.render.launch_args``
(the ``ExecStart`` arguments of its unit, minus the interpreter), with the harness's overrides applied to
the config *before* rendering, so that the renderer itself produces them:

- the tiny test models (``source: path``, folders on the GPU machine) instead of the Hugging Face ones;
- a port per server, ``mem_fraction_static`` / ``max_running_requests`` sized for many servers on one GPU;
- DDTree budget and top-k cap per server (the experiment grid);
- ``serving.extra_args``: ``HARNESS_ARGS`` (the same for every server, each one explained there) and the
  variant's own flags (``--disable-cuda-graph``, ``--disable-overlap-schedule``).

The release a server runs is a parameter too: ``features`` (patch features; default the config's own
``patch_features``), one wheel per feature set, built by ``sgdeploy.wheel`` (bundle.py).

    python tests/gpu/e2e/plan.py [--set core|extra|all] [--out plan.json]    (prints the plan as JSON)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# sgdeploy imports the sgdeploy.host collection's module_utils as the installed package does; run from a
# checkout without the package (the GPU machine's python3), they come from collections/ (pyproject.toml).
for _p in (str(REPO), str(REPO / "collections")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from sgdeploy import render, spec  # noqa: E402

DEVICE_ROOT = "/tmp/gpu-e2e"  # on the GPU machine (run.sh)
MODELS = f"{DEVICE_ROOT}/models"  # the tiny random vocabulary-16 pair (tiny_models.py)
LEARNED = f"{DEVICE_ROOT}/learned"  # the trained pair (tests/gpu/learned/train_pair.py)
BASE_PORT = 31000
PORT_STEP = 10
MEM_FRACTION = 0.5  # many servers on one GPU: see README.md, "Many servers on one GPU"
MAX_RUNNING = 8

# Flags every harness server gets on top of the rendered ones, and why.
HARNESS_ARGS = (
    "--page-size", "1",                 # DDTree requires it (its flag check); the same for AR and DFLASH
    "--sampling-backend", "pytorch",    # no real flashinfer on the GPU machine (a stand-in, README.md)
    "--context-length", "2048",         # the tiny models say 4096; the prompts need far less
    "--cuda-graph-max-bs-decode", str(MAX_RUNNING),  # decode/verify graphs only for the batch sizes used
    "--max-total-tokens", "65536",      # caps the KV pool: with many servers the profiled size is wrong
    "--max-mamba-cache-size", "64",     # caps the recurrent-state pool likewise (and the DDTree buffers)
    "--log-level", "info",
)
SKIP_TOKENIZER = ("--skip-tokenizer-init",)  # experiment servers take and return token ids


@dataclass(frozen=True)
class Server:
    name: str
    config: str
    budget: int | None = None
    topk_cap: int | None = None
    variant: tuple[str, ...] = ()
    features: tuple[str, ...] | None = None  # None: the config's own patch_features
    role: str = "experiment"  # experiment (token ids, skip tokenizer) | gate (the config's text gates)
    tags: tuple[str, ...] = field(default_factory=tuple)
    tp_size: int = 1  # > 1: serving.tp_size and gpus 0 .. tp_size - 1 (CUDA_VISIBLE_DEVICES), NVLink multicast off
    fused_topk: bool | None = None  # None: the config's own speculative.fused_topk
    max_running: int = 8  # MAX_RUNNING: max_running_requests and the largest decode/verify graph batch
    env: tuple[tuple[str, str], ...] = ()  # added to the server's environment
    budget_schedule: tuple[tuple[int, int], ...] = ()  # speculative.budget_schedule: (min_batch, budget) entries


FULL = ("ddtree", "fork", "topk")

# Call 1 ("core"): lossless + acceptance with CUDA graphs on and overlap scheduling on, batch 8.
CORE = (
    Server("ar", "ar"),
    Server("ar-patched", "ar", features=FULL, tags=("ar_check",)),
    Server("dflash", "dflash-b16", tags=("control",)),
    Server("ddtree-b15-k4", "ddtree-b15", 15, 4),
    Server("ddtree-b15-k8", "ddtree-b15", 15, 8, tags=("sampling",)),
    Server("ddtree-b32-k8", "ddtree-b32", 32, 8),
    Server("ddtree-b32-k16", "ddtree-b32", 32, 16),
    Server("ddtree-b64-k8", "ddtree-b64", 64, 8),
    Server("ddtree-b64-k16", "ddtree-b64", 64, 16, tags=("sampling", "logprobs", "profile")),
    Server("nofork-b64-k16", "ddtree-b64-nofork", 64, 16, tags=("nofork",)),
    Server("ddtree-b64-k16-eager", "ddtree-b64", 64, 16, variant=("--disable-cuda-graph",)),
)
# Call 2 ("extra"): the other paths, the AR reference again, and the project's gates on text.
EXTRA = (
    Server("ar", "ar"),
    Server("ddtree-b64-k16-nooverlap", "ddtree-b64", 64, 16, variant=("--disable-overlap-schedule",),
           tags=("profile",)),
    Server("ddtree-b15-k8-nooverlap-eager", "ddtree-b15", 15, 8,
           variant=("--disable-overlap-schedule", "--disable-cuda-graph")),
    Server("nofork-b15-k8", "ddtree-b15-nofork", 15, 8, tags=("nofork",)),
    Server("gate-ar", "ar", role="gate"),
    Server("gate-dflash-b16", "dflash-b16", role="gate"),
    Server("gate-ddtree-b64", "ddtree-b64", role="gate"),
)
# Call 3 ("final", after calls 1-2 found that budgets above 15 cannot start with CUDA graphs, FINDINGS.md F1):
# budgets 32 and 64 eager, budget 15 with graphs against itself eager and with overlap off, the leak, the AR
# reference without the radix cache (its Rust tree panics on the scoring prefills, F2), the gates.
EAGER = ("--disable-cuda-graph",)
FINAL = (
    Server("ar", "ar", variant=("--disable-radix-cache",), tags=("reference",)),
    Server("ddtree-b15-k8", "ddtree-b15", 15, 8, tags=("sampling", "logprobs", "profile")),
    Server("ddtree-b15-k8-eager", "ddtree-b15", 15, 8, variant=EAGER),
    Server("ddtree-b15-k8-nooverlap", "ddtree-b15", 15, 8, variant=("--disable-overlap-schedule",)),
    Server("ddtree-b32-k8-eager", "ddtree-b32", 32, 8, variant=EAGER),
    Server("ddtree-b32-k16-eager", "ddtree-b32", 32, 16, variant=EAGER),
    Server("ddtree-b64-k8-eager", "ddtree-b64", 64, 8, variant=EAGER),
    Server("ddtree-b64-k16-eager", "ddtree-b64", 64, 16, variant=EAGER, tags=("sampling", "logprobs")),
    Server("nofork-b64-k16-eager", "ddtree-b64-nofork", 64, 16, variant=EAGER, tags=("nofork",)),
    Server("gate-ar", "ar", role="gate"),
    Server("gate-ddtree-b15", "ddtree-b15", role="gate"),
)
# Call 4 ("gates"): the gates again with the fixed test tokenizer (call 3: an empty smoke answer), and overlap
# scheduling off without the radix cache (call 3: the Rust radix tree refused its insert, F2).
GATES = (
    Server("gate-ar", "ar", role="gate"),
    Server("gate-ddtree-b15", "ddtree-b15", role="gate"),
    Server("ddtree-b15-k8-nooverlap", "ddtree-b15", 15, 8,
           variant=("--disable-overlap-schedule", "--disable-radix-cache"), tags=("profile",)),
)
# Call 5 ("graphs", session 7, after the series fixed F1-F3): every DDTree budget with CUDA graphs on (draft graphs
# at block width, verify graphs at budget + 1 with the tree mask), overlap on and off, the leak with the same
# release and the switch off, the AR reference without the radix cache (F4), and the project's gates with the
# exactness gate (issue 22) on a reference recorded from the gate-ar server.
NORADIX = ("--disable-radix-cache",)
GRAPHS = (
    Server("ar", "ar", variant=NORADIX, tags=("reference",)),
    Server("dflash", "dflash-b16", tags=("control",)),
    Server("ddtree-b15-k4", "ddtree-b15", 15, 4),
    Server("ddtree-b15-k8", "ddtree-b15", 15, 8, tags=("sampling", "logprobs", "profile")),
    Server("ddtree-b32-k8", "ddtree-b32", 32, 8),
    Server("ddtree-b32-k16", "ddtree-b32", 32, 16),
    Server("ddtree-b64-k8", "ddtree-b64", 64, 8),
    Server("ddtree-b64-k16", "ddtree-b64", 64, 16, tags=("sampling", "logprobs", "profile")),
    Server("nofork-b64-k16", "ddtree-b64-nofork", 64, 16, features=FULL, tags=("nofork",)),
    Server("ddtree-b64-k16-nooverlap", "ddtree-b64", 64, 16,
           variant=("--disable-overlap-schedule", *NORADIX), tags=("profile",)),
    Server("gate-ar", "ar", role="gate", variant=NORADIX, tags=("exactness_reference",)),
    Server("gate-ddtree-b15", "ddtree-b15", role="gate", tags=("exactness",)),
    Server("gate-ddtree-b64", "ddtree-b64", role="gate", tags=("exactness",)),
    Server("gate-nofork-b64", "ddtree-b64-nofork", role="gate", features=FULL, tags=("exactness",)),
)
# Call 6 ("recheck"): the exactness gate live with its exact-tie fix (F6), and overlap off profiled with
# trace_check telling host-tensor reads from device syncs.
RECHECK = tuple(s for s in GRAPHS if s.name in {"ddtree-b64-k16-nooverlap", "gate-ar", "gate-ddtree-b15",
                                                  "gate-ddtree-b64", "gate-nofork-b64"})
# Call 7 ("treeconv", issue 23, session 9): the series' own tree conv (patch 0004) in the server, losslessness with
# CUDA graphs (parents copied into the graph buffer) and eagerly (the per-forward parent tensor), and the exactness
# gate at budget 64 on a reference recorded from the gate-ar server.
TREECONV = tuple(s for s in GRAPHS if s.name in {"ar", "ddtree-b15-k8", "ddtree-b64-k16", "ddtree-b64-k8", "gate-ar",
                                                   "gate-ddtree-b64"}) + tuple(
    s for s in FINAL if s.name == "ddtree-b64-k16-eager")
# Issue 25 ("tp2", on nvidia-h200-x2; not run yet): tensor parallelism 2 on two H200s, CUDA graphs and overlap on,
# the AR reference and DDTree budgets 15 and 64 (forking on, fused top-k) each a TP-2 server over both GPUs, for the
# same losslessness check as the single-GPU sets. NCCL_NVLS_ENABLE=0 in every server's environment and no
# --enable-nccl-nvls (the device notes: NVLink multicast can take the host's GPUs out of service).
TP2 = tuple(Server(s.name, s.config, s.budget, s.topk_cap, s.variant, s.features, s.role, ("tp2",), tp_size=2)
            for s in GRAPHS if s.name in {"ar", "ddtree-b15-k8", "ddtree-b64-k16"})
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0"}
# Issue 32 ("budget"): the budget question on the trained pair (tests/gpu/learned), CUDA graphs and overlap on, fused
# top-k: AR, DFLASH 16, DDTREE budgets 8 / 15 / 32 / 64 at top-k caps 4 / 8 / 16 (a cap is at most the budget) with
# state forking on, and forking off at cap 8 for every budget and at budget 64 cap 16 (the same release, the switch
# off; above block - 1 that is the reproduce_state_leak config). Held-out code and prose prompts (prompts.json).
BUDGETS = {8: (4, 8), 15: (4, 8), 32: (4, 8, 16), 64: (4, 8, 16)}
_FORK_CONFIG = {8: "ddtree-b15", 15: "ddtree-b15", 32: "ddtree-b32", 64: "ddtree-b64"}
_NOFORK_CONFIG = {8: "ddtree-b15-nofork", 15: "ddtree-b15-nofork", 32: "ddtree-b64-nofork", 64: "ddtree-b64-nofork"}
BUDGET = (
    Server("ar", "ar", variant=NORADIX, tags=("reference",)),
    Server("dflash", "dflash-b16", tags=("control",)),
    *(Server(f"ddtree-b{b}-k{k}", _FORK_CONFIG[b], b, k) for b, caps in BUDGETS.items() for k in caps),
    *(Server(f"nofork-b{b}-k8", _NOFORK_CONFIG[b], b, 8, features=FULL, tags=("nofork",), fused_topk=True)
      for b in BUDGETS),
    Server("nofork-b64-k16", "ddtree-b64-nofork", 64, 16, features=FULL, tags=("nofork",), fused_topk=True),
)
# Issue 32 ("judge"): the project's own code judges the trained pair's servers, text in (the gate role): the gates
# (smoke, throughput, acceptance with its minimum taken from the DFLASH server's measured acceptance, exactness
# against a reference recorded from the AR server) and the sweep's measurement and report over the DDTree servers,
# forking on and the leak.
JUDGE = (
    Server("gate-ar", "ar", role="gate", variant=NORADIX, tags=("exactness_reference",)),
    Server("gate-dflash-b16", "dflash-b16", role="gate", tags=("accept_baseline",)),
    *(Server(f"gate-ddtree-b{b}", _FORK_CONFIG[b], b, 8, role="gate", tags=("exactness", "sweep")) for b in BUDGETS),
    *(Server(f"gate-nofork-b{b}", _NOFORK_CONFIG[b], b, 8, role="gate", features=FULL, tags=("exactness", "sweep"),
             fused_topk=True) for b in (32, 64)),
)
# Issue 32, the last device minutes of session 12 ("quick"): train, then AR, DFLASH 16, DDTREE 15 / 64 with forking
# and DDTREE 64 without, in one call.
QUICK = tuple(s for s in BUDGET if s.name in {"ar", "dflash", "ddtree-b15-k8", "ddtree-b64-k16", "nofork-b64-k16"})
# Issue 32 in one call ("learned"): both, started together.
LEARNED_SET = BUDGET + JUDGE
# Issues 38 and 36 ("schedule", session 18): on the trained pair, CUDA graphs and overlap on, fused top-k, up to 16
# requests in flight: AR, DFLASH 16, DDTREE 15 / 32 / 64 at cap 8 with forking and 64 without, and the budget
# schedule 1:64,4:32,8:15 (patch 0005; with its graphs per width and with the largest width's only), timed at 1, 4, 8
# and 16 in flight and over a load that moves 1 -> 16 -> 1 (plan "batches") in paired rounds (SCHEDULE_PLAN). The
# servers tagged "watch" read their own /metrics with the post-deploy watch's code (module_utils/sglang_watch.py)
# around the greedy run, against the requests' own meta_info numbers.
SCHEDULE_ENTRIES = ((1, 64), (4, 32), (8, 15))
# Patch 0005's verify graphs at every scheduled width: on by default since the H200 run of 2026-12-05 (ddtree_graphs.py);
# the servers that test them say so explicitly, and "sched-k8-onegraph" switches them off (the other widths eager).
GRAPHS_ON = ("SGLANG_DDTREE_SCHEDULE_GRAPHS", "1")
GRAPHS_OFF = ("SGLANG_DDTREE_SCHEDULE_GRAPHS", "0")
BATCHES = (1, 4, 8, 16)
SCHEDULE = (
    Server("ar", "ar", variant=NORADIX, tags=("reference",), max_running=16),
    Server("dflash", "dflash-b16", tags=("control", "watch"), max_running=16),
    *(Server(f"ddtree-b{b}-k8", _FORK_CONFIG[b], b, 8, tags=("watch",) if b == 15 else (), max_running=16)
      for b in (15, 32, 64)),
    Server("nofork-b64-k8", "ddtree-b64-nofork", 64, 8, features=FULL, tags=("nofork",), fused_topk=True,
           max_running=16),
    Server("sched-k8", "ddtree-b64", 64, 8, budget_schedule=SCHEDULE_ENTRIES, tags=("watch", "schedule"),
           max_running=16, env=(GRAPHS_ON,)),
    Server("sched-k8-onegraph", "ddtree-b64", 64, 8, budget_schedule=SCHEDULE_ENTRIES, tags=("schedule",),
           max_running=16, env=(GRAPHS_OFF,)),
)
# What set "schedule" compares, each comparison in paired, interleaved rounds (paired.py, sched_compare.py): the
# schedule's server against the fixed budgets it uses (at each batch: within 3 % of the best; over the moving load:
# beats each) and DFLASH 16 (the moving load), and its graphs on against off at the batch sizes where its widths differ
# from the largest (below, the largest width runs from a graph in both). The other timed servers ("ar",
# "nofork-b64-k8") get one single pass each, after the comparisons, where time is left.
SCHEDULE_PLAN = {"server": "sched-k8", "graphs_off": "sched-k8-onegraph", "control": "dflash",
                 "fixed": [f"ddtree-b{b}-k8" for b in sorted({b for _, b in SCHEDULE_ENTRIES})],
                 "graphs_batches": [n for n in BATCHES if n >= min(m for m, _ in SCHEDULE_ENTRIES if m > 1)]}
# Issue 38 item 3 ("derive", session 20): the schedule derived on this machine from this run's own timings. AR (the
# reference), DFLASH 16 (the control) and DDTREE 15 / 32 / 64 at cap 8 start together; the runner times the three
# fixed budgets in interleaved repeats (phase A, paired.py), derives the schedule from their medians with the project's
# own sgdeploy.schedule.derive (derive.py), starts "sched-derived" with it (held back until then; its plan flags are the
# placeholder schedule, replaced), checks it against AR, then times it in alternation with the fixed budgets and the
# control (phase B) and judges the paired ratios. The guessed schedule's servers ("sched-k8", "sched-k8-onegraph")
# stay in "schedule" only: patch 0005's per-width graphs were proven there (2026-12-05), and here they would take time
# and memory from the paired rounds.
DERIVE_FROM = tuple(f"ddtree-b{b}-k8" for b in (15, 32, 64))
DERIVE = (
    *(s for s in SCHEDULE if s.name in {"ar", "dflash", *DERIVE_FROM}),
    Server("sched-derived", "ddtree-b64", 64, 8, budget_schedule=SCHEDULE_ENTRIES, tags=("schedule", "derived"),
           max_running=16, env=(GRAPHS_ON,)),
)
DERIVE_PLAN = {"server": "sched-derived", "from": list(DERIVE_FROM), "control": "dflash"}
# The sets that stay on the tiny random vocabulary-16 models, and why: the recorded runs of sessions 6-8 (core,
# extra, final, gates, all) were made on them and their results in docs/ name them; tp2 needs vocabulary 16 at TP 2
# (rank 1 holds no real row: the defect its run is expected to find). Every other set runs on the trained pair.
TINY_SETS = {"core", "extra", "final", "gates", "all", "tp2"}
SETS = {"core": CORE, "extra": EXTRA, "final": FINAL, "gates": GATES, "graphs": GRAPHS, "recheck": RECHECK, "treeconv": TREECONV,
        "tp2": TP2, "budget": BUDGET, "judge": JUDGE, "learned": LEARNED_SET, "quick": QUICK,
        "schedule": SCHEDULE, "derive": DERIVE,
        "all": CORE + tuple(s for s in EXTRA if s.name != "ar")}


def model_overrides(config: spec.Config, models: str, budget: int | None, topk_cap: int | None,
                    speculative: dict | None = None) -> dict:
    """The overrides every harness config gets, whatever its sizing: the target and drafter from folders under
    ``models`` on the GPU machine, and the experiment's DDTree budget and top-k cap (on top of ``speculative``)."""
    path_source = {"source": "path", "revision": None, "allow_patterns": None, "controller_path": None,
                   "version": None}
    out: dict = {"model": {**path_source, "path": f"{models}/target"}}
    if config.drafter is not None and config.speculative.algorithm != "NONE":
        out["drafter"] = {**path_source, "path": f"{models}/drafter"}
    sp = dict(speculative or {})
    if budget is not None:
        sp["budget"] = budget
    if topk_cap is not None:
        sp["topk_cap"] = topk_cap
    if sp:
        out["speculative"] = sp
    return out


def harness_args(max_running: int = MAX_RUNNING) -> list[str]:
    """HARNESS_ARGS with the graph batch limit of a server that runs ``max_running`` requests."""
    out = list(HARNESS_ARGS)
    out[out.index("--cuda-graph-max-bs-decode") + 1] = str(max_running)
    return out


def _overrides(server: Server, config: spec.Config, port: int, models: str = MODELS) -> dict:
    extra = [*harness_args(server.max_running), *(SKIP_TOKENIZER if server.role == "experiment" else ()),
             *server.variant]
    sp = {} if server.fused_topk is None else {"fused_topk": server.fused_topk}
    if server.budget_schedule:
        sp["budget_schedule"] = [{"min_batch": m, "budget": b} for m, b in server.budget_schedule]
    out = model_overrides(config, models, server.budget, server.topk_cap, sp or None)
    out["serving"] = {"port": port, "nccl_port": port + 1, "mem_fraction_static": MEM_FRACTION,
                      "max_running_requests": server.max_running, "extra_args": extra, "forking_memory_gib": None}
    if server.tp_size > 1:
        out["serving"].update(tp_size=server.tp_size, gpus=list(range(server.tp_size)),
                              env={**config.serving.env, **NO_MULTICAST_ENV})
    return out


def harness_config(server: Server, port: int, models: str = MODELS) -> spec.Config:
    """The server's config with the harness's overrides, validated by the project's own checks."""
    path = spec.resolve(server.config)
    base = spec.load(path)
    merged = spec.deep_merge(spec.load_merged(path, path.parent), _overrides(server, base, port, models))
    return spec.validate(merged, path, f"e2e-{server.name}")


def server_entry(server: Server, index: int, models: str = MODELS) -> dict:
    port = BASE_PORT + PORT_STEP * index
    config = harness_config(server, port, models)
    host = render.HostSettings(release_label="e2e", bind_address="127.0.0.1")
    args = render.launch_args(config, host)
    features = tuple(server.features) if server.features is not None else config.patch_features
    env = {**config.serving.env, **dict(server.env)}
    if config.serving.tp_size > 1:  # the runner passes env to the server: both GPUs, as a unit's Environment= does
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in config.serving.gpus)
    return {
        "name": server.name, "config": server.config, "role": server.role, "port": port,
        "algorithm": config.speculative.algorithm, "budget": config.speculative.budget,
        "topk_cap": config.speculative.topk_cap, "state_forking": config.speculative.state_forking,
        "features": list(features), "wheel": wheel_key(features), "tags": list(server.tags),
        "variant": list(server.variant), "args": args, "env": env, "tp_size": config.serving.tp_size,
        "gates": config.gates.as_mapping(), "speculative": config.speculative_enabled,
    }


def wheel_key(features: tuple[str, ...] | list[str]) -> str:
    """The release folder name for a feature set: ``stock`` or the features joined by '-'."""
    return "-".join(features) if features else "stock"


def build(set_name: str = "core") -> dict:
    if set_name not in SETS:
        raise SystemExit(f"--set {set_name!r}: allowed: {', '.join(SETS)}")
    models = models_for(set_name)
    servers = [server_entry(s, i, models) for i, s in enumerate(SETS[set_name])]
    learned = models == LEARNED
    return {"set": set_name, "servers": servers, "wheels": sorted({s["wheel"] for s in servers}),
            "models": models, "learned": learned, "prompts": f"{models}/prompts.json" if learned else None,
            "max_new": 128 if learned else 64, "harness_args": list(HARNESS_ARGS),
            "batches": list(BATCHES) if set_name in ("schedule", "derive") else None,
            "derive": dict(DERIVE_PLAN) if set_name == "derive" else None,
            "schedule": dict(SCHEDULE_PLAN) if set_name == "schedule" else None}


def models_for(set_name: str) -> str:
    """The model folder a set's servers load: the trained pair, except the sets of TINY_SETS."""
    return MODELS if set_name in TINY_SETS else LEARNED


def all_wheels() -> dict[str, list[str]]:
    """Every feature set any plan needs: {wheel key: features}."""
    out = {}
    for name in SETS:
        for s in build(name)["servers"]:
            out[s["wheel"]] = s["features"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="core", help=f"which servers: {', '.join(SETS)}")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    try:
        plan = build(args.set)
    except spec.ConfigError as err:
        print(f"plan: {err}", file=sys.stderr)
        return 2
    text = json.dumps(plan, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
