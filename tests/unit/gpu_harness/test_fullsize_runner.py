"""The full-size runner's plumbing on the CPU (tests/gpu/fullsize/full_runner.py) against a STAND-IN server:
a tiny HTTP process named ``sglang.launch_server`` that answers /health, /generate, /server_info (a growing
``step_time_dict``), /start_profile (a synthetic trace) and a fake ``nvidia-smi``. It proves the waves, the
start order, the step-time diffing, the memory line, the trace copy and breakdown and results.json; not
SGLang's behaviour (that runs on the GPU machine)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "gpu"
sys.path.insert(0, str(HERE / "fullsize"))
sys.path.insert(0, str(HERE / "e2e"))

import full_runner  # noqa: E402
import runner as e2e_runner  # noqa: E402

STANDIN = textwrap.dedent('''
    """TEST EQUIPMENT: stands in for sglang.launch_server (unit test of the full-size runner)."""
    import gzip, json, os, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    running = [0]
    steps = {}
    lock = threading.Lock()
    print("Mamba Cache is allocated. max_mamba_cache_size: 16, conv_state size: 0.08GB, ssm_state size: 2.25GB "
          "intermediate_ssm_state_cache size: 20.25GB intermediate_conv_window_cache size: 0.40GB", flush=True)

    def trace(path):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "sgdeploy_e2e::ddtree_decode_step", "pid": 1, "tid": 1,
               "ts": 0, "dur": 100},
              {"ph": "X", "cat": "user_annotation", "name": "sgdeploy_full::topk", "pid": 1, "tid": 1, "ts": 10,
               "dur": 10},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12, "dur": 1,
               "args": {"correlation": 5}},
              {"ph": "X", "cat": "kernel", "name": "topk_kernel", "pid": 0, "tid": 7, "ts": 50, "dur": 8,
               "args": {"correlation": 5}}]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": ev}, f)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self.reply({})
            if self.path == "/server_info":
                with lock:
                    return self.reply({"internal_states": [{"step_time_dict": steps}]})
            self.send_response(404)
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.path == "/start_profile":
                trace(os.path.join(body["output_dir"], "x", "t.trace.json.gz"))
                return self.reply({})
            if self.path == "/stop_profile":
                return self.reply({})
            n = body["sampling_params"]["max_new_tokens"]
            with lock:
                running[0] += 1
            time.sleep(0.2)  # the other requests of the batch arrive
            with lock:
                b = running[0]
                steps.setdefault(str(b), []).extend([0.001 * (10 + b)] * (n - 1))
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            self.reply({"output_ids": [1] * n, "meta_info": {"completion_tokens": n, "e2e_latency": 0.25,
                                                           "spec_verify_ct": n - 1, "spec_accept_length": 1.0}})

    time.sleep(0.3)
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def test_the_runner_measures_every_server_in_waves(tmp_path, monkeypatch):
    release = tmp_path / "releases" / "w"
    (release / "sglang").mkdir(parents=True)
    (release / "sglang" / "__init__.py").write_text("")
    (release / "sglang" / "launch_server.py").write_text(STANDIN)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 143771, 500'\necho '1, 143771, 500'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(e2e_runner, "ROOT", tmp_path / "root")
    monkeypatch.setattr(full_runner, "E2E_ROOT", tmp_path / "root")
    monkeypatch.setattr(full_runner, "ROOT", tmp_path / "root" / "fullsize")
    monkeypatch.setattr(full_runner, "MAX_NEW", 12)
    monkeypatch.setattr(full_runner, "RUNS", 2)
    monkeypatch.setattr(full_runner, "POLL_S", 0.3)
    monkeypatch.setattr(full_runner, "TRACE_SETTLE_S", 0.2)
    gib = 1 << 30

    def entry(name, port, batches, tags=()):
        return {"name": name, "port": port, "algorithm": "DDTREE", "wheel": "w", "tags": list(tags), "env": {},
                "batches": batches, "max_running": batches[-1], "predicted_forking_gib": 20.646,
                "predicted_bytes": {"total": 80 * gib, "reserve": 6 * gib},
                "args": ["--port", str(port), "--mem-fraction-static", "0.88"]}

    plan = {"servers": [entry("a", 39410, [1, 4], ("profile",)), entry("b", 39420, [1, 2]),
                        {**entry("c", 39430, [1]), "budget": 32, "budget_schedule": [[1, 32], [6, 15]]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "out"
    import time

    rc = full_runner.main(["--plan", str(tmp_path / "plan.json"), "--out", str(out), "--deadline",
                           str(time.time() + 100), "--releases", str(tmp_path / "releases"), "--site", str(tmp_path),
                           "--start-estimate", "5", "--measure-estimate", "5", "--serve-margin", "5"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["waves"] == [[["a", 0], ["b", 1]], [["c", 0]]]  # two GPUs of 140 GiB, 80 GiB each
    for name in "abc":
        assert res[name]["status"] == "serving", res[name]
    a = res["a"]["measure"]
    assert a["batch_4"]["steps"] == 2 * 4 * 11 and a["batch_4"]["step_ms_median"] == 14.0
    assert a["batch_1"]["step_ms_median"] == 11.0 and a["batch_1"]["run_medians_ms"] == [11.0, 11.0]
    assert res["a"]["memory"]["forking_gib"] == 20.65
    assert res["a"]["mem_fraction_static"] == round((74 + 2) / (143771 - 500) * 1024, 3)
    prof = a["profile"]
    assert prof["copied"] == "traces/a.trace.json.gz" and prof["breakdown"]["parts_us_median"]["topk"] == 8.0
    assert res["c"]["gpu"] == 0 and "b2 step 12.0 ms" in (out / "summary.txt").read_text()
    # the schedule travels into results.json for sched_check.py; a fixed server's is None
    assert res["c"]["budget_schedule"] == [[1, 32], [6, 15]] and res["c"]["budget"] == 32
    assert res["a"]["budget_schedule"] is None
