"""Start the plan's servers at once on the GPU and run the experiments against them (GPU machine; run.sh calls it).

    python tests/gpu/e2e/runner.py --plan .gpu-e2e/plan-core.json --out $OUT --deadline EPOCH

Every server is ``python -m sglang.launch_server`` with the flags plan.py rendered, in its own process
group, its output in ``/tmp/gpu-e2e/logs/<name>.log``. Experiments (each server in its own thread, each
with 8 requests in flight; the servers have ``--max-running-requests 8``):

- greedy: ``PROMPTS`` x ``MAX_NEW`` tokens as token ids; AR servers return their top log-probs; the
  accepted-path log is on (e2e_hook);
- losslessness against the ``ar`` server by the near-tie rule (stats.compare_greedy), and every token
  of every candidate output against one AR prefill of prompt + output (stats.teacher_forced);
- tag ``sampling``: temperature 1 requests, accept length; tag ``logprobs``: greedy with log-probs in
  DDTree mode (same tokens as without, log-probs against AR's); tag ``profile``: SGLang's
  ``/start_profile`` over a few batched decode steps, then trace_check (path log off);
- role ``gate``: the project's own gates (``sgdeploy.gate.run_all``) on text, after the deploy's warm-up.

Writes ``OUT/results.json`` (everything), ``OUT/summary.txt`` and ``OUT/logs.tar.xz``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
# sgdeploy imports the sgdeploy.host collection's module_utils as the installed package does; run from a
# checkout without the package (the GPU machine's python3), they come from collections/ (pyproject.toml).
sys.path.insert(0, str(REPO / "collections"))

import derive  # noqa: E402
import e2e_stats as stats  # noqa: E402
import paired  # noqa: E402
import sched_compare  # noqa: E402
import trace_check  # noqa: E402

ROOT = Path("/tmp/gpu-e2e")
PROMPTS, MAX_NEW, CONCURRENCY, TOP_N = 64, 64, 8, 4
SAMPLED_PROMPTS, LOGPROB_PROMPTS = 16, 16
VOCAB = 16
SEED = 2026

_print_lock = threading.Lock()
T0 = time.time()


def say(*parts) -> None:
    with _print_lock:
        print(f"[t+{time.time() - T0:5.0f}s]", *parts, flush=True)


KINDS: list[str] = []  # the kind of each prompt (learned sets: code / prose), empty for the tiny models
TEXTS: list[str] = []


def prompts(n: int = PROMPTS, seed: int = SEED) -> list[list[int]]:
    """Token-id prompts: ids 1 .. VOCAB - 2 (0 is EOS, VOCAB - 1 the drafter's mask token)."""
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB - 1) for _ in range(rng.randrange(4, 13))] for _ in range(n)]


def use_plan(plan: dict) -> list[list[int]]:
    """The plan's prompts: the trained pair's held-out prompts (prompts.json, code and prose) or random tiny ids;
    sets MAX_NEW, VOCAB, KINDS and TEXTS to match."""
    global MAX_NEW, VOCAB, KINDS, TEXTS
    MAX_NEW = int(plan.get("max_new") or MAX_NEW)
    if not plan.get("prompts"):
        return prompts()
    data = json.loads(Path(plan["prompts"]).read_text())
    VOCAB = int(data["vocab"])
    KINDS = [p["kind"] for p in data["prompts"]]
    TEXTS = [p["text"] for p in data["prompts"]]
    return [list(p["ids"]) for p in data["prompts"]]


def http(port: int, path: str, body: dict | None = None, timeout: float = 120.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


# --- servers ------------------------------------------------------------------------------------------------

class ServerProc:
    def __init__(self, entry: dict, releases: Path, site: str):
        self.entry, self.name, self.port = entry, entry["name"], entry["port"]
        self.log_path = ROOT / "logs" / f"{self.name}.log"
        self.path_log = ROOT / "paths" / self.name
        self.profile_dir = ROOT / "profile" / self.name
        self.release = releases / entry["wheel"]
        spec = entry["algorithm"] != "NONE"
        pp = [str(self.release), site, str(HERE / "hook")]
        if spec:
            pp.append(str(ROOT / "fi-standin"))
        self.env = dict(os.environ)
        self.env.update(entry.get("env") or {})
        self.env.update(
            PYTHONPATH=":".join(pp), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
            SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK="1", TVM_FFI_DISABLE_TORCH_C_DLPACK="1",
            SGLANG_JIT_CACHE_DIR=str(ROOT / "jit-cache"), TRITON_CACHE_DIR=str(ROOT / "triton-cache"),
            SGLANG_TORCH_PROFILER_DIR=str(self.profile_dir), SGDEPLOY_E2E_HOOK="1",
            SGDEPLOY_E2E_PATH_LOG=str(self.path_log), OMP_NUM_THREADS="2")
        if spec:
            self.env["SGLANG_IS_FLASHINFER_AVAILABLE"] = "false"
        self.proc: subprocess.Popen | None = None
        self.started = self.ready_at = None
        self.status = "not started"

    def start(self) -> None:
        for d in (self.log_path.parent, self.path_log, self.profile_dir):
            d.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "sglang.launch_server", *self.entry["args"]]
        self.log = open(self.log_path, "w")
        self.log.write("$ " + " ".join(argv) + "\n")
        self.log.flush()
        self.started = time.time()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        self.status = "starting"

    def poll(self) -> str:
        if self.status == "starting":
            if self.proc.poll() is not None:
                self.status = f"exited {self.proc.returncode} before serving"
            elif healthy(self.port):
                self.status, self.ready_at = "serving", time.time()
        return self.status

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()

    def errors(self, n: int = 12) -> list[str]:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        keys = ("Error", "error", "Traceback", "raise ", "assert", "Exception", "Killed", "undefined")
        hits = [ln for ln in lines if any(k in ln for k in keys)]
        return (hits or lines)[-n:]

    def startup_s(self) -> float | None:
        return None if self.ready_at is None else round(self.ready_at - self.started, 1)


# --- requests ------------------------------------------------------------------------------------------------

def generate(port: int, ids: list[int], max_new: int = MAX_NEW, temperature: float = 0.0, logprobs: bool = False,
             timeout: float = 180.0) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": temperature, "max_new_tokens": max_new,
                                                  "ignore_eos": True}}
    if temperature > 0:
        body["sampling_params"].update(top_p=1.0, top_k=-1)
    if logprobs:
        body.update(return_logprob=True, top_logprobs_num=TOP_N, logprob_start_len=len(ids))
    t = time.time()
    r = http(port, "/generate", body, timeout)
    meta = r.get("meta_info", {})
    out = {"ids": r.get("output_ids"), "s": round(time.time() - t, 3),
           "accept_length": meta.get("spec_accept_length"), "verify_ct": meta.get("spec_verify_ct"),
           "hist": meta.get("spec_correct_drafts_histogram"), "completion_tokens": meta.get("completion_tokens")}
    if logprobs:
        out["top"] = [[[e[0], e[1]] for e in (step or [])] for step in (meta.get("output_top_logprobs") or [])]
        out["lp"] = [e[0] for e in (meta.get("output_token_logprobs") or [])]
    return out


