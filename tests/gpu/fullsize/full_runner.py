"""The full-size step-cost run on the GPU machine (issue 23; run.sh calls it).

    python tests/gpu/fullsize/full_runner.py --plan .gpu-e2e/plan-fullsize.json --out $OUT --deadline EPOCH

Servers run in waves (waves.py: in plan order, as many as the GPUs' memory holds by the plan's
prediction, one GPU each through CUDA_VISIBLE_DEVICES; two on one GPU start one after the other). A wave
starts only if its estimated time fits before the deadline. Per server, after a warm-up:

- **step time**: ``RUNS`` runs at each batch size (1 and 8, or the largest the server's memory allows) of
  ``batch`` concurrent requests, ``PROMPT_LEN`` random token ids, ``MAX_NEW`` new tokens, greedy,
  ``ignore_eos``. The step time is the server's own: with ``SGLANG_RECORD_STEP_TIME=1`` and
  ``--decode-log-interval 1`` the scheduler appends, after every decode step, the wall time since the
  previous decode step to ``step_time_dict[running requests]`` (``/get_server_info``); the samples of a
  run at the run's batch size are the diff of that list before and after the run. Reported: the median
  over all steps of all runs, each run's median, and the per-request cross-check ``(e2e_latency) /
  spec_verify_ct`` (or / output tokens for AR) from ``meta_info``;
- **memory**: the server log's ``Mamba Cache is allocated`` line (intermediate SSM states and conv windows,
  GB = GiB) against the plan's ``sgdeploy.budget`` prediction, the weight and KV lines, the CUDA graphs' capture
  lines (SGLang's ``Capture ... CUDA graph end`` and patch 0005's ``DDTREE schedule:`` lines: the verify
  graphs at the other scheduled widths, what they cost, or that those widths verify eagerly), and the GPU's
  used memory (nvidia-smi) once serving;
- tag ``profile``: SGLang's ``/start_profile`` (CPU + GPU) over ``PROFILE_STEPS`` decode steps of a batch-1
  run, the trace copied to ``OUT/traces/<server>.trace.json.gz`` (breakdown.py parses it, here if time is
  left and on the CPU afterwards); the hook (hook/) names the DDTree step's parts as profiler ranges.

Writes ``OUT/results.json`` after every server (a time-out keeps what ran), ``OUT/summary.txt``,
``OUT/logs.tar.xz``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "e2e"))
sys.path.insert(0, str(REPO))
# sgdeploy imports the sgdeploy.host collection's module_utils as the installed package does; run from a
# checkout without the package (the GPU machine's python3), they come from collections/ (pyproject.toml).
sys.path.insert(0, str(REPO / "collections"))

import breakdown  # noqa: E402
import runner as e2e_runner  # noqa: E402  (tests/gpu/e2e/runner.py: ServerProc, http)
import waves  # noqa: E402

E2E_ROOT = e2e_runner.ROOT  # /tmp/gpu-e2e: releases, site, caches (e2e run.sh / fullsize run.sh)
ROOT = E2E_ROOT / "fullsize"  # full_plan.DEVICE_ROOT
MASK_TOKEN_ID = 248_077  # models.MASK_TOKEN_ID: prompts stay below it
PROMPT_LEN, MAX_NEW, RUNS, PROFILE_STEPS = 256, 128, 3, 12
POLL_S, TRACE_SETTLE_S = 2.0, 3.0  # start polling; wait after a trace file appears (still being written)
SEED = 2026
GIB = 1 << 30
_lock = threading.Lock()
T0 = time.time()


def say(*parts) -> None:
    with _lock:
        print(f"[t+{time.time() - T0:5.0f}s]", *parts, flush=True)


def prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(1, MASK_TOKEN_ID - 1) for _ in range(PROMPT_LEN)]


def gpus() -> list[dict]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout
    rows = []
    for line in out.strip().splitlines():
        i, total, used = (x.strip() for x in line.split(","))
        rows.append({"index": int(i), "total_mib": int(total), "used_mib": int(used)})
    return rows


class Server(e2e_runner.ServerProc):
    """The e2e harness's server process, on one GPU, with this run's folders."""

    def __init__(self, entry: dict, releases: Path, site: str, gpu: int):
        super().__init__(entry, releases, site)
        self.gpu = gpu
        self.log_path = ROOT / "logs" / f"{self.name}.log"
        self.profile_dir = ROOT / "profile" / self.name
        self.env["PYTHONPATH"] = self.env["PYTHONPATH"].replace(str(HERE.parent / "e2e" / "hook"), str(HERE / "hook"))
        self.env.update(CUDA_VISIBLE_DEVICES=str(gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID",  # nvidia-smi's indices
                        SGLANG_TORCH_PROFILER_DIR=str(self.profile_dir),
                        SGDEPLOY_FULL_HOOK="1", SGDEPLOY_E2E_HOOK="1", OMP_NUM_THREADS="4",
                        TRITON_CACHE_DIR=str(E2E_ROOT / "triton-cache"), SGLANG_JIT_CACHE_DIR=str(E2E_ROOT / "jit-cache"))

    def set_mem_fraction(self, free_bytes: float) -> float:
        p = self.entry["predicted_bytes"]
        static = p["total"] - p["reserve"]
        frac = round(min(0.95, max(0.3, (static + 2 * GIB) / max(free_bytes, 1))), 3)
        args = list(self.entry["args"])
        args[args.index("--mem-fraction-static") + 1] = str(frac)
        self.entry = {**self.entry, "args": args}
        return frac


def generate(port: int, ids: list[int], max_new: int) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}}
    t = time.time()
    r = e2e_runner.http(port, "/generate", body, 300)
    meta = r.get("meta_info", {}) if isinstance(r, dict) else {}
    return {"wall_s": round(time.time() - t, 4), "completion_tokens": meta.get("completion_tokens"),
            "e2e_latency": meta.get("e2e_latency"), "verify_ct": meta.get("spec_verify_ct"),
            "accept_length": meta.get("spec_accept_length"), "decode_throughput": meta.get("decode_throughput")}


def step_times(port: int) -> dict[str, list[float]]:
    info = e2e_runner.http(port, "/server_info", None, 30)
    states = info.get("internal_states") or [{}] if isinstance(info, dict) else [{}]
    d = (states[0] or {}).get("step_time_dict") or {}
    return {str(k): list(v) for k, v in d.items()}


def run_batch(port: int, batch: int, rng: random.Random) -> dict:
    before = step_times(port)
    ps = [prompt(rng) for _ in range(batch)]
    out: list = [None] * batch

    def one(i):
        try:
            out[i] = generate(port, ps[i], MAX_NEW)
        except Exception as err:  # noqa: BLE001
            out[i] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = step_times(port)
    key = str(batch)
    samples = after.get(key, [])[len(before.get(key, [])):]
    return {"batch": batch, "requests": out, "step_s": samples}


def per_request_step_s(req: dict, algorithm: str) -> float | None:
    lat, n = req.get("e2e_latency"), req.get("verify_ct") if algorithm != "NONE" else req.get("completion_tokens")
    return lat / n if lat and n else None


def summarise_batch(runs: list[dict], algorithm: str) -> dict:
    steps = [s for r in runs for s in r["step_s"]]
    reqs = [q for r in runs for q in r["requests"] if q and "error" not in q]
    acc = [q["accept_length"] for q in reqs if q.get("accept_length")]
    cross = [x for x in (per_request_step_s(q, algorithm) for q in reqs) if x]
    return {
        "steps": len(steps), "step_ms_median": round(1e3 * statistics.median(steps), 4) if steps else None,
        "step_ms_p10_p90": ([round(1e3 * x, 4) for x in statistics.quantiles(steps, n=10)[::8]]
                            if len(steps) >= 10 else None),
        "run_medians_ms": [round(1e3 * statistics.median(r["step_s"]), 4) for r in runs if r["step_s"]],
        "request_step_ms_median": round(1e3 * statistics.median(cross), 4) if cross else None,
        "accept_length_mean": round(sum(acc) / len(acc), 4) if acc else None,
        "errors": [q["error"] for r in runs for q in r["requests"] if q and "error" in q][:3],
    }


MEM_PATTERNS = {
    "intermediate_ssm_gib": r"intermediate_ssm_state_cache size: ([\d.]+)GB",
    "intermediate_conv_gib": r"intermediate_conv_window_cache size: ([\d.]+)GB",
    "ssm_state_gib": r"ssm_state size: ([\d.]+)GB",
    "conv_state_gib": r"conv_state size: ([\d.]+)GB",
}


# SGLang 0.5.23's cuda_graph_setup: "Capture target verify CUDA graph end. bs=[1, 6, 8], elapsed=9.87 s, mem
# usage=1.23 GB, avail mem=30.00 GB." (role target/draft, verify/decode; GB = GiB, get_available_gpu_memory).
GRAPH_END = re.compile(r"Capture (\w+ \w+) CUDA graph end\..*?mem usage=([\d.]+) GB")
# Patch 0005's ddtree_graphs.install: "DDTREE schedule: target verify graphs at widths [16, 33] (bs [1, 6, 8]),
# the extra ones in 3.2 s, 0.53 GiB." ("?" GiB where the free memory could not be read).
SCHEDULE_GRAPHS = re.compile(r"DDTREE schedule: target verify graphs at widths \[([\d, ]*)\] \(bs (.*?)\), "
                             r"the extra ones in ([\d.]+) s, ([\d.]+|\?) GiB")


def graphs_from_log(text: str) -> dict:
    """The CUDA graphs' memory from the server log: per captured kind (``target verify``, ...) the last
    capture's GiB, and patch 0005's extra per-width capture (widths, seconds, GiB) or the line saying the
    other scheduled widths verify eagerly. Empty where the log has none of them."""
    out: dict = {}
    captures = {kind: float(gib) for kind, gib in GRAPH_END.findall(text)}
    if captures:
        out["capture_gib"] = captures
    found = SCHEDULE_GRAPHS.findall(text)
    if found:
        widths, bs, secs, gib = found[-1]
        out["schedule_graphs"] = {"widths": [int(w) for w in widths.replace(" ", "").split(",") if w],
                                  "bs": bs, "extra_s": float(secs), "extra_gib": None if gib == "?" else float(gib)}
    eager = [ln.strip()[-400:] for ln in text.splitlines() if "DDTREE schedule:" in ln and "eagerly" in ln]
    if eager:
        out["schedule_eager"] = eager[-1]
    return out


def memory_from_log(text: str) -> dict:
    out: dict = {}
    for key, pat in MEM_PATTERNS.items():
        vals = [float(x) for x in re.findall(pat, text)]
        if vals:  # the target's pool is the one with intermediate buffers; the last line of each wins
            out[key] = vals[-1]
    if "intermediate_ssm_gib" in out:
        out["forking_gib"] = round(out["intermediate_ssm_gib"] + out.get("intermediate_conv_gib", 0.0), 3)
    out["lines"] = [ln.strip()[-400:] for ln in text.splitlines()
                    if "Mamba Cache is allocated" in ln or "Load weight end" in ln or "KV Cache is allocated" in ln][:6]
    graphs = graphs_from_log(text)
    if graphs:
        out["graphs"] = graphs
        out["graph_lines"] = [ln.strip()[-400:] for ln in text.splitlines()
                              if "CUDA graph end" in ln or "DDTREE schedule:" in ln][:8]
    return out


def profile(server: Server, rng: random.Random) -> dict:
    port = server.port
    try:
        e2e_runner.http(port, "/start_profile", {"output_dir": str(server.profile_dir), "num_steps": PROFILE_STEPS,
                                                 "activities": ["CPU", "GPU"]}, 60)
        run_batch(port, 1, rng)
        traces: list[str] = []
        for i in range(40):
            if i == 10:
                try:
                    e2e_runner.http(port, "/stop_profile", {}, 60)
                except Exception:  # noqa: BLE001 - already stopped
                    pass
            traces = glob.glob(str(server.profile_dir / "**" / "*.trace.json*"), recursive=True)
            if traces:
                time.sleep(TRACE_SETTLE_S)
                break
            time.sleep(POLL_S / 2)
        if not traces:
            return {"error": "no trace file written"}
        return {"trace": sorted(traces)[-1]}
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {str(err)[:300]}"}


def measure(server: Server, deadline: float) -> dict:
    e = server.entry
    rng = random.Random(SEED)
    res: dict = {"gpu": server.gpu}
    generate(server.port, prompt(rng), 32)  # warm-up
    run_batch(server.port, max(e["batches"]), rng)
    for b in e["batches"]:
        runs = []
        for _ in range(RUNS):
            if time.time() > deadline - 20:
                break
            runs.append(run_batch(server.port, b, rng))
        res[f"batch_{b}"] = summarise_batch(runs, e["algorithm"]) if runs else {"skipped": "deadline"}
        res[f"batch_{b}_raw_step_s"] = [r["step_s"] for r in runs]
    res["gpu_used_mib"] = next((g["used_mib"] for g in gpus() if g["index"] == server.gpu), None)
    if "profile" in e["tags"] and time.time() < deadline - 40:
        res["profile"] = profile(server, rng)
    return res


def stop_wave(servers: list[Server]) -> None:
    for s in servers:
        s.stop()


def wait_released(baseline: dict[int, int], timeout: float = 40.0) -> dict:
    """Wait until every GPU's used memory is back within 2 GiB of what it was before the first wave (a stopped
    server's memory is freed a little after its process exits; the next server sizes its pools from the free
    memory at its start). Returns the used MiB per GPU at the end."""
    end = time.time() + timeout
    while True:
        used = {g["index"]: g["used_mib"] for g in gpus()}
        if all(used.get(i, 0) <= base + 2048 for i, base in baseline.items()) or time.time() > end:
            return used
        time.sleep(POLL_S / 2)


def start_wave(wave: list[Server], results: dict, deadline: float, serve_margin: float) -> list[Server]:
    """Start the wave's servers (a second server on a GPU waits until the first serves); wait until all serve."""
    started: dict[int, Server] = {}
    waiting = list(wave)
    pending: list[Server] = []
    while (waiting or pending) and time.time() < deadline - serve_margin:
        for s in list(waiting):
            first = started.get(s.gpu)
            if first is None or first.status != "starting":
                free = next((g["total_mib"] - g["used_mib"] for g in gpus() if g["index"] == s.gpu), 0) * (1 << 20)
                frac = s.set_mem_fraction(free)
                s.start()
                started.setdefault(s.gpu, s)
                results[s.name].update(status="starting", gpu=s.gpu, mem_fraction_static=frac, args=s.entry["args"])
                waiting.remove(s)
                pending.append(s)
        for s in list(pending):
            st = s.poll()
            if st != "starting":
                pending.remove(s)
                results[s.name].update(status=st, startup_s=s.startup_s())
                if st != "serving":
                    results[s.name]["log_errors"] = s.errors()
                say(s.name, st, s.startup_s())
        time.sleep(POLL_S)
    for s in pending + waiting:
        results[s.name].update(status="not serving by the deadline", log_errors=s.errors())
    return [s for s in wave if s.status == "serving"]


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - the harness run in order, one step a block
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--deadline", required=True, type=float, help="epoch seconds: everything done by then")
    ap.add_argument("--releases", type=Path, default=E2E_ROOT / "releases")
    ap.add_argument("--site", default=str(E2E_ROOT / "site"))
    ap.add_argument("--only", help="comma-separated server names, in plan order (default: all)")
    ap.add_argument("--start-estimate", type=float, default=170.0,
                    help="seconds a wave's start takes on a cold Triton cache (later waves: at most the "
                         "slowest start of the wave before + 10 s)")
    ap.add_argument("--measure-estimate", type=float, default=60.0,
                    help="seconds the measurements of one server take (runs, profile, trace export)")
    ap.add_argument("--serve-margin", type=float, default=60.0,
                    help="seconds before the deadline by which a server must serve")
    args = ap.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    entries = plan["servers"]
    if args.only:
        keep = args.only.split(",")
        entries = [e for e in entries if e["name"] in keep]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "traces").mkdir(exist_ok=True)
    devs = gpus()
    baseline = {g["index"]: g["used_mib"] for g in devs}
    total = min(g["total_mib"] for g in devs) * (1 << 20)
    plan_waves = waves.waves(entries, len(devs), total)
    results: dict = {"plan": "fullsize", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "gpus": devs, "prompt_len": PROMPT_LEN, "max_new": MAX_NEW, "runs": RUNS,
                     "waves": [[(e["name"], g) for e, g in w] for w in plan_waves],
                     "measured": "scheduler step_time_dict (SGLANG_RECORD_STEP_TIME, --decode-log-interval 1)"}
    for e in entries:
        results[e["name"]] = {"status": "not started", "predicted_bytes": e["predicted_bytes"],
                              "max_running": e["max_running"], "batches": e["batches"], "budget": e.get("budget"),
                              "budget_schedule": e.get("budget_schedule")}

    def save() -> None:
        tmp = args.out / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1, default=str))
        os.replace(tmp, args.out / "results.json")

    save()
    all_servers: list[Server] = []
    try:
        start_estimate = args.start_estimate
        for n, wave in enumerate(plan_waves):
            estimate = start_estimate + args.measure_estimate * max(
                sum(1 for _, g in wave if g == gpu) for gpu in {g for _, g in wave})
            if time.time() + estimate > args.deadline:
                for e, _ in wave:
                    results[e["name"]]["status"] = f"skipped: wave {n} needs about {estimate:.0f} s, not left"
                say(f"wave {n} skipped ({estimate:.0f} s needed)")
                continue
            servers = [Server(e, args.releases, args.site, g) for e, g in wave]
            all_servers += servers
            say(f"wave {n}: {[s.name for s in servers]}")
            live = start_wave(servers, results, args.deadline, args.serve_margin)
            starts = [s.startup_s() for s in live if s.startup_s()]
            if starts:  # the next wave starts on a warmer Triton cache: no slower than this one
                start_estimate = min(start_estimate, max(starts) + 10)
            save()
            threads = []

            def work(s: Server):
                try:
                    results[s.name]["measure"] = measure(s, args.deadline)
                except Exception as err:  # noqa: BLE001
                    results[s.name]["measure_error"] = f"{type(err).__name__}: {str(err)[:400]}"
                    results[s.name]["log_errors"] = s.errors()
                try:
                    results[s.name]["memory"] = memory_from_log(s.log_path.read_text(errors="replace"))
                except OSError:
                    pass
                say(s.name, "measured")

            for s in live:
                threads.append(threading.Thread(target=work, args=(s,)))
                threads[-1].start()
            for t in threads:
                t.join()
            stop_wave(servers)
            results.setdefault("released_mib", []).append(wait_released(baseline))
            for s in live:
                prof = (results[s.name].get("measure") or {}).get("profile") or {}
                if prof.get("trace"):
                    dest = args.out / "traces" / f"{s.name}.trace.json.gz"
                    src = Path(prof["trace"])
                    if src.suffix == ".gz":
                        shutil.copy(src, dest)
                    else:
                        import gzip

                        with open(src, "rb") as f, gzip.open(dest, "wb") as g:
                            shutil.copyfileobj(f, g)
                    prof["copied"] = str(dest.relative_to(args.out))
            save()
        for s in all_servers:  # parse the traces if time is left (breakdown.py also runs on the CPU later)
            prof = (results[s.name].get("measure") or {}).get("profile") or {}
            if prof.get("copied") and time.time() < args.deadline - 15:
                try:
                    prof["breakdown"] = breakdown.summarise(breakdown.load(args.out / prof["copied"]))
                except Exception as err:  # noqa: BLE001
                    prof["breakdown_error"] = f"{type(err).__name__}: {str(err)[:300]}"
                save()
    finally:
        stop_wave(all_servers)
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save()
        lines = summary_lines(results, entries)
        (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
        with tarfile.open(args.out / "logs.tar.xz", "w:xz") as tar:
            for s in all_servers:
                if s.log_path.exists():
                    tar.add(s.log_path, arcname=s.log_path.name)
    return 0


def summary_lines(results: dict, entries: list[dict]) -> list[str]:
    lines = []
    for e in entries:
        r = results.get(e["name"], {})
        m = r.get("measure") or {}
        parts = [f"{e['name']:<22}", str(r.get("status")), f"start {r.get('startup_s')} s", f"gpu {r.get('gpu')}"]
        for b in e["batches"]:
            x = m.get(f"batch_{b}") or {}
            if x.get("step_ms_median") is not None:
                parts.append(f"b{b} step {x['step_ms_median']} ms ({x['steps']} steps, runs {x['run_medians_ms']})")
        mem = r.get("memory") or {}
        if "forking_gib" in mem:
            parts.append(f"buffers {mem['forking_gib']} GiB (predicted {e['predicted_forking_gib']})")
        extra = (mem.get("graphs") or {}).get("schedule_graphs")
        if extra:
            parts.append(f"graphs at widths {extra['widths']}: extra {extra['extra_gib']} GiB in {extra['extra_s']} s")
        elif (mem.get("graphs") or {}).get("schedule_eager"):
            parts.append("other scheduled widths verify eagerly")
        lines.append(" | ".join(parts))
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
