"""Test equipment for the gate, bench and serving tests: a tiny scripted SGLang stand-in (StubEngine)
and a launcher for the simulated engine (tests/sim/sglang_sim.py) on 127.0.0.1."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "tests" / "sim" / "sglang_sim.py"
RELEASE = "0.5.23+ddtree.fork.topk.abcdef12"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubEngine:
    """Answers /generate from a script. ``text`` is a string or a function of the call number
    (0, 1, ...); ``verify_ct`` is an int, None (no spec metrics) or a list cycled per call."""

    def __init__(self, text: str | Callable[[int], str] = " Paris. Paris is the capital of France.",
                 tokens: int = 32, verify_ct: int | list[int] | None = 4, delay: float = 0.0,
                 healthy_after: float = 0.0, metrics: bool = True, status: int = 200):
        self.text, self.tokens, self.delay, self.status = text, tokens, delay, status
        self.verify = itertools.cycle(verify_ct if isinstance(verify_ct, list) else [verify_ct])
        self.healthy_at = time.monotonic() + healthy_after
        self.metrics = metrics
        self.calls = 0
        self.running = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path == "/health":
                    self._send(200 if time.monotonic() >= stub.healthy_at else 503, b"")
                elif self.path == "/metrics" and stub.metrics:
                    with stub.lock:
                        n = stub.running
                    body = ("# TYPE sglang:num_running_reqs gauge\n"
                            f'sglang:num_running_reqs{{model_name="m"}} {n}\n'
                            'sglang:num_queue_reqs{model_name="m"} 0\n')
                    self._send(200, body.encode(), "text/plain")
                else:
                    self._send(404, b'{"error": "no such endpoint"}')

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with stub.lock:
                    call = stub.calls
                    stub.calls += 1
                    stub.running += 1
                    verify = next(stub.verify)
                # A request stops running before its answer is written, as in a server: a client that
                # has the answer never sees it counted as running.
                try:
                    time.sleep(stub.delay)
                    if stub.status != 200:
                        status, answer = stub.status, b'{"error": "scripted failure"}'
                    else:
                        text = stub.text(call) if callable(stub.text) else stub.text
                        tokens = min(stub.tokens, body["sampling_params"]["max_new_tokens"])
                        meta = {"prompt_tokens": 5, "completion_tokens": tokens, "e2e_latency": 0.5}
                        if verify is not None:
                            meta["spec_verify_ct"] = verify
                        status, answer = 200, json.dumps({"text": text, "meta_info": meta}).encode()
                finally:
                    with stub.lock:
                        stub.running -= 1
                self._send(status, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> StubEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fake_release(tmp: Path, version: str = RELEASE) -> Path:
    """A folder to put on PYTHONPATH so that importlib.metadata.version("sglang") == version."""
    site = tmp / "site"
    info = site / f"sglang-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return site


class Sim:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log


@contextmanager
def simulator(tmp: Path, env: dict[str, str] | None = None, algorithm: str = "DDTREE",
              budget: int = 15) -> Iterator[Sim]:
    """Start the simulated engine on 127.0.0.1 with a fake patched release; stop it afterwards."""
    port = free_port()
    args = [sys.executable, str(SIM), "--model-path", "Qwen/Qwen3.6-27B", "--host", "127.0.0.1",
            "--port", str(port), "--attention-backend", "triton", "--enable-metrics"]
    if algorithm != "NONE":
        args += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", "z-lab/Qwen3.6-27B-DFlash",
                 "--speculative-dflash-block-size", "16"]
    if algorithm == "DDTREE":
        args += ["--speculative-ddtree-budget", str(budget)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM_")}
    full_env.update({"PYTHONPATH": str(fake_release(tmp)), "SGLANG_SIM_STARTUP_S": "0.5", **(env or {})})
    log = tmp / f"sim-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        from sgdeploy import serving

        deadline = time.monotonic() + 20
        while not serving.is_healthy(url, timeout=1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"simulator did not become healthy (exit {proc.poll()}): {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield Sim(proc, url, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