def score_prefix(port: int, prompt: list[int], output: list[int]) -> list:
    """AR top log-probs at every output position of prompt + output (one prefill)."""
    body = {"input_ids": prompt + output, "sampling_params": {"temperature": 0.0, "max_new_tokens": 2},
            "return_logprob": True, "top_logprobs_num": TOP_N, "logprob_start_len": len(prompt)}
    meta = http(port, "/generate", body, 180.0).get("meta_info", {})
    return [[[e[0], e[1]] for e in (step or []) if e is not None] for step in (meta.get("input_top_logprobs") or [])]


def run_batch(port: int, jobs: list, fn, concurrency: int = CONCURRENCY) -> list:
    with cf.ThreadPoolExecutor(concurrency) as pool:
        futs = [pool.submit(fn, port, *j) for j in jobs]
        out = []
        for f in futs:
            try:
                out.append(f.result())
            except Exception as err:  # noqa: BLE001
                out.append({"error": f"{type(err).__name__}: {str(err)[:300]}"})
        return out


def path_rows(server: ServerProc) -> tuple[list, dict, list]:
    rows, batch_sizes, errors = [], {}, []
    for f in glob.glob(str(server.path_log / "paths-*.jsonl")):
        for line in open(f):
            rec = json.loads(line)
            if "error" in rec:
                errors.append(rec["error"])
                continue
            rows.extend(rec["rows"])
            bs = str(len(rec["rows"]))
            batch_sizes[bs] = batch_sizes.get(bs, 0) + 1
    return rows, dict(sorted(batch_sizes.items(), key=lambda kv: int(kv[0]))), errors


def watch_check(server: ServerProc, run) -> tuple[list, dict]:
    """Issue 36 item 6: the post-deploy watch's reading of this server's real ``/metrics`` around ``run()``
    (the greedy batch), against the requests' own numbers. The counters are read with the watch's own code
    (``module_utils/sglang_watch.read``) just before and just after the batch (every request of it ended in
    between, none other ran), and ``sglang_watch.watch`` runs beside the batch in a thread with 5-second
    intervals. Returns (the batch's outputs, the comparison)."""
    from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_watch as sw

    url = f"http://127.0.0.1:{server.port}"
    live: dict = {}

    def watching() -> None:
        try:
            live.update(sw.watch(url, window_s=20, interval_s=5, failure_limit=3,
                                 th=sw.Thresholds(min_requests=1, min_accept_length=1.0)))
        except Exception as err:  # noqa: BLE001
            live["error"] = f"{type(err).__name__}: {str(err)[:300]}"

    before = sw.read(url)
    thread = threading.Thread(target=watching, daemon=True)
    thread.start()
    outs = run()
    after = sw.read(url)
    thread.join(timeout=30)
    interval = sw.judge_interval(1, before, after, 1.0, sw.Thresholds(min_requests=1))
    ok = [o for o in outs if "error" not in o]
    tokens = sum(int(o.get("completion_tokens") or 0) for o in ok)
    verify = sum(int(o.get("verify_ct") or 0) for o in ok)
    per_req = [float(o["accept_length"]) for o in ok if o.get("accept_length")]
    check = {
        "requests": len(outs), "errors": len(outs) - len(ok),
        "metrics": {"finished": interval["finished"], "aborted": interval["aborted"],
                    "generation_tokens": interval["generation_tokens"], "verify_calls": interval["verify_calls"],
                    "accept_length": interval["accept_length"]},
        "meta_info": {"completion_tokens": tokens, "spec_verify_ct": verify,
                      "accept_length": round(tokens / verify, 3) if verify else None,
                      "mean_of_spec_accept_length": round(sum(per_req) / len(per_req), 3) if per_req else None},
        "live_watch": {k: live.get(k) for k in ("result", "line", "intervals", "error")},
    }
    check["counters_equal"] = (interval["finished"] == len(ok) and interval["generation_tokens"] == tokens
                               and interval["verify_calls"] == verify)
    return outs, check


def experiment(server: ServerProc, ps: list[list[int]], deadline: float) -> dict:
    e, port = server.entry, server.port
    res: dict = {}
    is_ar = e["algorithm"] == "NONE"
    (server.path_log / "on").touch()
    t = time.time()
    jobs = [(p, MAX_NEW, 0.0, is_ar) for p in ps]
    if "watch" in e["tags"]:
        try:
            res["greedy"], res["watch_check"] = watch_check(server, lambda: run_batch(port, jobs, generate))
        except Exception as err:  # noqa: BLE001
            res["watch_check"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    if "greedy" not in res:
        res["greedy"] = run_batch(port, jobs, generate)
    res["greedy_wall_s"] = round(time.time() - t, 2)
    (server.path_log / "on").unlink(missing_ok=True)
    say(server.name, f"greedy done in {res['greedy_wall_s']} s")
    tags = e["tags"]
    if "sampling" in tags and time.time() < deadline - 60:
        samp = run_batch(port, [(p, MAX_NEW, 1.0, False) for p in ps[:SAMPLED_PROMPTS]], generate)
        acc = [s["accept_length"] for s in samp if s.get("accept_length")]
        res["sampling"] = {"requests": len(samp), "errors": [s["error"] for s in samp if "error" in s],
                           "accept_length_mean": round(sum(acc) / len(acc), 4) if acc else None,
                           "hist": stats.merge_histograms(s.get("hist") for s in samp),
                           "tokens_valid": all(all(0 <= t < VOCAB for t in (s.get("ids") or [])) for s in samp)}
    if "logprobs" in tags and time.time() < deadline - 60:
        res["logprobs"] = run_batch(port, [(p, MAX_NEW, 0.0, True) for p in ps[:LOGPROB_PROMPTS]], generate)
    if "profile" in tags and time.time() < deadline - 90:
        res["profile"] = profile(server, ps)
    return res


def profile(server: ServerProc, ps: list[list[int]]) -> dict:
    port = server.port
    try:
        http(port, "/start_profile", {"output_dir": str(server.profile_dir), "num_steps": 10,
                                      "activities": ["CPU", "GPU"]}, 60)
        run_batch(port, [(p, MAX_NEW, 0.0, False) for p in ps[:CONCURRENCY]], generate)
        traces: list[str] = []
        for i in range(40):
            if i == 15:  # fewer steps than num_steps ran: stop it by hand
                try:
                    http(port, "/stop_profile", {}, 60)
                except Exception:  # noqa: BLE001 - already stopped
                    pass
            traces = glob.glob(str(server.profile_dir / "**" / "*.trace.json*"), recursive=True)
            if traces:
                time.sleep(3)
                break
            time.sleep(1)
        if not traces:
            return {"error": "no trace file written",
                    "files": sorted(str(p.relative_to(server.profile_dir)) for p in server.profile_dir.rglob("*"))[:20]}
        for _ in range(10):
            try:
                trace = trace_check.load_trace(sorted(traces)[-1])
                break
            except (OSError, EOFError, ValueError):  # still being written
                time.sleep(2)
        out = trace_check.check(trace)
        out["trace"] = os.path.basename(sorted(traces)[-1])
        return out
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {str(err)[:300]}"}


SINGLE = "single pass, not a comparison"


def timing(server: ServerProc, ps: list[list[int]]) -> dict:
    """Speed with this server alone on the GPU (the others idle), one pass (``SINGLE``: its own numbers; servers
    are compared only in paired rounds, ``paired_rounds``): batch 1 (requests one after another) and batch 8
    (8 in flight), MAX_NEW greedy tokens each, wall-clock (CUDA graphs replay inside the server; the host loop is in
    the time). Step time at batch 1: the request's time over its verify steps (AR: over its tokens)."""
    port = server.port
    pick = ps[:2] + ps[-2:] if len(ps) >= 4 else ps
    out: dict = {}
    try:
        generate(port, ps[0], 8)  # one short request first: nothing of the timing is a first call
        one = [generate(port, p, MAX_NEW) for p in pick]
        toks = sum(len(r.get("ids") or []) for r in one)
        wall = sum(r["s"] for r in one)
        steps = [r["s"] / (r.get("verify_ct") or len(r.get("ids") or []) or 1) for r in one]
        out["batch1"] = {"requests": len(one), "tokens": toks, "wall_s": round(wall, 3),
                         "tokens_per_s": round(toks / wall, 1) if wall else None,
                         "step_ms": round(1000 * sum(steps) / len(steps), 3)}
        many = ps[: 2 * CONCURRENCY]
        t = time.time()
        res = run_batch(port, [(p, MAX_NEW) for p in many], generate)
        wall8 = time.time() - t
        toks8 = sum(len(r.get("ids") or []) for r in res if "error" not in r)
        out["batch8"] = {"requests": len(res), "errors": [r["error"] for r in res if "error" in r][:3],
                         "tokens": toks8, "wall_s": round(wall8, 3),
                         "tokens_per_s": round(toks8 / wall8, 1) if wall8 else None}
    except Exception as err:  # noqa: BLE001
        out["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    return out


def in_flight(port: int, jobs: list, n: int) -> tuple[list, float]:
    """``jobs`` with ``n`` requests in flight (a new one starts as one ends); (outputs, wall seconds)."""
    t = time.time()
    out = run_batch(port, jobs, generate, n)
    return out, time.time() - t


def _rate(outs: list, wall: float) -> dict:
    ok = [o for o in outs if "error" not in o]
    toks = sum(len(o.get("ids") or []) for o in ok)
    verify = sum(int(o.get("verify_ct") or 0) for o in ok)
    return {"requests": len(outs), "errors": [o["error"] for o in outs if "error" in o][:3], "tokens": toks,
            "wall_s": round(wall, 3), "tokens_per_s": round(toks / wall, 1) if wall else None,
            "accept_length": round(toks / verify, 3) if verify else None}


def gates(server: ServerProc, min_accept: float | None = None, accept_from: str | None = None) -> dict:
    from sgdeploy import gate, serving

    url = f"http://127.0.0.1:{server.port}"
    e = server.entry
    mapping = dict(e["gates"])
    if min_accept is not None or "accept_baseline" in e["tags"]:
        # the trained pair: the acceptance minimum comes from the DFLASH server's measured acceptance (judge set)
        mapping["min_accept_length"] = min_accept
    th = gate.GateThresholds.from_mapping(mapping)
    warm = serving.warmup(url, th.warmup_requests, 32, timeout=120)
    report = gate.run_all(url, th, e["speculative"], bench_timeout=180)
    metrics = {}
    try:
        text = http(server.port, "/metrics", None, 10)
        metrics = {k: v for k, v in serving.parse_metrics(text).items() if "spec" in k or "num_running" in k
                   or "num_queue" in k or "gen_throughput" in k}
        in_flight = serving.in_flight(url)
    except Exception as err:  # noqa: BLE001
        in_flight = f"{type(err).__name__}: {err}"
    out = {"warmup": warm.to_dict(), "report": report.to_dict(), "summary": report.summary(),
           "metrics": metrics, "in_flight": in_flight, "min_accept_length": mapping.get("min_accept_length"),
           "min_accept_from": accept_from}
    if {"exactness", "exactness_reference"} & set(e["tags"]):
        out["exactness_answers"] = exactness_answers(url)
    if "exactness" in e["tags"]:
        out["self_check"] = self_check(url, mapping.get("exactness_tie_tolerance", 0.1))
    return out


def self_check(url: str, tolerance: float) -> dict:
    """The exactness gate without a reference (the product's own code, sgdeploy.exactness.self_check): the server's
    greedy answers against its target's own prefill, every token by the near-tie rule."""
    from sgdeploy import exactness

    t = time.time()
    try:
        v = exactness.self_check(url, tolerance=tolerance, concurrency=CONCURRENCY, timeout=240)
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    return {"verdict": v.verdict, "reason": v.reason, "wall_s": round(time.time() - t, 2)}


def sweep_bench(url: str) -> dict:
    """The sweep's own measurement of a variant (sgdeploy.sweep.Sweep.measure: bench.run with the sweep's defaults)
    on the held-out prompts' texts (the trained pair knows Python source, not the project's English bench prompts),
    with this server alone on the GPU."""
    from sgdeploy import bench

    items = [{"id": f"{k}-{i}", "text": t} for i, (k, t) in enumerate(zip(KINDS, TEXTS, strict=False))]
    prompts_ = bench.parse_prompts(items, "prompts.json") if items else bench.load_prompts()
    return bench.run(url, prompts_, 16, 4, MAX_NEW, 240).to_dict()


def sweep_report(servers: dict, results: dict, out: Path) -> None:
    """The sweep's report (sgdeploy.report: rows, cliffs, recommendation, results.md, sweep.png) over the judge set's
    DDTree gate servers, each row as sgdeploy.sweep.Sweep.row_from_bench makes it, with the exactness verdict."""
    from sgdeploy import report

    rows = []
    verdicts = (results.get("exactness") or {}).get("verdicts", {})
    for n, s in servers.items():
        b = (results.get(n, {}).get("gates") or {}).get("sweep_bench")
        if not b:
            continue
        e = s.entry
        ok = b["completed"] > 0 and b["accept_length_mean"] is not None
        v = verdicts.get(n, {})
        rep = (results.get(n, {}).get("gates") or {}).get("report") or {}
        gates_ = {g["gate"]: {"verdict": g["verdict"], "value": g.get("value")} for g in rep.get("gates", [])}
        gates_["exactness"] = {"verdict": v.get("verdict"), "reason": v.get("reason")}
        failed = [g for g, x in gates_.items() if x["verdict"] == "fail"]
        rows.append(report.variant_row(
            e["budget"], e["topk_cap"], accept_length_mean=b["accept_length_mean"],
            accept_length_sd=b["accept_length_stdev"], tokens_per_s=b["tokens_per_s"] if ok else None,
            step_time_ms=b["step_time_ms_mean"], requests=b["requests"], failures=b["failed"],
            status="ok" if ok else "failed", error=None if ok else "no completed request", config=e["config"],
            reproduce_state_leak=not e["state_forking"], leaks=not e["state_forking"] and e["budget"] > 15,
            gates=gates_, gates_failed=failed,
            exactness={"verdict": v.get("verdict"), "reason": v.get("reason")} if v else None))
    if not rows:
        results["sweep"] = {"error": "no sweep rows"}
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res = report.build_results(config="trained pair (tests/gpu/learned)", host="h200", started=stamp,
                               finished=stamp, variants=rows)
    paths = report.write(res, out / "sweep")
    results["sweep"] = {"recommendation": res["recommendation"], "best": res["best"], "fastest": res["fastest"],
                        "cliff": res["cliff"], "warning": res["warning"],
                        "files": {k: str(v) for k, v in paths.items()}}


def exactness_answers(url: str) -> dict:
    """The exactness gate's own request (sgdeploy.exactness.collect): the prompt set, greedy, top-2 log-probs."""
    from sgdeploy import exactness

    t = time.time()
    outputs, errors = exactness.collect(url, exactness.load_prompts(), concurrency=CONCURRENCY, timeout=240)
    return {"outputs": outputs, "errors": errors[:5], "wall_s": round(time.time() - t, 2)}


def exactness_verdicts(servers: dict, results: dict) -> None:
    """The exactness gate (sgdeploy.exactness.compare) of every ``exactness`` gate server against a reference
    built, as a deploy of an ``ar`` config builds it, from the ``exactness_reference`` server's answers."""
    from sgdeploy import exactness

    refs = [n for n, s in servers.items() if "exactness_reference" in s.entry["tags"]]
    ref_answers = results.get(refs[0], {}).get("gates", {}).get("exactness_answers") if refs else None
    if not ref_answers or ref_answers["errors"] or any(o is None for o in ref_answers["outputs"]):
        results["exactness"] = {"error": "no complete reference answers", "from": refs}
        return
    prompts = exactness.load_prompts()
    reference = exactness.build_reference(ref_answers["outputs"], prompts, {"key": "e2e-tiny", "label": "tiny"},
                                          config=servers[refs[0]].entry["config"], host="h200", release="stock",
                                          concurrency=CONCURRENCY)
    verdicts = {}
    for n, s in servers.items():
        if "exactness" not in s.entry["tags"]:
            continue
        ans = results.get(n, {}).get("gates", {}).get("exactness_answers")
        if not ans or any(o is None for o in ans["outputs"]):
            verdicts[n] = {"verdict": "not run", "errors": (ans or {}).get("errors")}
            continue
        tol = s.entry["gates"].get("exactness_tie_tolerance", 0.1)
        v = exactness.compare(reference, ans["outputs"], tol)
        verdicts[n] = {"verdict": v.verdict, "reason": v.reason, "equal": v.equal, "tolerance": tol,
                       "failures": len(v.details.get("failures", [])),
                       "near_tie_flips": len(v.details.get("near_tie_flips", [])),
                       "first_failures": v.details.get("failures", [])[:3]}
    results["exactness"] = {"reference": refs[0], "prompts": len(prompts), "verdicts": verdicts}


# --- analysis ---------------------------------------------------------------------------------------------------

def align_offset(ar_out: list, ar_scores: list) -> int:
    """0 or 1: how input_top_logprobs lines up with the output tokens (checked on AR's own tokens)."""
    best, best_hits = 0, -1
    for off in (0, 1):
        hits = 0
        for o, sc in zip(ar_out, ar_scores, strict=False):
            ids = o.get("ids") or []
            for i, tok in enumerate(ids):
                j = i + off
                if j < len(sc) and sc[j] and max(sc[j], key=lambda x: x[0])[1] == tok:
                    hits += 1
        if hits > best_hits:
            best, best_hits = off, hits
    return best


def log_counts(server: ServerProc) -> dict:
    """Decode log lines of the server that say whether the step ran from a CUDA graph."""
    try:
        text = server.log_path.read_text(errors="replace")
    except OSError:
        return {}
    return {"decode_lines_cuda_graph": text.count("cuda graph: True"),
            "decode_lines_eager": text.count("cuda graph: False")}


def analyse_paths(servers: dict, results: dict) -> None:
    for name, s in servers.items():
        r = results.get(name, {})
        r.update(log_counts(s))
        rows, batch_sizes, errs = path_rows(s)
        if rows:
            r["paths"] = stats.path_statistics(rows)
            r["paths"]["batch_sizes"] = batch_sizes
        if errs:
            r["path_log_errors"] = errs[:5]


def analyse(servers: dict, results: dict, ps: list, deadline: float) -> None:
    analyse_paths(servers, results)
    try:
        exactness_verdicts(servers, results)
    except Exception as err:  # noqa: BLE001
        results["exactness"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    ar = results.get("ar", {}).get("experiment")
    if not ar:
        return
    ar_greedy = ar["greedy"]
    ar_port = servers["ar"].port
    # AR's own outputs scored by AR prefill: the alignment and the AR decode-vs-prefill baseline.
    ar_scores = run_batch(ar_port, [(p, o.get("ids") or []) for p, o in zip(ps, ar_greedy, strict=False)], score_prefix)
    bad = [x["error"] for x in ar_scores if isinstance(x, dict)]
    if bad:
        results["ar"]["scoring_errors"] = bad[:3]
        ar_scores = None
    off = align_offset(ar_greedy, ar_scores) if ar_scores else 0
    results["ar"]["prefill_offset"] = off
    for name, s in servers.items():
        r = results.get(name, {})
        ex = r.get("experiment")
        if not ex or s.entry["role"] != "experiment":
            continue
        cand = ex["greedy"]
        verdicts = [stats.compare_greedy(a.get("ids") or [], a.get("top") or [], c.get("ids") or [])
                    for a, c in zip(ar_greedy, cand, strict=False)]
        r["lossless"] = stats.summarize_lossless(verdicts)
        if name == "ar" or ar_scores is None:
            scores = ar_scores
        elif time.time() < deadline - 30:
            scores = run_batch(ar_port, [(p, c.get("ids") or []) for p, c in zip(ps, cand, strict=False)], score_prefix)
            if any(isinstance(x, dict) for x in scores):
                r["scoring_errors"] = [x["error"] for x in scores if isinstance(x, dict)][:3]
                scores = None
        else:
            scores = None
        if scores is not None:
            tf = [stats.teacher_forced(c.get("ids") or [], (sc or [])[off:]) for c, sc in zip(cand, scores, strict=False)]
            r["teacher_forced"] = {
                "tokens_checked": sum(x["checked"] for x in tf), "near_ties": sum(x["near_ties"] for x in tf),
                "outside_rule": sum(x["outside_rule"] for x in tf),
                "prompts_outside": sum(1 for x in tf if x["outside_rule"]),
                "worst_gap": max((x["worst_gap"] for x in tf if x["worst_gap"] is not None), default=None)}
        acc = [c["accept_length"] for c in cand if c.get("accept_length")]
        r["accept_length_mean"] = round(sum(acc) / len(acc), 4) if acc else None
        if KINDS:
            r["by_kind"] = by_kind(cand)
        r["server_hist"] = stats.merge_histograms(c.get("hist") for c in cand)
        r["errors"] = [c["error"] for c in cand if "error" in c][:5]
        if "logprobs" in ex:
            lp = ex["logprobs"]
            same = sum(1 for a, b in zip(lp, cand, strict=False) if a.get("ids") == b.get("ids"))
            diffs = []
            for a, arr in zip(lp, ar_greedy, strict=False):
                n = stats.first_difference(a.get("ids") or [], arr.get("ids") or [])
                n = len(a.get("ids") or []) if n is None else n
                diffs += [abs(x - y) for x, y in zip((a.get("lp") or [])[:n], (arr.get("lp") or [])[:n], strict=False)
                          if x is not None and y is not None]
            r["logprobs_check"] = {"requests": len(lp), "same_tokens_as_without": same,
                                   "errors": [a["error"] for a in lp if "error" in a][:3],
                                   "max_abs_logprob_diff_vs_ar": round(max(diffs), 6) if diffs else None,
                                   "tokens_compared": len(diffs)}
        ex_small = {k: v for k, v in ex.items() if k not in ("greedy", "logprobs")}
        r["experiment_summary"] = ex_small


def by_kind(cand: list[dict]) -> dict:
    """Accept length (tokens over verify steps, as the server counts it) per prompt kind, with and without the
    outputs that fell into a repeated loop (e2e_stats.looping), and the share of looping outputs."""
    out: dict = {}
    loops = [stats.looping(c.get("ids") or []) for c in cand]
    for kind in ("all", "code", "prose"):
        rows = [(c, lp) for c, lp, k in zip(cand, loops, KINDS, strict=False) if kind in ("all", k) and "error" not in c]
        for which, keep in (("with_loops", lambda lp: True), ("without_loops", lambda lp: not lp)):
            sel = [c for c, lp in rows if keep(lp)]
            steps = sum(c.get("verify_ct") or 0 for c in sel)
            toks = sum(c.get("completion_tokens") or len(c.get("ids") or []) for c in sel)
            out[f"{kind}_{which}"] = {"outputs": len(sel), "accept_length": round(toks / steps, 4) if steps else None}
        out[f"{kind}_loop_share"] = round(sum(lp for _, lp in rows) / len(rows), 4) if rows else None
    return out


def timing_text(tm: dict) -> str:
    """A server's timing in its summary line: paired rounds (sets "derive" and "schedule": median [min-max] x
    rounds), one pass of the same rounds (set "schedule"'s servers that compare with none), or the batch 1 / 8 timing
    (one pass); a single pass says that it is not a comparison."""
    if tm.get("error"):
        return f"timing: {tm['error']}"
    if tm.get("method", "").startswith("single"):
        return f"tok/s ({tm['method']}) " + " ".join(
            f"{k} {v.get('tokens_per_s')} (al {v.get('accept_length')})" for k, v in tm.items() if isinstance(v, dict))
    if tm.get("method"):
        return f"tok/s ({tm['method']}: median [min-max] x rounds) " + " ".join(
            f"{k} {v.get('tokens_per_s')} [{v.get('min')}-{v.get('max')}] x{v.get('n')} (al {v.get('accept_length')})"
            for k, v in tm.items() if isinstance(v, dict))
    return (f"tok/s ({SINGLE}) b1 {tm['batch1']['tokens_per_s']} b8 {tm.get('batch8', {}).get('tokens_per_s')} "
            f"step {tm['batch1']['step_ms']} ms")


def summary_lines(results: dict) -> list[str]:
    lines = []
    for name, r in results.items():
        if not isinstance(r, dict) or "status" not in r:
            continue
        parts = [f"{name:<30}", r["status"], f"start {r.get('startup_s')} s"]
        lo = r.get("lossless")
        if lo:
            parts.append(f"equal {lo['equal']}/{lo['prompts']} near-tie {lo['near_tie']} outside {lo['outside_rule']}")
        tf = r.get("teacher_forced")
        if tf:
            parts.append(f"tf-outside {tf['outside_rule']}/{tf['tokens_checked']}")
        if r.get("accept_length_mean"):
            parts.append(f"accept {r['accept_length_mean']}")
        bk = r.get("by_kind")
        if bk:
            parts.append(f"code {bk['code_with_loops']['accept_length']} prose {bk['prose_with_loops']['accept_length']}"
                         f" noloop {bk['all_without_loops']['accept_length']} loops {bk['all_loop_share']}")
        tm = r.get("timing")
        if tm and ("method" in tm or "batch1" in tm or "error" in tm):
            parts.append(timing_text(tm))
        p = r.get("paths")
        if p:
            parts.append(f"nonfirst {p['nonfirst_sibling_share']} 2+ {p['two_plus_share']} bs {p['batch_sizes']}")
        ex = r.get("experiment_summary") or {}
        if "sampling" in ex:
            parts.append(f"T=1 accept {ex['sampling']['accept_length_mean']}")
        if "profile" in ex:
            parts.append(f"profile: {ex['profile'].get('verdict') or ex['profile'].get('error')}")
        if r.get("gates"):
            parts.append("gates: " + "; ".join(g["gate"] + " " + g["verdict"] for g in r["gates"]["report"]["gates"]))
        lines.append(" | ".join(str(x) for x in parts))
    for name, r in results.items():
        wc = ((r.get("experiment_summary") or r.get("experiment") or {}).get("watch_check") if isinstance(r, dict) else None) or {}
        if wc:
            lw = wc.get("live_watch") or {}
            lines.append(f"watch check {name}: counters equal {wc.get('counters_equal')}; metrics "
                         f"{wc.get('metrics')}; meta_info {wc.get('meta_info')}; live watch {lw.get('result')}: "
                         f"{lw.get('line') or lw.get('error')}" if "error" not in wc else
                         f"watch check {name}: {wc['error']}")
    for name, v in (results.get("exactness") or {}).get("verdicts", {}).items():
        lines.append(f"exactness {name}: {v['verdict']}: {v.get('reason')}")
    for name, r in results.items():
        sc = (r.get("gates") or {}).get("self_check") if isinstance(r, dict) else None
        if sc:
            lines.append(f"exactness self-check {name}: {sc.get('verdict') or sc.get('error')}: {sc.get('reason')}")
    lines += derive.lines(results.get("derive") or {})
    lines += sched_compare.lines(results.get("schedule") or {})
    if results.get("accept_minimum"):
        lines.append(f"acceptance minimum: {results['accept_minimum']}")
    if results.get("sweep"):
        sw = results["sweep"]
        lines.append(f"sweep (the project's own sgdeploy sweep: one bench pass per server, {SINGLE}): "
                     f"{sw.get('recommendation') or sw.get('error')}")
    return lines


# Set "derive": the seconds kept, before the deadline, beyond phase A's and phase B's rounds (the H200 run of
# 2026-12-05: the derived server served 71 s after its start, its greedy run took 6 s, the analysis ~60 s for 8 servers).
RESERVE_S = {"derived_start": 80, "derived_greedy": 10, "analysis": 15, "final": 20}
A_SCALE = 0.5  # phase A's rounds (the derivation's) are half of phase B's (the verdicts'): both fit the call
B_TAIL_S = RESERVE_S["analysis"] + RESERVE_S["final"]  # phase B ends this long before the deadline
DERIVED_WAIT_MARGIN_S = 75  # the derived server must serve this long before the deadline (its greedy run, phase B)


def warm_up(server: ServerProc, ps: list[list[int]], batches: list[int], warmed: set) -> None:
    """Untimed, once per server: one short request, then at each batch size a round of n short requests (the first
    steps at a new batch size compile Triton kernels and graph-less shapes; 2026-12-05, H100: budget 15 at 16 in
    flight, 747 tok/s timed first, 1771 tok/s timed again two minutes later)."""
    for n in [0, *batches]:
        if (server.name, n) in warmed:
            continue
        if n == 0:
            generate(server.port, ps[0], 8)
        else:
            in_flight(server.port, [(p, MAX_NEW // 4) for p in ps[-n:]], n)
        warmed.add((server.name, n))


def timed_round(server: ServerProc, ps: list[list[int]], key: str, scale: float = 1.0) -> dict:
    """One timed round (paired.py): ``batchN``: ``paired.round_requests(N, scale)`` requests of MAX_NEW greedy tokens,
    N in flight; ``moving``: the phases of ``paired.MOVING`` one after the other, their wall times added."""
    if key == "moving":
        all_outs, total, start = [], 0.0, 0
        for n, count in paired.MOVING:
            outs, wall = in_flight(server.port, [(p, MAX_NEW) for p in (ps * 4)[start: start + count]], n)
            start += count
            all_outs += outs
            total += wall
        return _rate(all_outs, total)
    n = int(key[len("batch"):])
    outs, wall = in_flight(server.port, [(p, MAX_NEW) for p in paired.pick(ps, paired.round_requests(n, scale))], n)
    return _rate(outs, wall)


def paired_rounds(servers: dict, ps: list[list[int]], groups: dict[str, list[str]], repeats: int, stop: float,
                  scale: float, estimate: float, min_repeats: int = 0) -> tuple[list[dict], dict]:
    """Up to ``repeats`` repeats of ``groups``' rounds in ``paired.repeat_rounds`` order; a repeat starts only when
    it ends by ``stop`` (``paired.next_repeat_fits``; the first ``min_repeats`` always run). (records, info)."""
    records: list[dict] = []
    durations: list[float] = []
    info: dict = {"repeats_planned": repeats}
    for r in range(repeats):
        if r >= min_repeats and not paired.next_repeat_fits(time.time(), stop, durations, estimate):
            info["stopped"] = (f"repeat {r + 1} not run: it would end after the stop time "
                               f"({max(durations) if durations else estimate:.0f} s left {stop - time.time():.0f} s)")
            break
        t = time.time()
        for key, name in paired.repeat_rounds(groups, r):
            try:
                rate = timed_round(servers[name], ps, key, scale)
            except Exception as err:  # noqa: BLE001
                rate = {"errors": [f"{type(err).__name__}: {str(err)[:200]}"], "tokens_per_s": None}
            records.append({"repeat": r, "key": key, "server": name, "at_s": round(time.time() - T0, 1), **rate})
        durations.append(round(time.time() - t, 1))
        say(f"paired repeat {r + 1}/{repeats} in {durations[-1]} s")
    info.update(repeats_ran=len(durations), repeat_s=durations)
    return records, info


def derive_and_judge(plan: dict, entry: dict, servers: dict, results: dict, ps: list, args, save) -> None:
    """Set "derive" (issue 38 item 3): phase A times the fixed budgets in interleaved repeats (paired.py), the
    schedule is derived from their medians (``derive.cells``, then the project's ``sgdeploy.schedule.derive``), the
    held-back server is started with it (``servers`` gains it; the other servers are analysed against AR while it
    starts, ``report["analysed_early"]``), its greedy run, then phase B times it in alternation with the fixed budgets
    that could be the fastest at each batch and, over the moving load, with every fixed budget and the control, and
    ``derive.compare`` judges the paired ratios. The repeats fit the deadline (``paired.fit_repeats``)."""
    from sgdeploy import schedule

    d, batches = plan["derive"], plan["batches"]
    report: dict = {"from": d["from"], "tie_tolerance": derive.TIE_TOLERANCE, "within": derive.WITHIN,
                    "min_repeats": paired.MIN_REPEATS}
    results["derive"] = report
    fixed = [servers[n] for n in d["from"] if n in servers and servers[n].status == "serving"]
    names = [s.name for s in fixed]
    control = servers.get(d.get("control") or "")
    control_name = control.name if control is not None and control.status == "serving" else None
    if not fixed:
        report["error"] = "no fixed budget is serving: nothing to derive from"
        return
    warmed: set = set()
    groups_a = {f"batch{n}": names for n in batches}
    moving = [entry["name"], *names, *([control_name] if control_name else [])]
    guess_b = {**{f"batch{n}": [entry["name"], names[-1]] for n in batches}, "moving": moving}
    cost_a, cost_b = paired.repeat_cost(groups_a, A_SCALE), paired.repeat_cost(guess_b)
    warm_s = paired.WARM_S * (len(batches) + 1) * (len(moving))
    available = args.deadline - time.time() - sum(RESERVE_S.values()) - warm_s
    ra, rb = paired.fit_repeats(available, cost_a, cost_b)
    report["budget"] = {"available_s": round(available), "phase_a_repeat_s": round(cost_a, 1),
                        "phase_b_repeat_s": round(cost_b, 1), "repeats_a": ra, "repeats_b": rb,
                        "reserve_s": RESERVE_S, "warm_up_s": round(warm_s, 1)}
    say("paired timing: phase A", ra, "repeats, phase B", rb, "planned;", report["budget"])
    for s in fixed:
        warm_up(s, ps, batches, warmed)
    stop_a = args.deadline - sum(RESERVE_S.values()) - rb * cost_b - paired.WARM_S * (len(batches) + 1) * 2
    recs_a, info_a = paired_rounds(servers, ps, groups_a, ra, stop_a, A_SCALE, cost_a, min_repeats=1)
    summary_a = paired.summarise(recs_a)
    for s in fixed:
        results[s.name]["timing"] = {"method": "paired, phase A", **summary_a.get(s.name, {})}
    report["phase_a"] = {**info_a, "scale": A_SCALE, "servers": names,
                         "round_requests": {n: paired.round_requests(n, A_SCALE) for n in batches},
                         "summary": summary_a, "rounds": recs_a}
    got = schedule.derive(derive.cells([s.entry for s in fixed], results), derive.TIE_TOLERANCE)
    if got is None:
        report["error"] = "no fixed budget was timed without errors: nothing to derive from"
        return
    report.update(flag=got["flag"], buckets=got["buckets"])
    entry = {**entry, "args": derive.derived_args(entry["args"], got["schedule"]),
             "budget": max(b for _, b in got["schedule"])}
    say("derived schedule", got["flag"])
    s = ServerProc(entry, args.releases, args.site)
    s.start()
    results[s.name] = {"status": "starting", "args": entry["args"], "wheel": entry["wheel"], "derived": got["flag"]}
    try:  # nothing is timed while it starts: the others' losslessness against AR meanwhile
        analyse(dict(servers), results, ps, args.deadline)
        report["analysed_early"] = list(servers)
    except Exception:  # noqa: BLE001
        import traceback

        results["analyse_error"] = traceback.format_exc()[-1500:]
    servers[s.name] = s
    while s.poll() == "starting" and time.time() < args.deadline - DERIVED_WAIT_MARGIN_S:
        time.sleep(2)
    results[s.name].update(status=s.poll() if s.status != "starting" else "not serving by the deadline",
                           startup_s=s.startup_s())
    say(s.name, results[s.name]["status"], s.startup_s())
    if s.status != "serving":
        results[s.name]["log_errors"] = s.errors()
        save()
        return
    try:
        results[s.name]["experiment"] = experiment(s, ps, args.deadline)
    except Exception as err:  # noqa: BLE001
        results[s.name]["experiment_error"] = f"{type(err).__name__}: {str(err)[:500]}"
    by_budget = {x.entry["budget"]: x.name for x in fixed}
    against = {}
    for n in batches:
        picked = [by_budget.get(b["budget"]) for b in got["buckets"] if b["batch"] == n]
        can = paired.contenders(recs_a, names, f"batch{n}")
        against[n] = [x for x in names if x in can or x in picked]
    groups_b = {**{f"batch{n}": [s.name, *against[n]] for n in batches}, "moving": moving}
    cost_b = paired.repeat_cost(groups_b)
    for x in (s, *([servers[control_name]] if control_name else [])):
        warm_up(x, ps, batches, warmed)
    recs_b, info_b = paired_rounds(servers, ps, groups_b, paired.MAX_REPEATS, args.deadline - B_TAIL_S, 1.0, cost_b)
    summary_b = paired.summarise(recs_b)
    results[s.name]["timing"] = {"method": "paired, phase B", **summary_b.get(s.name, {})}
    report["phase_b"] = {**info_b, "repeats_most": paired.MAX_REPEATS, "groups": groups_b,
                         "round_requests": {n: paired.round_requests(n) for n in batches},
                         "moving": [f"{n} in flight x {c}" for n, c in paired.MOVING],
                         "summary": summary_b, "rounds": recs_b}
    report["compare"] = derive.compare(recs_b, s.name, names, control_name, against)
    say("derive:", report["compare"]["verdicts"])
    save()


def _warm_all(names: list[str], servers: dict, ps: list, batches: list[int], warmed: set, results: dict) -> list[str]:
    """``warm_up`` each of ``names``; those whose warm-up failed are left out of the answer (the error in results)."""
    ok = []
    for n in names:
        try:
            warm_up(servers[n], ps, batches, warmed)
            ok.append(n)
        except Exception as err:  # noqa: BLE001
            results[n]["timing"] = {"error": f"warm-up failed: {type(err).__name__}: {str(err)[:200]}"}
    return ok


def schedule_rounds(plan: dict, servers: dict, results: dict, ps: list, args, save) -> None:
    """Set "schedule" (issue 38): the servers are checked against AR first (nothing is timed then;
    ``report["analysed_early"]``), then every comparison of the set (``sched_compare.groups``: the schedule against
    the fixed budgets it uses and DFLASH 16, graphs on against off) runs in paired, interleaved rounds, as many
    repeats as fit the deadline (``paired.plan_rounds``; they end ``B_TAIL_S`` before it), judged by
    ``sched_compare.compare``. The other experiment servers (AR, the leak) get one pass of the same rounds after,
    where it fits: "single pass, not a comparison"."""
    spec, batches = plan["schedule"], plan["batches"]
    report: dict = {"server": spec["server"], "within": paired.WITHIN, "min_repeats": paired.MIN_REPEATS}
    results["schedule"] = report
    try:  # the losslessness first: the rounds then get all the time that is left
        analyse(dict(servers), results, ps, args.deadline)
        report["analysed_early"] = list(servers)
    except Exception:  # noqa: BLE001
        import traceback

        results["analyse_error"] = traceback.format_exc()[-1500:]
    serving = {n for n, x in servers.items() if x.status == "serving" and x.proc.poll() is None}
    warmed: set = set()
    stop = args.deadline - B_TAIL_S
    groups = sched_compare.groups(spec, batches, serving)
    timed = _warm_all([n for n in servers if any(n in g for g in groups.values())], servers, ps, batches, warmed,
                      results)
    groups = sched_compare.groups(spec, batches, set(timed))
    if not groups:
        report["error"] = f"nothing to compare: {spec['server']} or every server to compare it with not serving"
    else:
        available = stop - time.time()
        repeats, scale = paired.plan_rounds(available, groups)
        cost = paired.repeat_cost(groups, scale)
        report["budget"] = {"available_s": round(available), "repeat_s": round(cost, 1), "repeats": repeats,
                            "scale": scale, "tail_s": B_TAIL_S}
        say("schedule: paired rounds", report["budget"])
        recs, info = paired_rounds(servers, ps, groups, repeats, stop, scale, cost, min_repeats=1)
        summary = paired.summarise(recs)
        for n in {x for g in groups.values() for x in g}:
            results[n]["timing"] = {"method": f"paired, {info['repeats_ran']} repeats", **summary.get(n, {})}
        report["rounds"] = {**info, "scale": scale, "groups": groups,
                            "round_requests": {n: paired.round_requests(n, scale) for n in batches},
                            "moving": [f"{n} in flight x {c}" for n, c in paired.MOVING],
                            "summary": summary, "rounds": recs}
        report["compare"] = sched_compare.compare(recs, spec, batches, groups)
        say("schedule:", report["compare"]["schedule"]["verdicts"], (report["compare"].get("graphs") or {}).get("verdict"))
        save()
    single = [n for n in servers if n in serving and n not in timed and servers[n].entry["role"] == "experiment"]
    report["single"] = {"servers": single}
    if not single:
        return
    scale = (report.get("budget") or {}).get("scale", paired.SCALES[-1])
    alone = {**{f"batch{n}": single for n in batches}, "moving": single}
    cost = paired.repeat_cost(alone, scale) + paired.WARM_S * (len(batches) + 1) * len(single)
    if not paired.next_repeat_fits(time.time(), stop, [], cost):
        report["single"]["not_run"] = f"not run: {cost:.0f} s, {stop - time.time():.0f} s left after the comparisons"
        return
    single = _warm_all(single, servers, ps, batches, warmed, results)
    recs, info = paired_rounds(servers, ps, {k: single for k in alone}, 1, stop, scale, cost)
    summary = paired.summarise(recs)
    for n in single:
        results[n]["timing"] = {"method": SINGLE, **summary.get(n, {})}
    report["single"].update(info, rounds=recs)


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - the harness run in order, one step a block
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--deadline", required=True, type=float, help="epoch seconds: everything done by then")
    ap.add_argument("--releases", type=Path, default=ROOT / "releases")
    ap.add_argument("--site", default=str(ROOT / "site"))
    ap.add_argument("--only", help="comma-separated server names (default: all in the plan)")
    ap.add_argument("--serve-margin", type=float, default=120.0,
                    help="seconds before the deadline by which a server must serve (default 120)")
    args = ap.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    entries = plan["servers"]
    if args.only:
        keep = set(args.only.split(","))
        entries = [e for e in entries if e["name"] in keep]
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"plan": plan["set"], "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "prompts": PROMPTS, "max_new": MAX_NEW, "concurrency": CONCURRENCY,
                     "tie_tolerance_nats": stats.TIE_TOLERANCE_NATS}

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    held = (plan.get("derive") or {}).get("server")  # started once its schedule is derived (set "derive")
    servers = {e["name"]: ServerProc(e, args.releases, args.site) for e in entries if e["name"] != held}
    held_entry = next((e for e in entries if e["name"] == held), None)
    for s in servers.values():
        s.start()
        results[s.name] = {"status": "starting", "args": s.entry["args"], "wheel": s.entry["wheel"]}
    say(f"started {len(servers)} servers")
    try:
        pending = set(servers)
        while pending and time.time() < args.deadline - args.serve_margin:
            for n in list(pending):
                st = servers[n].poll()
                if st != "starting":
                    pending.discard(n)
                    results[n].update(status=st, startup_s=servers[n].startup_s())
                    if st != "serving":
                        results[n]["log_errors"] = servers[n].errors()
                    say(n, st, servers[n].startup_s())
            time.sleep(2)
        for n in pending:
            results[n].update(status="not serving by the deadline", log_errors=servers[n].errors())
        save()
        ps = use_plan(plan)
        results.update(prompts=len(ps), max_new=MAX_NEW, kinds=KINDS)
        live = [s for s in servers.values() if s.status == "serving"]
        first = [s for s in live if "accept_baseline" in s.entry["tags"]]
        min_accept = None
        if first:  # the judge set: the DFLASH server's gates first; its measured acceptance is the others' minimum
            try:
                results[first[0].name]["gates"] = g = gates(first[0])
                min_accept = ((g["report"].get("bench") or {}).get("accept_length_mean"))
                say(first[0].name, "gates done; acceptance minimum for the others:", min_accept)
            except Exception as err:  # noqa: BLE001
                results[first[0].name]["gates_error"] = f"{type(err).__name__}: {str(err)[:500]}"
            results["accept_minimum"] = {"from": first[0].name, "value": min_accept}
            live = [s for s in live if s not in first]
        with cf.ThreadPoolExecutor(len(live) or 1) as pool:
            futs = {}
            for s in live:
                if s.entry["role"] == "experiment":
                    futs[pool.submit(experiment, s, ps, args.deadline)] = s
                else:
                    futs[pool.submit(gates, s, min_accept, first[0].name if first else None)] = s
            for f in cf.as_completed(futs):
                s = futs[f]
                key = "experiment" if s.entry["role"] == "experiment" else "gates"
                try:
                    results[s.name][key] = f.result()
                except Exception as err:  # noqa: BLE001
                    results[s.name][key + "_error"] = f"{type(err).__name__}: {str(err)[:500]}"
                    results[s.name]["log_errors"] = s.errors()
                say(s.name, key, "done")
                save()
        if plan.get("schedule"):  # set "schedule": its comparisons in paired rounds
            schedule_rounds(plan, servers, results, ps, args, save)
        elif plan.get("learned") and held_entry is None:  # speed, one server at a time (the others idle), one pass
            for s in (x for x in servers.values() if x.status == "serving"):
                if time.time() > args.deadline - 90:
                    results[s.name]["timing"] = {"error": "not run: too close to the deadline"}
                elif s.entry["role"] == "experiment":
                    results[s.name]["timing"] = timing(s, ps)
                    say(s.name, "timing", results[s.name]["timing"].get("batch1", {}).get("tokens_per_s"),
                        results[s.name]["timing"].get("batch8", {}).get("tokens_per_s"))
                elif "sweep" in s.entry["tags"] and "gates" in results[s.name]:
                    try:
                        results[s.name]["gates"]["sweep_bench"] = sweep_bench(f"http://127.0.0.1:{s.port}")
                    except Exception as err:  # noqa: BLE001
                        results[s.name]["sweep_bench_error"] = f"{type(err).__name__}: {str(err)[:300]}"
                    say(s.name, "sweep bench done")
            save()
        if held_entry is not None:
            derive_and_judge(plan, held_entry, servers, results, ps, args, save)
        # sets "derive" and "schedule": analysed already (set "derive": all but the derived server)
        early = set((results.get("derive") or results.get("schedule") or {}).get("analysed_early") or ())
        rest = {n: s for n, s in servers.items() if n not in early}
        if time.time() < args.deadline - 20:
            try:
                if rest:  # with AR, the reference
                    analyse({**rest, **({"ar": servers["ar"]} if "ar" in servers else {})}, results, ps,
                            args.deadline)
                analyse_paths({n: s for n, s in servers.items() if n in early}, results)
            except Exception:  # noqa: BLE001
                import traceback

                results["analyse_error"] = traceback.format_exc()[-1500:]
        else:
            analyse_paths(servers, results)
            exactness_verdicts(servers, results)
        if any("sweep" in s.entry["tags"] for s in servers.values()):
            try:
                sweep_report(servers, results, args.out)
            except Exception as err:  # noqa: BLE001
                results["sweep"] = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
        for s in servers.values():
            if s.status == "serving" and s.proc.poll() is not None:
                results[s.name]["died"] = s.proc.returncode
                results[s.name]["log_errors"] = s.errors()
    finally:
        for s in servers.values():
            s.stop()
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save()
        lines = summary_lines(results)
        (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
        with tarfile.open(args.out / "logs.tar.xz", "w:xz") as tar:
            for s in servers.values():
                if s.log_path.exists():
                    tar.add(s.log_path, arcname=s.log_path.name)
                for f in sorted(s.path_log.glob("paths-*.jsonl")):
                    tar.add(f, arcname=f"paths/{s.name}/{f.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
